"""`ninfer.LLM` and `ninfer serve` are one engine: the same requests through the Python API and
through the real HTTP server (a `ninfer serve` process, the official openai client) produce the
same token ids — greedy, seeded sampling, a stop string, and two requests that do not fit the
KV pool together, so that one is paused and resumed.

The server's ids come from its request log (`--request-log-jsonl`, `result.generated_token_ids`
of the `request_done` record whose `http_request_id` is the response's x-request-id).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from ninfer import LLM, SamplingParams
from tests.e2e.conftest import TINY_AGENT

KV_CAPACITY = 64  # four pages: two requests of ~55 tokens each cannot both stay resident
LANES = 2
NO_THINKING = {"enable_thinking": False}
MESSAGES = {
    "capital": [{"role": "user", "content": "What is the capital of France?"}],
    "hello": [{"role": "user", "content": "Hi!"}],
    "pirate": [{"role": "user", "content": "Talk like a pirate."}],
}


@pytest.fixture(scope="module")
def server(server_factory, tmp_path_factory):
    log = tmp_path_factory.mktemp("parity") / "requests.jsonl"
    s = server_factory(
        "--max-concurrency", str(LANES), "--kv-capacity", str(KV_CAPACITY),
        "--request-log-jsonl", str(log), "--log-stats-interval-ms", "0",
    )  # fmt: skip
    s.request_log = log
    return s


@pytest.fixture(scope="module")
def llm():
    llm = LLM(TINY_AGENT, max_concurrency=LANES, kv_capacity=KV_CAPACITY)
    yield llm
    llm.close()


def params_body(p: SamplingParams) -> dict[str, Any]:
    """The Chat Completions fields (and vLLM-style extensions) that mean what `p` means."""
    body: dict[str, Any] = {
        "max_tokens": p.max_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "extra_body": {
            "top_k": p.top_k,
            "min_p": p.min_p,
            "ignore_eos": p.ignore_eos,
            "chat_template_kwargs": NO_THINKING,
        },
    }
    if p.seed is not None:
        body["seed"] = p.seed
    if p.stop:
        body["stop"] = list(p.stop)
    return body


def http_chat(server, name: str, p: SamplingParams) -> tuple[str, str]:
    """(x-request-id, content) of one Chat Completions call with the official client."""
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=server.model, messages=MESSAGES[name], **params_body(p)
    )
    return raw.headers["x-request-id"], raw.parse().choices[0].message.content or ""


def logged(server, request_id: str) -> dict[str, Any]:
    """The request_done record of `request_id` (written once the response is complete)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in Path(server.request_log).read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec["event"] == "request_done" and rec.get("http_request_id") == request_id:
                return rec
        time.sleep(0.1)
    raise AssertionError(f"no request_done record for {request_id}")


CASES = {
    "greedy": ("capital", SamplingParams(max_tokens=24, temperature=0.0)),
    "seeded": (
        "hello",
        SamplingParams(max_tokens=24, temperature=1.0, top_p=0.9, top_k=20, seed=7),
    ),
    "stop": ("capital", SamplingParams(max_tokens=24, temperature=0.0, stop=("Paris",))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_request_gets_the_same_tokens(server, llm, case) -> None:
    name, p = CASES[case]
    (mine,) = llm.chat(MESSAGES[name], p, chat_template_kwargs=NO_THINKING)
    request_id, content = http_chat(server, name, p)
    record = logged(server, request_id)
    assert record["result"]["generated_token_ids"] == mine.token_ids
    assert record["usage"]["prompt_tokens"] == len(mine.prompt_token_ids)
    assert content == mine.text
    if case == "stop":
        assert mine.finish_reason == "stop" and record["finish_reason"] == "stop"
        assert "Paris" not in mine.text and mine.text.startswith("The capital of France is")


def test_a_paused_request_gets_the_same_tokens(server, llm) -> None:
    """Two requests whose KV does not fit the pool together, submitted at once: the younger is
    paused and resumed, on both sides, and each gets the tokens it gets over HTTP."""
    pair = [
        ("pirate", SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)),
        (
            "hello",
            SamplingParams(max_tokens=30, temperature=0.8, top_k=20, seed=3, ignore_eos=True),
        ),
    ]
    before = llm.engine.snapshot().preemptions_total
    mine = llm.chat(
        [MESSAGES[n] for n, _ in pair], [p for _, p in pair], chat_template_kwargs=NO_THINKING
    )
    assert llm.engine.snapshot().preemptions_total > before
    ids: list[str | None] = [None, None]

    def send(i: int) -> None:
        ids[i] = http_chat(server, *pair[i])[0]

    threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.005)  # the same arrival order as the LLM's, well inside the first one's run
    for t in threads:
        t.join()
    records = [logged(server, i) for i in ids if i is not None]
    assert len(records) == 2
    assert [r["result"]["generated_token_ids"] for r in records] == [m.token_ids for m in mine]
    assert sum(r["generation"]["scheduling"]["preemptions"] for r in records) > 0
