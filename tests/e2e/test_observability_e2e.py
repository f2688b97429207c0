"""Observability of the real `ninfer serve` process: /metrics parsed with prometheus_client, the
JSONL request log of completed, streamed, rejected, overloaded, timed-out and cancelled requests,
and the stderr records (format, no control sequences, no prompts or keys).

One server, one lane and one pending slot, so that a long streamed request makes a second one
wait (and time out) and a third one overload.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import METRIC_FAMILIES as FAMILIES
from tests.e2e.conftest import TINY_AGENT

HOST_PHASES = ("engine_boundary", "program_submit", "program_post", "engine_commit_output",
               "engine_maintenance")  # fmt: skip

KEY = "e2e-observability-key-9931"
SECRET = "Quokka lanterns 5123 are a private prompt"
RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (TRACE|DEBUG|INFO|WARNING|ERROR|CRITICAL) \S"
)


@pytest.fixture(scope="module")
def server(server_factory, tmp_path_factory):
    log = tmp_path_factory.mktemp("obs") / "requests.jsonl"
    s = server_factory(
        "--max-context", "2048", "--max-concurrency", "1", "--max-pending-requests", "1",
        "--pending-timeout-ms", "1500", "--log-stats-interval-ms", "300",
        "--request-log-jsonl", str(log), api_key=KEY,
    )  # fmt: skip
    s.request_log = log
    return s


def metrics(server) -> dict[str, Any]:
    r = httpx.get(server.base_url + "/metrics", headers=server.headers)
    assert r.status_code == 200 and r.headers["content-type"].startswith(
        "text/plain; version=0.0.4"
    )
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def sample(fams: dict[str, Any], name: str, suffix: str = "", **labels: str) -> float:
    for s in fams[name].samples:
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(name)


def chat(server, content: str, **kw: Any) -> httpx.Response:
    body = {
        "model": "tiny-agent",
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        **kw,
    }
    return httpx.post(
        server.base_url + "/v1/chat/completions", json=body, headers=server.headers, timeout=60
    )


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def wait_for(what: str, pred, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_observability_end_to_end(server):
    # -- /metrics: every family, authenticated, counters from zero -----------------------------
    assert httpx.get(server.base_url + "/metrics").status_code == 401
    m0 = metrics(server)
    for kind, names in FAMILIES.items():
        assert {n: m0[n].type for n in names if n in m0} == dict.fromkeys(names, kind)
    assert sample(m0, "ninfer_engine_ready") == 1
    assert sample(m0, "ninfer_generation_tokens", "_total") == 0

    # -- a known request moves the token counters by exactly its tokens ------------------------
    t0 = time.monotonic()
    known = chat(server, SECRET, max_tokens=6, ignore_eos=True)
    wall = time.monotonic() - t0
    assert known.status_code == 200, known.text
    usage = known.json()["usage"]
    m1 = metrics(server)
    # the engine worker measured every host phase; the segments are exclusive, so host work plus
    # device wait fit inside the request's wall time
    host = {p: sample(m1, "ninfer_host_work_seconds", "_total", phase=p) for p in HOST_PHASES}
    assert all(v > 0 for v in host.values()), host
    assert sum(host.values()) + sample(m1, "ninfer_device_wait_seconds", "_total") < wall + 0.5
    assert sample(m1, "ninfer_prompt_tokens", "_total") == usage["prompt_tokens"]
    assert (
        sample(m1, "ninfer_prefill_tokens", "_total")
        + sample(m1, "ninfer_prompt_tokens_cached", "_total")
        == usage["prompt_tokens"]
    )
    assert sample(m1, "ninfer_generation_tokens", "_total") == 6
    assert sample(m1, "ninfer_decode_tokens", "_total") == 5
    assert sample(m1, "ninfer_requests", "_total", outcome="length") == 1

    # -- streamed; rejected; then a long stream that holds the lane --------------------------------
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", headers=server.headers, timeout=60,
                      json={"model": "tiny-agent", "messages": [{"role": "user", "content": "Hi!"}],
                            "max_tokens": 5, "ignore_eos": True, "stream": True,
                            "stream_options": {"include_usage": True}}) as s:  # fmt: skip
        assert "data: [DONE]" in s.read().decode()
    too_long = chat(server, SECRET + " " + "word " * 2100, max_tokens=4)
    assert (
        too_long.status_code == 400
        and too_long.json()["error"]["code"] == "context_length_exceeded"
    )

    holder = httpx.stream("POST", server.base_url + "/v1/chat/completions", headers=server.headers, timeout=60,
                          json={"model": "tiny-agent", "messages": [{"role": "user", "content": "Hello"}],
                                "max_tokens": 2000, "ignore_eos": True, "stream": True})  # fmt: skip
    resp = holder.__enter__()
    lines = resp.iter_lines()
    assert next(line for line in lines if line.startswith("data: "))  # the lane is busy now
    waited: dict[str, httpx.Response] = {}
    waiter = threading.Thread(
        target=lambda: waited.setdefault("r", chat(server, "Hi!", max_tokens=3))
    )
    waiter.start()
    wait_for("a waiting request", lambda: sample(metrics(server), "ninfer_requests_waiting") == 1)
    overloaded = chat(server, "Hi!", max_tokens=3)
    assert (
        overloaded.status_code == 429 and overloaded.json()["error"]["code"] == "server_overloaded"
    )
    waiter.join(30)
    assert (
        waited["r"].status_code == 503
        and waited["r"].json()["error"]["code"] == "request_queue_timeout"
    )
    holder.__exit__(
        None, None, None
    )  # the client goes away mid-stream: the generation is cancelled

    log_path: Path = server.request_log
    wait_for(
        "the cancellation record",
        lambda: any(r["event"] == "request_error" for r in read_log(log_path)),
    )
    wait_for("an idle engine", lambda: sample(metrics(server), "ninfer_requests_running") == 0)

    # -- the JSONL log ---------------------------------------------------------------------------
    records = read_log(log_path)
    assert records[0]["event"] == "server_start"
    assert records[0]["argv"][records[0]["argv"].index("--api-key") + 1] == "<redacted>"
    assert {r["server_instance_id"] for r in records} == {records[0]["server_instance_id"]}
    assert all(r["schema"] == "ninfer_serve_request_log" and r["schema_version"] == 24
               and isinstance(r["timestamp_unix_ms"], int) for r in records)  # fmt: skip
    seq: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        if "request_id" in r:
            seq.setdefault(r["request_id"], []).append(r)
    events = [[r["event"] for r in seq[i]] for i in sorted(seq)]
    assert events == [
        ["request_start", "request_done"],  # known
        ["request_start", "request_done"],  # streamed
        ["request_rejected"],  # context too long
        ["request_start", "request_error"],  # the holder, cancelled (its terminal comes last)
        ["request_start", "request_done"],  # timed out waiting
        ["request_rejected"],  # overloaded
    ]
    ids = sorted(seq)
    known_done, streamed_done = seq[ids[0]][1], seq[ids[1]][1]
    assert (
        known_done["result"]["generated_token_ids"]
        and len(known_done["result"]["generated_token_ids"]) == 6
    )
    assert (
        streamed_done["usage"]["completion_tokens"] == 5
        and streamed_done["finish_reason"] == "length"
    )
    assert streamed_done["timings_seconds"]["ttft"] > 0
    et = known_done["engine_timing"]  # host exposure from admission to finish, device wait apart
    exposed = et["host_exposed_seconds"]
    assert set(exposed) == {*HOST_PHASES, "total"} and exposed["program_post"] > 0
    assert exposed["total"] == pytest.approx(sum(exposed[p] for p in HOST_PHASES))
    assert et["device_wait_exposed_seconds"] > 0
    assert 0 < exposed["total"] + et["device_wait_exposed_seconds"] <= et["engine_total_seconds"]
    assert et["decode"]["device_wait_exposed_seconds"] > 0  # five decode rounds
    assert et["decode"]["rounds"] == 5 and et["units"]["prefill"] >= 1
    first = known_done["first_output_timing"]
    assert first["prefill"]["tokens"] == known_done["computed_prefill_tokens"]
    assert first["engine"]["decode"]["rounds"] == 0
    assert first["engine_elapsed_seconds"] <= et["engine_total_seconds"]
    gpu = known_done["work"]["gpu_seconds"]  # its prefill step's CUDA event interval
    on_cuda = records[0]["engine"]["device"].startswith("cuda")
    assert (0 < gpu < known_done["timings_seconds"]["total"]) if on_cuda else gpu is None
    assert seq[ids[0]][0]["responses_semantic_change"] is None  # a chat request
    assert known_done["thinking_budget"]["budget"] is None
    assert seq[ids[2]][0]["error"]["code"] == "context_length_exceeded"
    assert seq[ids[3]][1]["kind"] == "cancelled" and seq[ids[3]][1]["first_token_seen"]
    assert (
        seq[ids[4]][1]["error"]["code"] == "request_queue_timeout"
        and seq[ids[4]][1]["outcome"] == "timeout"
    )
    assert seq[ids[4]][1]["first_output_timing"] is None  # never produced output
    assert seq[ids[5]][0]["error"]["status"] == 429 and seq[ids[5]][0]["outcome"] == "overloaded"
    busy = [r for r in records if r["event"] == "throughput" and r["tokens"]["decode_tokens"] > 0]
    assert busy
    for r in busy:  # the worker's host phases are the aggregation authority
        hw = r["host_work"]
        elapsed = hw["elapsed_seconds"]
        assert set(elapsed) == {*HOST_PHASES, "total"} and elapsed["total"] > 0
        assert elapsed["total"] == pytest.approx(sum(elapsed[p] for p in HOST_PHASES))
        assert elapsed["total"] + hw["device_wait_seconds"] <= r["interval_seconds"] * 1.05 + 0.01
        classes = hw["work_class_seconds"]
        assert classes["decode"]["device_wait"] > 0
        assert sum(c["host"] for c in classes.values()) == pytest.approx(elapsed["total"])
        assert hw["detail_invocations"]["stats_publication"] > 0
    text = log_path.read_text(encoding="utf-8")
    assert SECRET not in text and KEY not in text

    # -- metrics after N requests: histogram counts equal the settled requests -----------------
    m2 = metrics(server)
    outcomes = {o: sample(m2, "ninfer_requests", "_total", outcome=o) for o in
                ("stop", "length", "cancelled", "timeout", "rejected", "overloaded", "error")}  # fmt: skip
    assert outcomes == {
        "stop": 0,
        "length": 2,
        "cancelled": 1,
        "timeout": 1,
        "rejected": 1,
        "overloaded": 1,
        "error": 0,
    }
    settled = 4  # two completed, one cancelled, one timed out
    assert sample(m2, "ninfer_request_duration_seconds", "_count") == settled
    assert sample(m2, "ninfer_request_queue_seconds", "_count") == settled
    assert (
        sample(m2, "ninfer_time_to_first_token_seconds", "_count") == 3
    )  # the timed-out one had none

    # -- stderr ------------------------------------------------------------------------------------
    err = server.stderr()
    assert "\x1b" not in err and SECRET not in err and KEY not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert all(RECORD.match(line) for line in lines), [
        line for line in lines if not RECORD.match(line)
    ]
    assert any(" INFO ready: accepting requests" in line for line in lines)
    done = [
        line
        for line in lines
        if re.search(r"request \d+ chat length: .*cache \d+ \(\d+%, [a-z ]+\)", line)
    ]
    assert len(done) == 2
    assert any(
        " INFO throughput " in line and "tok/s" in line and " host " in line for line in lines
    )
    assert any("rejected: 429 server_overloaded" in line for line in lines)
    assert any(
        re.search(r"request \d+ chat cancelled by the client after .*first token seen", line)
        for line in lines
    )


def test_an_unopenable_request_log_aborts_startup_with_one_line(tmp_path):
    proc = subprocess.run(  # a directory cannot be opened for appending
        [sys.executable, "-m", "ninfer.cli", "serve", str(TINY_AGENT), "--port", "0", "--request-log-jsonl", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=TINY_AGENT.parents[2], check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and "--request-log-jsonl" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
