"""`ninfer serve --tensor-parallel 2` on CPU: the real server process with one gloo worker
process, driven by the official openai client.

- a greedy chat answer over HTTP is the one `ninfer.LLM` gives at tensor-parallel 1;
- two requests that do not fit the KV pool together (one is paused and replayed: a
  tensor-parallel engine pauses by replay) get the tokens they get at tensor-parallel 1;
- killing the worker stops the server with an error naming the dead rank, instead of hanging:
  a request in flight ends, the process exits, no rank process is left.

One server for the module (the kill comes last).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from ninfer import LLM, SamplingParams
from tests.e2e.conftest import TINY_AGENT, LiveServer, start_server

KV_CAPACITY = 64  # four pages: two requests of ~55 tokens each cannot both stay resident
LANES = 2
NO_THINKING = {"enable_thinking": False}
CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]
PIRATE = [{"role": "user", "content": "Talk like a pirate."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[LiveServer]:
    s = start_server(
        tmp_path_factory.mktemp("tp-serve"),
        "--tensor-parallel", "2", "--max-concurrency", str(LANES),
        "--kv-capacity", str(KV_CAPACITY), "--log-stats-interval-ms", "0",
    )  # fmt: skip
    yield s
    s.stop()


@pytest.fixture(scope="module")
def llm() -> Iterator[LLM]:
    llm = LLM(TINY_AGENT, max_concurrency=LANES, kv_capacity=KV_CAPACITY)
    yield llm
    llm.close()


def chat(server: LiveServer, messages: list, p: SamplingParams, **kw) -> str:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(
        model=server.model,
        messages=messages,
        max_tokens=p.max_tokens,
        temperature=p.temperature,
        extra_body={"ignore_eos": p.ignore_eos, "chat_template_kwargs": NO_THINKING},
        **kw,
    )
    return r.choices[0].message.content or ""


def children(pid: int) -> list[int]:
    """Process ids whose parent is `pid` (Linux /proc)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def test_greedy_chat_equals_tensor_parallel_1(server, llm):
    p = SamplingParams(max_tokens=24, temperature=0.0)
    (mine,) = llm.chat(CAPITAL, p, chat_template_kwargs=NO_THINKING)
    assert mine.text.startswith("The capital of France is")
    assert chat(server, CAPITAL, p) == mine.text


def test_a_paused_request_replays_to_the_same_tokens(server, llm):
    p = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    before = llm.engine.snapshot().preemptions_total
    mine = llm.chat([PIRATE, CAPITAL], [p, p], chat_template_kwargs=NO_THINKING)
    assert llm.engine.snapshot().preemptions_total > before  # they do not fit together
    got: list[str | None] = [None, None]

    def send(i: int, messages: list) -> None:
        got[i] = chat(server, messages, p)

    threads = [threading.Thread(target=send, args=(i, m)) for i, m in enumerate([PIRATE, CAPITAL])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == [m.text for m in mine]


def test_a_dead_rank_stops_the_server(server):
    (worker,) = children(server.process.pid)
    outcome: list[object] = []

    def long_request() -> None:
        try:
            chat(server, PIRATE, SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True),
                 timeout=60)  # fmt: skip
            outcome.append("finished")
        except openai.APIError as e:  # the step failed or the connection closed: either ends it
            outcome.append(e)

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(0.5)  # the request is decoding
    os.kill(worker, signal.SIGKILL)
    t.join(60)
    assert outcome, "the request in flight hung"
    assert server.process.wait(60) != 0
    log = server.stderr()
    assert f"tensor-parallel rank 1 (pid {worker}) exited with code -9" in log
    assert "stopping the server" in log
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)
