"""stderr operational records (format, escaping, levels) and the throughput report's intervals."""

from __future__ import annotations

import io
import json
import logging
import re

import pytest

from ninfer.api.observability import oplog
from ninfer.api.observability.request_log import RequestLog
from ninfer.api.observability.throughput import ThroughputReporter, interval
from ninfer.runtime.engine import EngineStats

RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} [A-Z]+ \S")


@pytest.fixture
def stderr():
    stream = io.StringIO()
    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).level, logging.getLogger(n).propagate)
             for n in oplog.LOGGERS}  # fmt: skip
    yield stream
    for name, (handlers, level, propagate) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:], logger.level, logger.propagate = handlers, level, propagate


def test_records_are_single_lines_without_control_sequences(stderr):
    oplog.configure_stderr("trace", stderr)
    log = logging.getLogger("ninfer.test")
    log.info("name \x1b[31mred\x1b[0m\nsecond line\r")
    log.log(oplog.TRACE, "fine detail")
    lines = stderr.getvalue().splitlines()
    assert len(lines) == 2 and all(RECORD.match(line) for line in lines)
    assert (
        "\x1b" not in stderr.getvalue() and "\\x1b[31mred\\x1b[0m\\x0asecond line\\x0d" in lines[0]
    )
    assert lines[0].split(" ")[2] == "INFO" and lines[1].split(" ")[2] == "TRACE"


def test_levels_filter_and_off_silences(stderr):
    oplog.configure_stderr("warning", stderr)
    logging.getLogger("ninfer.x").info("hidden")
    logging.getLogger("uvicorn.error").warning("shown")
    assert "hidden" not in stderr.getvalue() and "WARNING shown" in stderr.getvalue()
    oplog.configure_stderr("off", stderr)
    logging.getLogger("ninfer.x").critical("silenced")
    assert "silenced" not in stderr.getvalue()


def test_readable_values():
    assert oplog.count(1234567) == "1,234,567"
    assert [oplog.rate(x) for x in (0.123, 12.34, 1234.5)] == ["0.12", "12.3", "1,234"]
    assert [oplog.seconds(x) for x in (0.0123, 1.5, 1234.0, None)] == [
        "12 ms",
        "1.50 s",
        "1,234 s",
        "-",
    ]
    assert oplog.per_second(10, 0.0) == 0.0 and oplog.per_second(0, 1.0) == 0.0


def stats(**kw) -> EngineStats:
    return EngineStats(ready=True, max_concurrency=2, max_context=64, **kw)


def test_interval_deltas_and_idle():
    a = stats(prefill_tokens_total=100, decode_tokens_total=10, generation_tokens_total=12, steps_total=5,
              decode_rounds_total=4, decode_rows_total=6, device_wait_seconds_total=1.0)  # fmt: skip
    b = stats(prefill_tokens_total=140, decode_tokens_total=30, generation_tokens_total=33, steps_total=15,
              decode_rounds_total=12, decode_rows_total=22, device_wait_seconds_total=1.5,
              running=2, prefilling=1, decode_ready=1, waiting=3)  # fmt: skip
    iv = interval(a, b, 2.0)
    assert not iv.idle
    f = iv.fields()
    assert f["tokens"]["prefill_tokens"] == 40 and f["tokens"]["decode_tokens"] == 20
    assert f["decode"] == {"rounds": 8, "row_rounds": 16, "average_size": 2.0}
    assert f["scheduler"]["waiting"] == 3 and f["host_work"][
        "device_wait_seconds"
    ] == pytest.approx(0.5)
    msg = iv.message()
    assert msg.startswith(
        "throughput 2.00 s: prefill 40 tok (20.0 tok/s), decode 20 tok (10.0 tok/s)"
    )
    assert "running 2 (prefill 1, decode 1)" in msg and "waiting 3" in msg and "batch 2.00" in msg
    assert "paused" not in msg  # zero states are left out
    quiet = stats(prefill_tokens_total=140, steps_total=15)
    assert interval(quiet, quiet, 5.0).idle
    stuck = stats(prefill_tokens_total=140, steps_total=15, waiting=1)  # no progress, but not idle
    assert not interval(quiet, stuck, 5.0).idle


def test_reporter_omits_idle_intervals(tmp_path, stderr):
    oplog.configure_stderr("info", stderr)
    snaps = iter(
        [stats(), stats(), stats(decode_tokens_total=5, generation_tokens_total=5, steps_total=5)]
    )
    log = RequestLog.open(tmp_path / "log.jsonl")
    times = iter([0.0, 5.0, 10.0])
    reporter = ThroughputReporter(lambda: next(snaps), 5.0, log, clock=lambda: next(times))
    assert reporter.tick() is None  # idle: nothing written
    assert reporter.tick() is not None
    log.close()
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records] == ["throughput"]
    assert records[0]["tokens"]["decode_tokens"] == 5 and records[0]["interval_seconds"] == 5.0
    assert stderr.getvalue().count(" INFO throughput 5.00 s: decode 5 tok (1.00 tok/s)") == 1


def test_interval_host_work_is_the_engines_phases_with_nulls_for_empty_denominators():
    phases = dict.fromkeys(("engine_boundary", "program_submit", "program_post",
                            "engine_commit_output", "engine_maintenance"), 0.0)  # fmt: skip
    a = stats(host_work_seconds=phases, stats_publication_seconds=0.1,
              stats_publication_invocations=10, context_transfer_bytes={("main_kv", "device_to_host"): 64})  # fmt: skip
    b = stats(host_work_seconds={**phases, "program_submit": 0.25, "engine_maintenance": 0.5},
              work_class_seconds={("decode", "host"): 0.75, ("decode", "device_wait"): 1.0},
              stats_publication_seconds=0.3, stats_publication_invocations=14,
              device_wait_seconds_total=1.0, context_transfer_bytes={("main_kv", "device_to_host"): 192},
              host_context_used_bytes=128, host_context_capacity_bytes=1024)  # fmt: skip
    iv = interval(a, b, 2.0)
    assert not iv.idle  # context bytes moved even without tokens
    hw = iv.fields()["host_work"]
    assert hw["elapsed_seconds"]["total"] == pytest.approx(0.75)
    assert hw["work_class_seconds"]["decode"] == {"host": 0.75, "device_wait": 1.0}
    assert hw["detail_subset_seconds"]["stats_publication"] == pytest.approx(0.2)
    assert hw["detail_invocations"]["stats_publication"] == 4
    norm = hw["normalized_seconds"]
    assert norm["decode_host_per_round"] is None and norm["decode_host_per_row_round"] is None
    assert norm["stats_publication_per_invocation"] == pytest.approx(0.05)
    cc = iv.fields()["context_cache"]
    assert cc["transfer_bytes"] == {"main_kv.device_to_host": 128}
    assert cc["occupancy"]["used_bytes"] == 128 and cc["occupancy"]["capacity_bytes"] == 1024
    assert " host 750 ms (38%)" in iv.message()


def test_interval_context_cache_counts_selections_state_images_and_evictions():
    sel = {"tokens": 32, "path": "checkpoint", "state_checkpoint": True}
    a = stats(cache_selections_total=3, cache_selection_hits_total=1, cache_selected_tokens_total=16,
              state_captures_total=2, state_restores_total=1, cache_evicted_pages_total=4)  # fmt: skip
    b = stats(cache_selections_total=5, cache_selection_hits_total=2, cache_selected_tokens_total=48,
              state_captures_total=5, state_restores_total=2, cache_evicted_pages_total=10,
              last_cache_selection=sel)  # fmt: skip
    iv = interval(a, b, 1.0)
    assert not iv.idle  # cache work even without tokens
    cc = iv.fields()["context_cache"]
    assert cc["selections"] == {"count": 2, "hits": 1, "reused_tokens": 32}
    assert cc["captures"] == 3 and cc["state_image_operations"] == {"captures": 3, "restores": 1}
    assert cc["pressure_spills"] == {"evicted_pages": 6} and cc["tail_page_cow"] == 0
    assert cc["last_selection"] == sel and cc["transfer_bytes"] == {}


def test_intervals_end_where_a_busy_engine_last_published():
    """A busy engine's counters stand as of their snapshot's build time, so an interval ends
    there (not at the tick): a long segment of worker time (a kernel compile) that straddles a
    tick then counts in an interval that contains it. An idle engine's intervals end at the
    tick; a busy engine with nothing new published is reported at a later tick."""
    phases = dict.fromkeys(("engine_boundary", "program_submit", "program_post",
                            "engine_commit_output", "engine_maintenance"), 0.0)  # fmt: skip
    idle0 = stats(published_s=0.0, idle=True, host_work_seconds=phases)
    launch = stats(published_s=2.0, running=1, host_work_seconds=phases)  # a compile starts
    done = stats(published_s=9.5, running=1, decode_tokens_total=3,
                 host_work_seconds={**phases, "program_submit": 7.5})  # fmt: skip
    idle1 = stats(published_s=11.0, idle=True, decode_tokens_total=9,
                  host_work_seconds={**phases, "program_submit": 8.0})  # fmt: skip
    snaps = iter([idle0, launch, done, done, idle1])
    times = iter([0.0, 5.0, 10.0, 12.0, 15.0])
    reporter = ThroughputReporter(lambda: next(snaps), 5.0, clock=lambda: next(times))
    first = reporter.tick()  # at 5.0, mid-compile: up to the launch snapshot
    assert first is not None and first.seconds == 2.0
    second = reporter.tick()  # at 10.0: 2.0 .. 9.5, the 7.5 s compile inside
    assert second is not None and second.seconds == 7.5
    assert second.fields()["host_work"]["elapsed_seconds"]["total"] == pytest.approx(7.5)
    assert reporter.tick() is None  # at 12.0: nothing new published since 9.5
    third = reporter.tick()  # at 15.0, idle since 11.0: 9.5 .. 15.0
    assert third is not None and third.seconds == 5.5 and third.deltas["decode_tokens"] == 6


@pytest.mark.parametrize("level", ["debug", "info"])
def test_debug_level_shows_the_startup_resource_plan(tiny_agent, stderr, level):
    """--log-level debug adds the resource planning to the startup records: the memory ledger
    against the budget, the KV pool as sized and the CUDA Graph buckets; info does not."""
    from ninfer.artifact import Artifact
    from ninfer.commands import serve
    from tests.api.live_app import serve_config

    oplog.configure_stderr(level, stderr)
    state = serve.build_state(
        serve_config(artifact=str(tiny_agent), max_context=256), Artifact(tiny_agent)
    )
    state.engine.close()
    debug = [x for x in stderr.getvalue().splitlines() if " DEBUG " in x]
    if level == "info":
        assert not debug
        return
    text = "\n".join(debug)
    assert "memory ledger (budget" in text and "KV pool: " in text and "CUDA Graph buckets" in text
    for item in ("weights", "workspace", "kv_cache"):
        assert re.search(rf"DEBUG +{item} ", text), item
