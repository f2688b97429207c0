"""`ninfer serve MODEL --spec mtp --lm-head-draft` end to end with the official openai client:
the trained tiny head drafts (draft_n / draft_n_accepted in the timings, /metrics counts the
rounds), the reply is the plain one token for token, and an artifact without the component
stops startup with one line naming it."""

from __future__ import annotations

import subprocess
import sys

import openai
import pytest

from ninfer import LLM, SamplingParams
from tests.e2e.conftest import TINY_AGENT, start_server
from tests.e2e.test_spec_e2e import _metric

PROMPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_agent_mtp):
    tmp = tmp_path_factory.mktemp("mtp")
    s = start_server(
        tmp, "--max-concurrency", "2", "--max-context", "1024", "--spec", "mtp",
        "--lm-head-draft", "--draft-tokens", "3", artifact=tiny_agent_mtp,
    )  # fmt: skip
    yield s
    s.stop()


def test_mtp_chat_reports_draft_work(server, tiny_agent_mtp):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    messages = [{"role": "user", "content": PROMPT}]
    r = client.chat.completions.create(
        model=server.model, messages=messages, temperature=0, max_tokens=60
    )
    plain = LLM(str(tiny_agent_mtp), max_concurrency=1, kv_capacity=1024, max_context=1024)
    (want,) = plain.chat(messages, SamplingParams(temperature=0.0, max_tokens=60))
    assert r.usage.completion_tokens == len(want.token_ids)
    assert r.choices[0].message.content.strip() in want.text
    timings = r.model_extra["timings"]
    assert timings["draft_n"] >= timings["draft_n_accepted"] > 0
    rounds = _metric(server.base_url, "ninfer_spec_decode_rounds_total")
    assert _metric(server.base_url, "ninfer_spec_decode_draft_tokens_total") == timings["draft_n"]
    assert 0 < rounds and timings["draft_n"] <= 3 * rounds


def test_an_artifact_without_the_head_stops_startup_with_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "ninfer.cli", "serve", str(TINY_AGENT), "--port", "0",
         "--max-context", "1024", "--spec", "mtp"],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--spec mtp needs the artifact's mtp component" in lines[0]
