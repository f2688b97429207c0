"""GET /metrics on the real in-process server (tiny trained agent, CPU): every family docs/serving.md lists,
counters that move by exactly a request's tokens, histogram counts, authentication, and
readability after the engine stopped."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from ninfer.api.observability import metrics
from ninfer.api.observability.metrics import Histogram
from ninfer.api.observability.wiring import Observability
from ninfer.api.responses.endpoints import envelope_size, prepare
from ninfer.api.responses.request import parse_create_request
from ninfer.api.responses.store import STORE_KEY, ResponseStore, json_size
from ninfer.api.server.app import create_app
from ninfer.api.server.state import ServerState
from ninfer.artifact import Artifact
from ninfer.commands import serve
from ninfer.runtime import host_work
from tests.api.conftest import METRIC_FAMILIES
from tests.api.live_app import serve_config

KEY = "metrics-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}

GAUGES = METRIC_FAMILIES["gauge"]
COUNTERS = METRIC_FAMILIES["counter"]  # as the parser names them (without _total)
HISTOGRAMS = METRIC_FAMILIES["histogram"]


@dataclass
class Scrape:
    families: dict[str, Any]

    def value(self, name: str, **labels: str) -> float:
        fam = self.families[name]
        suffix = {"counter": "_total"}.get(fam.type, "")
        for s in fam.samples:
            if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
        raise KeyError((name, labels))

    def count(self, histogram: str) -> float:
        return next(
            s.value for s in self.families[histogram].samples if s.name == histogram + "_count"
        )


def scrape(client: TestClient) -> Scrape:
    r = client.get("/metrics", headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return Scrape({f.name: f for f in text_string_to_metric_families(r.text)})


@pytest.fixture(scope="module")
def server(tiny_agent) -> Iterator[tuple[TestClient, ServerState, Scrape]]:
    """(client, state, the first scrape, taken before any request)."""
    config = serve_config(
        artifact=str(tiny_agent), max_context=512, api_key=KEY, log_stats_interval_ms=0
    )
    artifact = Artifact(tiny_agent)
    state = serve.build_state(config, artifact)
    obs = Observability.start(state, artifact)
    app = create_app(state, extra_handlers=metrics.route_handlers(state))
    try:
        with TestClient(app=app) as client:
            yield client, state, scrape(client)
    finally:
        obs.close()
        state.engine.close()


def chat(client: TestClient, **kw: Any) -> Any:
    body = {
        "model": "tiny-agent",
        "messages": [{"role": "user", "content": "Hi!"}],
        "temperature": 0,
        **kw,
    }
    return client.post("/v1/chat/completions", json=body, headers=AUTH)


def test_every_family_is_present_and_counters_start_after_warmup(server):
    _, state, m = server
    types = {name: fam.type for name, fam in m.families.items()}
    assert {n: types.get(n) for n in GAUGES} == dict.fromkeys(GAUGES, "gauge")
    assert {n: types.get(n) for n in COUNTERS} == dict.fromkeys(COUNTERS, "counter")
    assert {n: types.get(n) for n in HISTOGRAMS} == dict.fromkeys(HISTOGRAMS, "histogram")
    assert m.value("ninfer_engine_ready") == 1
    assert m.value("ninfer_max_context_tokens") == 512
    assert m.value("ninfer_model_info", model="tiny-agent", architecture="qwen3", device="cpu") == 1
    kv = state.extra["memory"]["kv"]["dtype"]  # the label is the resolved KV dtype (server_start's)
    assert m.value("ninfer_model_info", kv_dtype=kv) == 1 and kv == "f32"
    assert (
        m.value("ninfer_device_kv_capacity_pages") == state.engine.snapshot().kv_pages_capacity > 0
    )
    # the warm-up generated tokens inside the engine, but metrics count from after it
    assert state.engine.snapshot().generation_tokens_total > 0
    for name in COUNTERS:
        assert all(s.value == 0 for s in m.families[name].samples), name
    for name in HISTOGRAMS:
        assert m.count(name) == 0
    assert {s.labels["phase"] for s in m.families["ninfer_host_work_seconds"].samples} == set(
        metrics.HOST_WORK_PHASES
    )
    transfers = {
        (s.labels["resource"], s.labels["direction"])
        for s in m.families["ninfer_context_transfer_bytes"].samples
    }
    assert transfers == {
        (r, d) for r in metrics.TRANSFER_RESOURCES for d in metrics.TRANSFER_DIRECTIONS
    }


def test_counters_move_by_exactly_the_tokens_of_a_request(server):
    client, _, _ = server
    before = scrape(client)
    r = chat(client, max_tokens=7, ignore_eos=True)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    after = scrape(client)
    deadline = time.monotonic() + 5  # the engine publishes its counters after its next step
    while after.value("ninfer_generation_tokens") - before.value("ninfer_generation_tokens") < 7:
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
        after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert usage["completion_tokens"] == 7
    assert delta("ninfer_prompt_tokens") == usage["prompt_tokens"]
    assert delta("ninfer_prompt_tokens_cached") == cached
    assert delta("ninfer_prefill_tokens") == usage["prompt_tokens"] - cached
    assert delta("ninfer_generation_tokens") == 7
    assert delta("ninfer_decode_tokens") == 6  # the first token belongs to prefill
    assert delta("ninfer_replayed_tokens") == 0
    # the engine worker measures its host phases (exclusive of device wait) for real
    for phase in metrics.HOST_WORK_PHASES:
        assert delta("ninfer_host_work_seconds", phase=phase) > 0, phase
    assert delta("ninfer_device_wait_seconds") > 0
    assert delta("ninfer_requests", outcome="length") == 1
    assert sum(delta("ninfer_requests", outcome=o) for o in metrics.OUTCOMES) == 1
    for h in HISTOGRAMS:
        assert after.count(h) - before.count(h) == 1, h
    assert after.value("ninfer_requests_running") == 0


def test_histogram_counts_equal_the_number_of_settled_requests(server):
    client, _, _ = server
    before = scrape(client)
    for n in (1, 2, 3):
        assert chat(client, max_tokens=n, ignore_eos=True).status_code == 200
    after = scrape(client)
    for h in HISTOGRAMS:
        assert after.count(h) - before.count(h) == 3, h


def test_rejections_are_counted_without_timings(server):
    client, _, _ = server
    before = scrape(client)
    long = chat(client, messages=[{"role": "user", "content": "word " * 600}], max_tokens=4)
    assert long.status_code == 400 and long.json()["error"]["code"] == "context_length_exceeded"
    invalid = chat(client, temperature="hot")  # schema validation: not a measurement request
    assert invalid.status_code == 400
    after = scrape(client)
    assert (
        after.value("ninfer_requests", outcome="rejected")
        - before.value("ninfer_requests", outcome="rejected")
        == 1
    )
    assert (
        sum(after.value("ninfer_requests", outcome=o) for o in metrics.OUTCOMES)
        - sum(before.value("ninfer_requests", outcome=o) for o in metrics.OUTCOMES)
        == 1
    )
    for h in HISTOGRAMS:
        assert after.count(h) == before.count(h)


@pytest.mark.parametrize("stream", [False, True])
def test_a_store_failure_after_the_outcome_is_a_response_failure(server, stream):
    """A Responses result that the store cannot hold once generated (the check before
    generating passed: the input alone fits) counts in ninfer_response_failures_total; the
    generation's own outcome stays counted once."""
    client, state, _ = server
    body = {"model": "tiny-agent", "input": "Hi!", "max_output_tokens": 4, "stream": stream,
            "reasoning": {"effort": "none"}}  # fmt: skip
    p = prepare(state, parse_create_request(body, model_id="tiny-agent", vision=False))
    envelope = envelope_size(p, "tiny-agent")
    room = envelope + sum(json_size(i) for i in p.req.input_items)
    state.extra[STORE_KEY] = ResponseStore(100, room + 1)  # fits the check, not the result
    before = scrape(client)
    try:
        r = client.post("/v1/responses", json=body, headers=AUTH)
    finally:
        del state.extra[STORE_KEY]
    if stream:
        assert r.status_code == 200 and '"type":"response.failed"' in r.text.replace(" ", "")
    else:
        assert (r.status_code, r.json()["error"]["code"]) == (
            400, "response_store_capacity_exceeded"
        )  # fmt: skip
    after = scrape(client)
    assert after.value("ninfer_response_failures") - before.value("ninfer_response_failures") == 1
    settled = sum(after.value("ninfer_requests", outcome=o) for o in metrics.OUTCOMES)
    assert settled - sum(before.value("ninfer_requests", outcome=o) for o in metrics.OUTCOMES) == 1


def test_metrics_follow_the_api_key(server):
    client, _, _ = server
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"x-api-key": KEY}).status_code == 200
    assert client.get("/health").status_code == 200


def test_host_work_phases_are_the_engines():
    assert metrics.HOST_WORK_PHASES == host_work.PHASES


def test_histogram_buckets_are_cumulative_and_inclusive():
    h = Histogram("t_seconds", "test", (0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 1.0, 7.0):
        h.observe(v)
    fam = h.family()
    buckets = {s.labels["le"]: s.value for s in fam.samples if s.name == "t_seconds_bucket"}
    assert buckets == {"0.1": 2, "1.0": 4, "+Inf": 5}
    assert next(s.value for s in fam.samples if s.name == "t_seconds_sum") == pytest.approx(8.65)
    assert h.count == 5


def test_metrics_stay_readable_after_the_engine_stops(tiny_agent):
    config = serve_config(artifact=str(tiny_agent), max_context=512, log_stats_interval_ms=0)
    artifact = Artifact(tiny_agent)
    state = serve.build_state(config, artifact)
    Observability.start(state, artifact)
    app = create_app(state, extra_handlers=metrics.route_handlers(state))
    with TestClient(app=app) as client:
        body = {
            "model": "tiny-agent",
            "messages": [{"role": "user", "content": "Hi!"}],
            "max_tokens": 3,
            "ignore_eos": True,
        }
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        state.engine.close()  # the worker is gone: the engine cannot accept work any more
        r = client.get("/metrics")
        assert r.status_code == 200
        fams = {f.name: f for f in text_string_to_metric_families(r.text)}
        assert fams["ninfer_engine_ready"].samples[0].value == 0
        assert fams["ninfer_generation_tokens"].samples[0].value == 3  # the last snapshot survives
        assert client.get("/health").status_code == 503
