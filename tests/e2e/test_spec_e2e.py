"""`ninfer serve --spec draft` end to end: the trained model drafting for itself through the
real server and the official openai client. The reply is the plain one, the terminal timings
carry llama.cpp's draft_n / draft_n_accepted, /metrics counts the rounds, and the request log's
`speculative` object holds the request's counters; bad speculative flags stop startup with one
line."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ninfer import LLM, SamplingParams
from tests.e2e.conftest import TINY_AGENT, start_server

PROMPT = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spec")
    s = start_server(
        tmp, "--max-concurrency", "2", "--max-context", "1024", "--spec", "draft",
        "--draft-model", str(TINY_AGENT), "--draft-tokens", "3",
        "--request-log-jsonl", str(tmp / "requests.jsonl"),
    )  # fmt: skip
    s.request_log = tmp / "requests.jsonl"
    yield s
    s.stop()


def _metric(base_url: str, name: str) -> float:
    text = httpx.get(base_url + "/metrics").text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                return s.value
    raise KeyError(name)


def test_speculative_chat_reports_draft_work(server):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    messages = [{"role": "user", "content": PROMPT}]
    r = client.chat.completions.create(
        model=server.model, messages=messages, temperature=0, max_tokens=60
    )
    plain = LLM(str(TINY_AGENT), max_concurrency=1, kv_capacity=1024, max_context=1024)
    (want,) = plain.chat(messages, SamplingParams(temperature=0.0, max_tokens=60))
    assert r.usage.completion_tokens == len(want.token_ids)  # the plain reply, token for token
    assert r.choices[0].message.content.strip() in want.text
    timings = r.model_extra["timings"]
    assert timings["predicted_n"] == r.usage.completion_tokens
    assert timings["draft_n"] >= timings["draft_n_accepted"] > 0
    assert timings["draft_n_accepted"] >= 0.8 * timings["draft_n"]  # it drafts for itself
    rounds = _metric(server.base_url, "ninfer_spec_decode_rounds_total")
    drafted = _metric(server.base_url, "ninfer_spec_decode_draft_tokens_total")
    accepted = _metric(server.base_url, "ninfer_spec_decode_accepted_tokens_total")
    assert drafted == timings["draft_n"] and accepted == timings["draft_n_accepted"]
    assert 0 < rounds and drafted <= 3 * rounds
    (done,) = [
        rec for rec in map(json.loads, server.request_log.read_text().splitlines())
        if rec.get("event") == "request_done"
    ]  # fmt: skip
    spec = done["speculative"]
    assert spec["backend"] == "draft" and spec["draft_window"] == 3
    assert spec["rounds"] == rounds and spec["drafted_tokens"] == drafted
    assert spec["accepted_tokens"] == accepted == sum(spec["accepted_per_position"])


def test_a_missing_draft_model_stops_startup_with_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "ninfer.cli", "serve", str(TINY_AGENT), "--port", "0",
         "--max-context", "1024", "--spec", "draft", "--draft-model", "missing.ninfer"],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["ninfer serve: error: --draft-model missing.ninfer: no such file or directory"]
