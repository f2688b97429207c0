"""--request-log-jsonl: the file contract (append, flushed lines, common fields, redaction, refusals)
and the event sequence of real requests on the in-process server (tiny trained agent, CPU)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from ninfer.api.observability import metrics
from ninfer.api.observability.request_log import (
    HOST_PHASES,
    SCHEMA,
    SCHEMA_VERSION,
    RequestLog,
    RequestLogSink,
    redact_argv,
)
from ninfer.api.observability.wiring import Observability
from ninfer.api.server.app import create_app
from ninfer.api.service.generation import GenerationRequest
from ninfer.api.service.observe import Observer
from ninfer.api.service.prompt_prep import Prepared
from ninfer.api.wire.errors import ApiError, server_overloaded
from ninfer.artifact import Artifact
from ninfer.commands import serve
from ninfer.errors import ConfigError
from ninfer.runtime.request import (
    FIRST_OUTPUT_PARTS,
    FinishEvent,
    QueueTimeout,
    Request,
    Timings,
    Usage,
)
from tests.api.live_app import serve_config

KEY = "jsonl-test-secret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
SECRET_PROMPT = "Zanzibar marmalade 4471 is my secret prompt"
TERMINALS = ("request_done", "request_error")


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def by_request(records: list[dict[str, Any]]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for r in records:
        if "request_id" in r:
            out.setdefault(r["request_id"], []).append(r["event"])
    return out


# -- the file ----------------------------------------------------------------------------------


def test_argv_redacts_the_api_key():
    argv = ["ninfer", "serve", "m.ninfer", "--api-key", "s3cret", "--port", "1", "--api-key=other"]
    assert redact_argv(argv) == [
        "ninfer",
        "serve",
        "m.ninfer",
        "--api-key",
        "<redacted>",
        "--port",
        "1",
        "--api-key=<redacted>",
    ]


def test_open_refuses_bad_paths_with_one_line(tmp_path, tiny_agent):
    cases = [tmp_path / "missing" / "log.jsonl", tmp_path, tiny_agent]
    for path in cases:
        with pytest.raises(ConfigError) as e:
            RequestLog.open(path, tiny_agent)
        assert "--request-log-jsonl" in str(e.value) and "\n" not in str(e.value)


def test_open_appends_and_every_line_carries_the_common_fields(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"earlier": "campaign"}\n', encoding="utf-8")
    first = RequestLog.open(path)
    first.write("throughput", {"x": 0.1 + 0.2})
    # flushed per event: readable before close
    assert json.loads(path.read_text().splitlines()[1])["x"] == 0.1 + 0.2  # full precision
    first.close()
    second = RequestLog.open(path)
    second.write("throughput", {})
    second.close()
    lines = read_log(path)
    assert lines[0] == {"earlier": "campaign"}
    for rec in lines[1:]:
        assert rec["schema"] == SCHEMA and rec["schema_version"] == SCHEMA_VERSION
        assert rec["event"] == "throughput" and isinstance(rec["timestamp_unix_ms"], int)
        assert abs(rec["timestamp_unix_ms"] / 1000 - time.time()) < 60
    assert lines[1]["server_instance_id"] != lines[2]["server_instance_id"]


# -- the request lifecycle contract ------------------------------------------------------------


def test_exactly_one_terminal_whatever_happens(tmp_path):
    log = RequestLog.open(tmp_path / "log.jsonl")
    observer = Observer([RequestLogSink(log)])
    req = GenerationRequest(
        messages=[{"role": "user", "content": SECRET_PROMPT}], protocol="responses"
    )
    prepared = Prepared([1, 2, 3], SECRET_PROMPT, False, ())
    engine_req = Request((1, 2, 3), arrival_s=time.monotonic())

    rejected = observer.track(req, "req_a")  # preparation failed: no start, one rejection
    rejected.raised(ApiError(400, "too long", code="context_length_exceeded", param="messages"))
    rejected.raised(GeneratorExit())

    failed = observer.track(req, "req_b")  # an exception before any engine outcome
    failed.started(prepared, engine_req)
    failed.first_token()
    failed.raised(RuntimeError("detokenizer broke"))
    failed.raised(GeneratorExit())

    timed_out = observer.track(req, "req_c")  # the engine's outcome was a queue timeout
    timed_out.started(prepared, engine_req)
    timed_out.engine_finished(
        FinishEvent(
            "error", Usage(3, 0), Timings(None, None, None, None, 0.5), (), QueueTimeout("late")
        )
    )
    timed_out.raised(ApiError(503, "waited too long", code="request_queue_timeout"))
    timed_out.raised(ValueError("rendering failed later"))  # a response failure, not a terminal

    left = observer.track(req, "req_d")  # the engine finished, the client left meanwhile
    left.started(prepared, engine_req)
    left.engine_finished(FinishEvent("stop", Usage(3, 2), Timings(0.1, 0.2, 0.1, 0.1, 0.3), (7, 8)))
    left.raised(GeneratorExit())

    gone = observer.track(req, "req_e")  # the client left while the request was being prepared
    gone.raised(asyncio.CancelledError())
    log.close()

    records = read_log(tmp_path / "log.jsonl")
    assert by_request(records) == {
        1: ["request_rejected"],
        2: ["request_start", "request_error"],
        3: ["request_start", "request_done"],
        4: ["request_start", "request_done"],
        5: ["request_rejected"],
    }
    rej, _, err, _, done, _, left_done, gone_rec = records
    assert gone_rec["outcome"] == "cancelled"  # not an invented internal error
    assert (gone_rec["error"]["status"], gone_rec["error"]["code"]) == (499, "client_closed")
    assert left_done["finish_reason"] == "stop" and left_done["outcome"] == "stop"
    assert left_done["error"] is None
    assert rej["error"] == {"status": 400, "type": "invalid_request_error", "code": "context_length_exceeded",
                            "param": "messages", "message": "too long"}  # fmt: skip
    assert (
        rej["phase"] == "prepare"
        and rej["protocol"] == "responses"
        and rej["http_request_id"] == "req_a"
    )
    assert err["kind"] == "error" and "RuntimeError" in err["message"] and err["first_token_seen"]
    assert done["finish_reason"] == "error" and done["outcome"] == "timeout"
    assert done["error"]["code"] == "request_queue_timeout"
    assert SECRET_PROMPT not in (tmp_path / "log.jsonl").read_text()


def test_anthropic_records_carry_what_the_client_received(tmp_path):
    """Anthropic clients get 529 overloaded_error and 504 timeout_error for what the OpenAI
    endpoints answer 429 and 503: the log records the status that was sent."""
    log = RequestLog.open(tmp_path / "log.jsonl")
    observer = Observer([RequestLogSink(log)])
    req = GenerationRequest(messages=[{"role": "user", "content": "x"}], protocol="anthropic")
    busy = observer.track(req, "req_a")
    busy.raised(server_overloaded())
    late = observer.track(req, "req_b")
    late.started(Prepared([1, 2, 3], "x", False, ()), Request((1, 2, 3)))
    late.engine_finished(
        FinishEvent("error", Usage(3, 0), Timings(None, None, None, None, 1.0), (), QueueTimeout())
    )
    late.raised(ApiError(503, "waited too long", code="request_queue_timeout"))
    bad = observer.track(req, "req_c")
    bad.raised(ApiError(400, "no", code="invalid_value", param="top_k"))
    log.close()
    rejected, _, done, invalid = read_log(tmp_path / "log.jsonl")
    assert rejected["outcome"] == "overloaded" and done["outcome"] == "timeout"
    assert (rejected["error"]["status"], rejected["error"]["type"]) == (529, "overloaded_error")
    assert (done["error"]["status"], done["error"]["type"]) == (504, "timeout_error")
    assert done["error"]["code"] == "request_queue_timeout"
    assert (invalid["error"]["status"], invalid["error"]["param"]) == (400, "top_k")


# -- real requests -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tiny_agent, tmp_path_factory) -> Iterator[tuple[TestClient, Path]]:
    path = tmp_path_factory.mktemp("jsonl") / "requests.jsonl"
    config = serve_config(artifact=str(tiny_agent), max_context=512, api_key=KEY, log_stats_interval_ms=0,
                         request_log_jsonl=str(path))  # fmt: skip
    artifact = Artifact(tiny_agent)
    log = RequestLog.open(path, artifact.path)
    state = serve.build_state(config, artifact)
    obs = Observability.start(
        state, artifact, request_log=log, argv=["ninfer", "serve", "--api-key", KEY]
    )
    app = create_app(state, extra_handlers=metrics.route_handlers(state))
    try:
        with TestClient(app=app) as client:
            yield client, path
    finally:
        obs.close()
        state.engine.close()


def served_on_cuda(path: Path) -> bool:
    return read_log(path)[0]["engine"]["device"].startswith("cuda")


def test_server_start_comes_first_and_hides_the_key(served):
    _, path = served
    first = read_log(path)[0]
    assert first["event"] == "server_start"
    assert first["artifact"]["architecture"] == "qwen3" and first["public_model_id"] == "tiny-agent"
    assert first["engine"]["max_context"] == 512 and first["engine"]["kv_pages"] > 0
    assert first["argv"] == ["ninfer", "serve", "--api-key", "<redacted>"]
    sampler = first["sampler"]  # per thinking mode: qwen3 has no preset, so both take the
    assert sampler["thinking"] == sampler["non_thinking"]  # artifact's generation defaults
    assert set(sampler["thinking"]) >= {"temperature", "top_p", "top_k", "min_p", "seed"}
    mem = first["memory"]  # the plan's sizing ledger and the pools as sized at startup
    assert mem["vision_workspace"] is None  # the vision encode shares the workspace
    items = {e["item"]: e["bytes"] for e in mem["ledger"]}
    assert {"weights", "workspace", "kv_cache", "state_slots"} <= set(items)
    assert mem["workspace"]["capacity_bytes"] == items["workspace"] > 0
    assert mem["kv"]["pages"] == first["engine"]["kv_pages"] and mem["kv"]["bytes"] > 0
    assert mem["kv"]["capacity_tokens"] == first["engine"]["kv_capacity_tokens"]
    assert bool(mem["cuda_graphs"]["buckets"]) == served_on_cuda(path)  # captured on CUDA only
    # the engine's formats as resolved, not the flags left at their defaults
    assert first["engine"]["kv_dtype"] == mem["kv"]["dtype"] is not None
    assert first["engine"]["cuda_graph"] == served_on_cuda(path)


def test_requests_log_their_sequence_and_fields(served, tiny_agent_prompts):
    client, path = served
    n0 = len(read_log(path))
    chat = {"model": "tiny-agent", "temperature": 0}
    ok = client.post("/v1/chat/completions", headers=AUTH, json={
        **chat, "messages": [{"role": "user", "content": SECRET_PROMPT}], "max_tokens": 5, "ignore_eos": True})  # fmt: skip
    assert ok.status_code == 200
    with client.stream("POST", "/v1/chat/completions", headers=AUTH, json={
            **chat, "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 4, "stream": True}) as s:  # fmt: skip
        assert s.status_code == 200 and "[DONE]" in "".join(s.iter_text())
    too_long = client.post("/v1/chat/completions", headers=AUTH, json={
        **chat, "messages": [{"role": "user", "content": SECRET_PROMPT * 80}], "max_tokens": 5})  # fmt: skip
    assert too_long.status_code == 400
    invalid = client.post("/v1/chat/completions", headers=AUTH, json={**chat, "messages": "nope"})
    assert invalid.status_code == 400  # validation before preparation: no record at all
    tool = next(p for p in tiny_agent_prompts if p["name"] == "weather_paris")
    called = client.post("/v1/chat/completions", headers=AUTH, json={
        **chat, "messages": tool["messages"], "tools": tool["tools"], "max_tokens": 200,
        "chat_template_kwargs": {"enable_thinking": tool["enable_thinking"]}})  # fmt: skip
    assert (
        called.status_code == 200 and called.json()["choices"][0]["finish_reason"] == "tool_calls"
    )

    records = read_log(path)[n0:]
    seq = by_request(records)
    ids = sorted(seq)
    assert ids == list(range(ids[0], ids[0] + 4))  # monotonic, one id per measurement request
    assert [seq[i] for i in ids] == [
        ["request_start", "request_done"],
        ["request_start", "request_done"],
        ["request_rejected"],
        ["request_start", "request_done"],
    ]
    start, done = records[0], records[1]
    assert start["protocol"] == "chat" and start["prompt_tokens"] > 0
    starts = [r for r in records if r["event"] == "request_start"]
    assert [r["request_shape"]["stream"] for r in starts] == [False, True, False]
    # no seed in the request: the one the sampler was given is recorded (replayable)
    assert isinstance(start["sampling"]["seed"], int)
    assert start["sampling"]["temperature"] == 0.0 and start["output_budget"] == {
        "requested": 5,
        "effective": 5,
    }
    assert start["http_request_id"] == ok.headers["x-request-id"]
    usage = ok.json()["usage"]
    assert (
        done["usage"]["prompt_tokens"] == usage["prompt_tokens"]
        and done["usage"]["completion_tokens"] == 5
    )
    assert len(done["result"]["generated_token_ids"]) == 5
    assert done["prefix_reuse_path"] in ("root", "checkpoint")
    assert (
        done["prefix_cache_hit_tokens"] + done["computed_prefill_tokens"] == usage["prompt_tokens"]
    )
    t = done["timings_seconds"]
    assert set(t) == {"prepare", "queue", "ttft", "vision", "prefill", "decode", "total"}
    assert 0 < t["prepare"] <= t["ttft"] <= t["total"] and t["decode"] > 0
    et = done["engine_timing"]  # 5 tokens: the first from the prefill, then 4 decode rounds
    assert et["decode"]["rounds"] == 4 and et["units"]["replay"] == et["units"]["control"] == 0
    assert et["units"]["prefill"] >= 1
    first = done["first_output_timing"]  # frozen before the first output was published
    assert first["prefill"] == {
        "tokens": done["computed_prefill_tokens"],
        "units": et["units"]["prefill"],
    }
    assert first["replay"] == {"tokens": 0, "units": 0} and first["engine"]["decode"]["rounds"] == 0
    parts = sum(first[k] for k in FIRST_OUTPUT_PARTS)
    assert parts == pytest.approx(first["engine_elapsed_seconds"])
    assert 0 < first["engine_elapsed_seconds"] <= et["engine_total_seconds"]
    host = first["engine"]["host_exposed_seconds"]
    assert host["total"] == pytest.approx(sum(host[p] for p in HOST_PHASES))
    assert done["context_transfers"] == {}  # never paused
    gpu = done["work"]["gpu_seconds"]  # CUDA events around its prefill step; none on CPU
    assert (0 < gpu < t["total"]) if served_on_cuda(path) else gpu is None
    rejected = next(r for r in records if r["event"] == "request_rejected")
    assert (
        rejected["error"]["status"] == 400
        and rejected["error"]["code"] == "context_length_exceeded"
    )
    tool_done = [r for r in records if r["event"] == "request_done"][-1]
    parse = tool_done["result"]["tool_call_parse"]
    assert parse["marker_seen"] and parse["calls"] >= 1 and parse["fallback_reason"] == "none"
    assert (
        tool_done["finish_reason"] == "tool_calls"
        and tool_done["result"]["tool_calls"] == parse["calls"]
    )
    text = path.read_text(encoding="utf-8")
    assert SECRET_PROMPT not in text and KEY not in text
    assert tool["messages"][-1]["content"] not in text


def test_responses_semantic_change_flag_marks_a_changed_preserve_thinking(served):
    client, path = served
    n0 = len(read_log(path))
    base = {"model": "tiny-agent", "temperature": 0, "max_output_tokens": 2}
    parent = client.post("/v1/responses", headers=AUTH, json={**base, "input": "Hi!"})
    assert parent.status_code == 200, parent.text
    pid = parent.json()["id"]
    for extra in ({"preserve_thinking": True}, {"preserve_thinking": False}, {}):
        child = client.post("/v1/responses", headers=AUTH, json={
            **base, "input": "And then?", "previous_response_id": pid, **extra})  # fmt: skip
        assert child.status_code == 200, child.text
    starts = [r for r in read_log(path)[n0:] if r["event"] == "request_start"]
    flags = [r["responses_semantic_change"] for r in starts]
    # the parent resolved preserve_thinking to the server default (off): only an explicit True
    # changes how the chain's history renders; an equal value or an omitted one does not
    assert flags == [False, True, False, False]
    assert all(r["protocol"] == "responses" and r["media"]["items"] == 0 for r in starts)
    done = [r for r in read_log(path)[n0:] if r["event"] == "request_done"]
    assert all(r["thinking_budget"]["forced_close"] is False for r in done)


def test_output_budget_records_what_was_asked_and_what_runs(served):
    """max_tokens 0 runs no output; an Anthropic request without max_tokens asked for none
    (the server default is what runs), as Chat's omitted limit is logged."""
    client, path = served
    n0 = len(read_log(path))
    zero = client.post("/v1/chat/completions", headers=AUTH, json={
        "model": "tiny-agent", "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 0})  # fmt: skip
    assert zero.status_code == 200 and zero.json()["usage"]["completion_tokens"] == 0
    omitted = client.post("/v1/messages", headers=AUTH, json={
        "model": "m", "messages": [{"role": "user", "content": "Hi!"}], "temperature": 0})  # fmt: skip
    assert omitted.status_code == 200, omitted.text
    starts = [r for r in read_log(path)[n0:] if r["event"] == "request_start"]
    assert [r["output_budget"] for r in starts] == [
        {"requested": 0, "effective": 0},
        {"requested": None, "effective": starts[1]["output_budget"]["effective"]},
    ]
    assert starts[1]["output_budget"]["effective"] > 0
