"""/health keeps answering while a maximal body (just under --max-request-mib, 8 MiB here) is
decoded, validated, rendered and counted. A body over 1 MiB is screened in a worker process
(ninfer.api.service.body_screen): a prompt over the context is refused there, and the server
parses only a slim copy of the body. What the server does itself runs in worker threads in short
GIL holds: JSON in 256k slices (ninfer.api.wire.json_chunked), searches over the prompt window
by window (ninfer.api.wire.long_text), prompt encoding with the GIL released, the collector
paused; and `ninfer serve` freezes its startup heap and hands the GIL over after 1 ms, not 5
(ninfer.api.server.http_server). Before, one such request held the event loop for seconds (7.5-9 s
for a 2 MB /v1/responses/input_tokens).

Why the worker: preparing a maximal prompt in the server builds several 32 MB strings (8M
characters, four bytes each once one is outside the BMP): the decoded body, the content string,
the template's output. Each is one C call, so one GIL hold: ~4 ms when its memory is reused,
but 27-90 ms on fresh pages of the shared 2-core test machine even idle (the content string
measured 65-69 ms on every run of the in-process work), up to 700 ms when 12-14 tasks were
runnable. At load 9 a thread of pure Python beside a sleeping one already made 1 ms sleeps wake
22-28 ms late (29-71 ms with the 5 ms switch interval).
"""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from tokenizers import Tokenizer

from ninfer.api.server.http_server import GIL_SWITCH_INTERVAL_S
from ninfer.api.service.prompt_encoding import PromptEncoder
from ninfer.api.wire.offload import gc_paused
from ninfer.artifact import Artifact
from tests.adversarial.conftest import MAX_BODY

TEXT = "The quick brown fox jumps over the lazy dog, said Émile 😀. "
PROMPT = TEXT * ((MAX_BODY - 4096) // len(TEXT.encode()))  # the body stays under the limit
BODIES = {
    "/v1/chat/completions": {"model": "tiny-agent", "messages": [{"role": "user", "content": PROMPT}],
                             "max_tokens": 1},
    "/v1/responses/input_tokens": {"model": "tiny-agent", "input": PROMPT},
    "/v1/messages/count_tokens": {"model": "tiny-agent",
                                  "messages": [{"role": "user", "content": PROMPT}]},
}  # fmt: skip


# the bound of both tests: /health answers within 100 ms while a maximal body is prepared
BOUND_S = 0.1


def sample_health(client: httpx.Client, server, until: threading.Event | None) -> list[float]:
    """/health times (ms) on `client`'s kept-alive connection, every 10 ms: 20 of them, or
    until `until` is set."""
    out = []
    while (until is None and len(out) < 20) or (until is not None and not until.is_set()):
        start = time.perf_counter()
        assert client.get(f"{server.base_url}/health").status_code == 200
        out.append((time.perf_counter() - start) * 1000)
        time.sleep(0.01)
    return out


@pytest.mark.parametrize("path", list(BODIES))
def test_health_answers_while_a_maximal_body_is_prepared(patient_server, path, record_property):
    """The real server: the slowest /health on one kept-alive connection while the maximal body
    is sent and refused (context_length_exceeded) is within 100 ms of the slowest of 20 taken
    idle just before. Before, each sample opened a new client and connection from this process
    (50-220 ms idle in suite runs: an SSL context, this process's collector over the suite's
    heap), and a kept-alive one waited 40 ms for a delayed ACK (Nagle, now off). Measured on the
    shared 2-core machine, three runs of this file each: 4-27 ms during (3-7 ms idle); 28-42 ms
    beside a busy process. Before the worker process screened the body: 25-77 ms idle, 32-121 ms
    beside a busy process, 93-150 ms on a freshly started machine (fresh-clone CI measured
    102-110 ms). A try over the bound is measured once more, as the in-process test does (a
    stall of the server recurs on every request, a descheduled thread of a busy machine does
    not)."""
    raw = json.dumps(BODIES[path], ensure_ascii=False).encode()
    assert MAX_BODY - 65536 < len(raw) <= MAX_BODY
    tries = [_health_during(patient_server, path, raw)]
    if (
        tries[0][1] >= tries[0][0] + BOUND_S * 1000
    ):  # a stall of the server recurs; one of the machine not
        tries.append(_health_during(patient_server, path, raw))
    record_property("health_ms", [{"idle": round(b, 1), "during": round(d, 1)} for b, d in tries])
    baseline, during = tries[-1]
    assert during < baseline + BOUND_S * 1000, (
        f"/health took {during:.0f} ms (idle {baseline:.0f}): {tries}"
    )


def _health_during(server, path: str, raw: bytes) -> tuple[float, float]:
    """(slowest of 20 idle /health samples, slowest while `raw` is sent to `path` and refused),
    in ms, on one kept-alive connection."""
    result = {}
    done = threading.Event()

    def send() -> None:
        r = httpx.post(f"{server.base_url}{path}", content=raw, timeout=120,
                       headers={"content-type": "application/json"})  # fmt: skip
        result["status"], result["text"] = r.status_code, r.text
        done.set()

    # one kept-alive connection, so that a sample is the server's answer, not this process
    # making a client (an SSL context) and a connection; this process's own collector paused,
    # so that a collection over the test suite's heap is not taken for the server's stall
    with httpx.Client(timeout=10) as client, gc_paused():
        baseline = max(sample_health(client, server, None))
        sender = threading.Thread(target=send)
        sender.start()
        during = sample_health(client, server, done)
        sender.join()
    assert result["status"] == 400 and "context_length_exceeded" in result["text"]
    assert len(during) >= 3, "the request finished before /health could be sampled"
    return baseline, max(during)


def longest_wait(work: Callable[[], object]) -> float:
    """Seconds: the latest a 1 ms sleep of this thread woke while `work` ran in another."""
    gaps: list[float] = []
    worker = threading.Thread(target=work)
    last = time.perf_counter()
    worker.start()
    while worker.is_alive():
        time.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    worker.join()
    return max(gaps)


def test_preparing_a_maximal_body_never_stalls_the_event_loop(tiny_agent, record_property):
    """The handler's work for a maximal body, as the server does it (the body screened by the
    worker process, ninfer.api.service.body_screen; the slim copy it returns decoded, the
    request converted and its preparation refused in a thread; collector paused, startup heap
    frozen, 1 ms switch interval), while this thread measures how late 1 ms sleeps wake: under
    BOUND_S. Measured on the shared 2-core machine, three runs each: 6-10 ms idle, 26 ms
    beside a busy process. Before, when the server decoded, rendered and counted the body
    itself: 44-97 ms idle and 27-60 ms beside a busy process, each 32 MB string one GIL hold
    (the content string alone 65-69 ms on every run); 111-148 ms in full suite runs before the
    windowed searches and the GIL-free encoding."""
    from ninfer.api.chat.endpoints import screened_generation, to_generation_request
    from ninfer.api.chat.request import parse_chat_request
    from ninfer.api.wire.errors import ApiError
    from ninfer.api.wire.fields import parse_json_object
    from tests.api.live_app import app_client

    raw = json.dumps(BODIES["/v1/chat/completions"], ensure_ascii=False).encode()
    with app_client(tiny_agent, max_context=2048) as c:
        state = c.app.state.server
        service = state.extra["service"]
        screen = service.screen(screened_generation)

        async def handle() -> None:
            slim = await screen(raw)  # the worker decodes, renders and counts the body
            assert slim is not None and len(slim) < 4096, "the body was not screened"
            chat = parse_chat_request(parse_json_object(slim), model_id="tiny-agent", vision=False)
            gen = to_generation_request(chat, state)
            await asyncio.to_thread(service._prepare_quietly, gen)

        def work() -> None:
            with pytest.raises(ApiError, match="context"):
                asyncio.run(handle())

        # a GIL hold comes back on every run of the same work; a stall of the 2-core machine
        # (another process, a page-cache flush) does not, so one retry tells them apart. The
        # objects earlier tests left in this process are frozen out of the collector first, as
        # `ninfer serve` freezes its startup heap: a full collection over the whole suite's heap
        # holds the GIL for 100+ ms, which says nothing about a server's heap
        gc.collect()
        gc.freeze()
        interval = sys.getswitchinterval()
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)  # as `ninfer serve` sets it
        try:
            waits = [longest_wait(work)]
            if waits[0] >= BOUND_S:
                waits.append(longest_wait(work))
        finally:
            sys.setswitchinterval(interval)
            gc.unfreeze()
    record_property("waits_ms", [round(w * 1000, 1) for w in waits])
    assert min(waits) < BOUND_S, f"the event loop would have waited {min(waits) * 1000:.0f} ms"


def test_encoding_a_long_prompt_lets_other_threads_run(tiny_agent, record_property):
    """A prompt within a long context is encoded whole: HF tokenizers' `encode` held the GIL
    throughout (785 ms for these 262k characters, alone; 497 ms in a test run), `encode_batch`
    releases it (9-44 ms in five runs of tests/adversarial at load 7-9)."""
    tokenizer = Tokenizer.from_str(Artifact(tiny_agent).tokenizer_json)
    encoder = PromptEncoder(tokenizer)
    text = (TEXT * (1 + (1 << 18) // len(TEXT)))[: 1 << 18]
    ids: list[int] = []
    wait = longest_wait(lambda: ids.extend(encoder.encode(text)))
    record_property("wait_ms", round(wait * 1000, 1))
    assert ids == tokenizer.encode(text, add_special_tokens=False).ids
    assert wait < 0.1, f"another thread waited {wait * 1000:.0f} ms"


def handoff_ms() -> float:
    """Median lateness (ms) of this thread's 1 ms sleeps while another thread runs pure Python
    (no long C call): how long a waiting thread takes to get the GIL from a running holder."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    gaps = []
    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        last = time.perf_counter()
        for _ in range(300):
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append((now - last) * 1000 - 1)
            last = now
    finally:
        stop.set()
        spinner.join()
    return statistics.median(gaps)


def test_the_started_server_is_set_for_event_loop_latency(record_property):
    """`ninfer serve`'s uvicorn server, once started: (1) the objects that existed at startup
    are frozen, so a full collection walks only what came later (before, one walked the whole
    startup heap with the GIL held: 400-700 ms for the ~235k objects of a server on the tiny
    model, measured on the shared 2-core machine; 300k objects stand for that heap here);
    (2) a thread that wants the GIL gets it from a running holder within ~1 ms, not CPython's
    default 5 ms switch interval. Measured in five runs of tests/adversarial: a full collection
    290-872 ms before, 0.03-0.05 ms after; the median handoff 5.2 ms before, 1.2 ms after."""
    from ninfer.api.server.http_server import graceful_server, uvicorn_config

    async def app(scope, receive, send) -> None:  # the server's own startup is the subject
        raise AssertionError("no request is sent")

    heap = [{"i": i} for i in range(300_000)]
    sock = socket.create_server(("127.0.0.1", 0))
    server = graceful_server(
        uvicorn_config(app, client_timeout_s=1, log_level="warning", lifespan="off"), None
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    interval = sys.getswitchinterval()
    try:
        handoff_before = handoff_ms()
        start = time.perf_counter()
        gc.collect()
        before = time.perf_counter() - start
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        start = time.perf_counter()
        gc.collect()
        after = time.perf_counter() - start
        handoff_after = handoff_ms()
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        gc.unfreeze()  # the rest of the test session runs as before
        sys.setswitchinterval(interval)
    record_property(
        "server_start",
        {"full_collection_ms": [round(before * 1000, 1), round(after * 1000, 2)],
         "handoff_ms": [round(handoff_before, 1), round(handoff_after, 1)]},
    )  # fmt: skip
    assert len(heap) == 300_000
    assert after < before / 5, (
        f"a full collection took {after * 1000:.0f} ms, {before * 1000:.0f} before"
    )
    # with a 5 ms interval a waiting thread waits the whole interval before the running holder
    # is asked to hand over, so the median is 5 ms or more (here: before the server started)
    assert handoff_after < 4.5, (
        f"the GIL came {handoff_after:.1f} ms late (median), {handoff_before:.1f} ms before"
    )
