"""Load generators and latency statistics of `ninfer bench`.

A request's timing is its submit time and the arrival time of each output token (tokens that
arrive together — one streamed chunk, one merged engine event — share a time). From those:

    TTFT  first token - submit
    TPOT  (last token - first token) / (output tokens - 1)      per request
    ITL   gaps between consecutive token arrivals, all requests pooled
    output tok/s  all output tokens / (last token of any request - first submit)

Percentiles are p50 / p90 / p99 with linear interpolation.

Three sources of timings: the in-process engine (`engine_load`), a running `ninfer serve`
over streaming Chat Completions (`server_load`, tokens counted from the stream's timings and
usage, not from text), and transformers (ninfer.bench.peer).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass
class RequestTiming:
    submit_s: float
    token_s: list[float] = field(default_factory=list)  # arrival time of each output token
    error: str | None = None
    prompt_tokens: int | None = None  # as the server counted them (a server load)
    estimated: bool = False  # token times spread over the server's decode time (no text came)

    @property
    def output_tokens(self) -> int:
        return len(self.token_s)

    def ttft(self) -> float | None:
        return self.token_s[0] - self.submit_s if self.token_s else None

    def tpot(self) -> float | None:
        n = len(self.token_s)
        return (self.token_s[-1] - self.token_s[0]) / (n - 1) if n > 1 else None

    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.token_s, self.token_s[1:])]


def percentiles(values: list[float], scale: float = 1e3) -> dict[str, float | None]:
    """{"p50", "p90", "p99", "mean"} of `values` times `scale` (seconds -> ms by default)."""
    if not values:
        return {f"p{p}": None for p in PERCENTILES} | {"mean": None}
    arr = np.asarray(values, dtype=np.float64) * scale
    out: dict[str, float | None] = {f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES}
    out["mean"] = float(arr.mean())
    return out


def summarise(timings: list[RequestTiming]) -> dict[str, Any]:
    """TTFT / TPOT / ITL percentiles in ms, output tokens and output tok/s of one load; the
    failed requests' reasons (`errors`: reason -> count); for a server load, the prompt tokens
    the server counted and how many requests had their token times estimated."""
    ok = [t for t in timings if t.error is None and t.token_s]
    tokens = sum(t.output_tokens for t in ok)
    wall = (max(t.token_s[-1] for t in ok) - min(t.submit_s for t in timings)) if ok else 0.0
    errors: dict[str, int] = {}
    done = {id(t) for t in ok}
    for t in timings:
        if id(t) not in done:
            reason = t.error or "no output tokens"
            errors[reason] = errors.get(reason, 0) + 1
    prompts = [t.prompt_tokens for t in ok if t.prompt_tokens is not None]
    extra: dict[str, Any] = {}
    if prompts:
        extra["prompt_tokens"] = {"min": min(prompts), "max": max(prompts)}
        extra["estimated_timings"] = sum(t.estimated for t in ok)
    return {
        **extra,
        "errors": errors,
        "requests": len(timings),
        "failed": len(timings) - len(ok),
        "output_tokens": tokens,
        "wall_s": wall,
        "output_tok_per_s": tokens / wall if wall > 0 else None,
        "ttft_ms": percentiles([t.ttft() for t in ok]),  # type: ignore[misc]
        "tpot_ms": percentiles([t.tpot() for t in ok if t.tpot() is not None]),  # type: ignore[misc]
        "itl_ms": percentiles([g for t in ok for g in t.itls()]),
    }


# -- in-process engine -------------------------------------------------------------------------


def engine_load(engine: Any, prompts: list[list[int]], output_len: int) -> list[RequestTiming]:
    """Submit every prompt at once (greedy, ignore_eos, exactly output_len tokens) and time
    each token event as the handle delivers it."""
    from ninfer.runtime.request import Request, SamplingParams, TokensEvent

    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)

    async def consume(handle: Any, rec: RequestTiming) -> None:
        async for ev in handle:
            if isinstance(ev, TokensEvent):
                now = time.perf_counter()
                rec.token_s.extend([now] * len(ev.token_ids))
            elif getattr(ev, "error", None) is not None:
                rec.error = str(ev.error)

    async def main() -> list[RequestTiming]:
        recs, tasks = [], []
        for p in prompts:
            rec = RequestTiming(time.perf_counter())
            handle = engine.submit(Request(tuple(p), params))
            recs.append(rec)
            tasks.append(asyncio.ensure_future(consume(handle, rec)))
        await asyncio.gather(*tasks)
        return recs

    return asyncio.run(main())


# -- a running server --------------------------------------------------------------------------


def _read_stream(resp: Any, rec: RequestTiming) -> None:
    """Token arrival times from a Chat Completions stream sent with `timings_per_token`.

    Tokens are counted from the server's numbers, never from text: each chunk's
    `timings.predicted_n` (output tokens so far) places the new tokens at the chunk's arrival,
    and the final usage chunk's `completion_tokens` is the total. Tokens that never formed text
    (random weights, partial UTF-8) arrive with that final chunk; when no chunk carried any
    (`rec.estimated`), they are spread back over the server's `predicted_ms` from it. A server
    without timings falls back to one token per text delta.
    """
    counted = 0
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    end = None
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        now = time.perf_counter()
        chunk = json.loads(data)
        if chunk.get("error"):
            err = chunk["error"]
            rec.error = f"stream error {err.get('code') or err.get('type')}: {err.get('message')}"
            return
        timings = chunk.get("timings") or timings
        if chunk.get("usage"):  # the final chunk: its totals are placed below
            usage, end = chunk["usage"], now
            continue
        seen = (chunk.get("timings") or {}).get("predicted_n")
        if seen is None:  # a server without per-token timings: one token per text delta
            for choice in chunk.get("choices", []):
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("reasoning_content"):
                    seen = counted + 1
        if seen is not None and seen > counted:
            rec.token_s.extend([now] * (seen - counted))
            counted = seen
    if usage is None:
        rec.error = "the stream ended without a usage chunk"
        return
    rec.prompt_tokens = usage.get("prompt_tokens")
    total = int(usage.get("completion_tokens") or 0)
    if total < counted:
        del rec.token_s[total:]
    elif total > counted and counted:
        rec.token_s.extend([end] * (total - counted))
    elif total > counted:  # no chunk carried a token: the server's decode time places them
        decode_s = float((timings or {}).get("predicted_ms") or 0.0) / 1e3
        first = end - decode_s
        step = decode_s / (total - 1) if total > 1 else 0.0
        rec.token_s = [first + i * step for i in range(total)]
        rec.estimated = True
    if not rec.token_s:
        rec.error = "the server generated no output tokens"


def _stream_chat(
    url: str, body: dict[str, Any], headers: dict[str, str], rec: RequestTiming, timeout: float
) -> None:
    u = urllib.parse.urlsplit(url)
    conn_cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(u.hostname, u.port, timeout=timeout)
    try:
        rec.submit_s = time.perf_counter()
        conn.request(
            "POST",
            "/v1/chat/completions",
            json.dumps(body),
            {"Content-Type": "application/json", **headers},
        )
        resp = conn.getresponse()
        if resp.status != 200:
            text = resp.read()[:300].decode("utf-8", "replace")
            try:
                err = json.loads(text)["error"]
                rec.error = f"HTTP {resp.status} {err.get('code')}: {err.get('message')}"
            except (ValueError, KeyError, TypeError):
                rec.error = f"HTTP {resp.status}: {text}"
            return
        _read_stream(resp, rec)
    except (OSError, http.client.HTTPException, ValueError) as e:
        rec.error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def server_load(
    url: str, model: str, prompts: list[str], concurrency: int, output_len: int,
    headers: dict[str, str] | None = None, timeout: float = 600.0,
) -> list[RequestTiming]:  # fmt: skip
    """Send one streaming chat request per prompt, `concurrency` at a time (like
    `vllm bench serve` with a fixed concurrency), greedy, exactly `output_len` tokens each
    (max_tokens with ignore_eos)."""

    def body(prompt: str) -> dict[str, Any]:
        return {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": output_len,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "timings_per_token": True,
        }

    recs = [RequestTiming(0.0) for _ in prompts]
    lock = threading.Lock()
    next_idx = [0]

    def worker() -> None:
        while True:
            with lock:
                i = next_idx[0]
                next_idx[0] += 1
            if i >= len(prompts):
                return
            _stream_chat(url, body(prompts[i]), headers or {}, recs[i], timeout)

    threads = [
        threading.Thread(target=worker, daemon=True) for _ in range(min(concurrency, len(prompts)))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return recs
