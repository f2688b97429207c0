"""`ninfer bench serve` against a real server (uvicorn in this process, loopback only) on the
tiny random llama fixture: every request counted from the stream's usage and timings (random
weights do not reliably form text; every request used to count as failed), distinct prompts of
exactly --input-len tokens as the server counts them (one repeated prompt was answered from the
prefix cache, and --input-len 512 sent 1,546 tokens), and the reasons of failed requests printed.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Iterator

import pytest

from ninfer.bench.loadgen import server_load, summarise
from ninfer.cli import build_parser
from ninfer.commands import bench, bench_report
from ninfer.commands.bench_serve import exact_prompt, make_prompts, token_counter
from tests.api.live_app import live_url

MAX_CONTEXT = 256


def _parse(argv: list[str]) -> argparse.Namespace:
    return build_parser(["bench", *argv]).parse_args(["bench", *argv])


@pytest.fixture(scope="module")
def url(fixture_artifacts) -> Iterator[str]:
    path = fixture_artifacts("llama")
    with live_url(path, max_context=MAX_CONTEXT, max_concurrency=2) as url:
        yield url


def test_prompts_are_distinct_and_exactly_the_asked_length(url):
    model = json.loads(_get(url + "/v1/models"))["data"][0]["id"]
    count = token_counter(url, model, {})
    for length in (24, 57):
        prompts = make_prompts(count, 4, length, seed=3)
        assert len(set(prompts)) == 4
        assert len({p.split()[0] for p in prompts}) == 4  # they differ from the first word
        assert [count(p) for p in prompts] == [length] * 4
    assert make_prompts(count, 2, 30, seed=3) == make_prompts(count, 2, 30, seed=3)  # seeded
    from ninfer.errors import ConfigError

    with pytest.raises(ConfigError, match="--input-len 3: a one-word conversation"):
        exact_prompt(count, 3, random.Random(0))


def _get(u: str) -> str:
    import urllib.request

    with urllib.request.urlopen(u, timeout=30) as r:
        return r.read().decode()


def test_bench_serve_counts_every_request_from_the_stream(url, tmp_path, capsys):
    out = tmp_path / "serve.json"
    argv = ["serve", "--url", url, "--concurrency", "1,2", "--num-requests", "3",
            "--input-len", "40", "--output-len", "7", "--json", str(out)]  # fmt: skip
    assert bench.run(_parse(argv)) == 0
    report = json.loads(out.read_text())
    for row in report["results"]:
        assert (row["requests"], row["failed"], row["errors"]) == (3, 0, {})
        assert row["output_tokens"] == 3 * 7  # ignore_eos: exactly --output-len each
        assert row["prompt_tokens"] == {"min": 40, "max": 40}
        assert row["ttft_ms"]["p50"] > 0 and row["tpot_ms"]["p50"] > 0
    printed = capsys.readouterr().out
    assert "every prompt was 40 tokens as the server counted" in printed
    assert "failed" not in printed.split("\n", 2)[-1]


def test_failed_requests_say_why(url):
    """A request the server refuses is counted failed with the server's own reason, and the
    printed report lists it."""
    model = json.loads(_get(url + "/v1/models"))["data"][0]["id"]
    count = token_counter(url, model, {})
    fine = make_prompts(count, 1, 20, seed=1)[0]
    too_long = " ".join(["word"] * (2 * MAX_CONTEXT))
    row = {"batch": 2, **summarise(server_load(url, model, [fine, too_long], 2, 4))}
    assert row["failed"] == 1 and row["output_tokens"] == 4
    (reason,) = row["errors"]
    assert reason.startswith("HTTP 400 context_length_exceeded: the prompt has")
    printed = bench_report.format_report({"mode": "serve", "input_len": 20, "results": [row]})
    assert f"failed at batch 2: 1 x {reason}" in printed


def test_a_stream_without_text_is_counted_from_usage_and_timings():
    """Random weights can sample tokens that never form text: the stream then has no content
    chunk, only the finish and usage chunks (the server's format, as the real-server tests
    above exercise it). The request counts its usage tokens, placed over the server's decode
    time, instead of failing."""
    from ninfer.bench.loadgen import RequestTiming, _read_stream

    def sse(obj: dict) -> bytes:
        return b"data: " + json.dumps(obj).encode() + b"\n"

    choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    timings = {"prompt_n": 40, "prompt_ms": 12.0, "predicted_n": 5, "predicted_ms": 80.0}
    body = [
        sse({"object": "chat.completion.chunk", "choices": [choice]}), b"\n",
        sse({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}),
        sse({"object": "chat.completion.chunk", "choices": [], "timings": timings,
             "usage": {"prompt_tokens": 40, "completion_tokens": 5, "total_tokens": 45}}),
        b"data: [DONE]\n",
    ]  # fmt: skip
    rec = RequestTiming(time.perf_counter())
    _read_stream(iter(body), rec)
    assert rec.error is None and rec.estimated and rec.output_tokens == 5
    assert rec.prompt_tokens == 40
    assert rec.tpot() == pytest.approx(0.080 / 4)  # the server's decode time over 4 gaps
    row = summarise([rec])
    assert (row["failed"], row["output_tokens"], row["estimated_timings"]) == (0, 5, 1)
    printed = bench_report.format_report(
        {"mode": "serve", "input_len": 40, "results": [{"batch": 1, **row}]}
    )
    assert "batch 1: 1 requests streamed no text" in printed
