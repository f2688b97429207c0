"""`ninfer bench serve`: streaming load against a running `ninfer serve`.

Every request gets its own prompt (random words from a seeded generator, distinct from the
first word on, so prefix reuse can share only the chat template's head) of exactly
`--input-len` prompt tokens as the server renders and counts them: the length is calibrated
through the server's own `POST /v1/responses/input_tokens` (the same template and tokenizer a
Chat Completions request goes through), by bisecting on the number of words and then padding
one token at a time. The report states the prompt tokens the server actually counted.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from ninfer.errors import ConfigError

# Appended one at a time to reach the exact length (each usually one token; the first that
# adds exactly one is taken).
FILLERS = (" a", " 0", " x", ".", "a", "0")


def _post(url: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    req = urllib.request.Request(
        url.rstrip("/") + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        detail = e.read()[:300].decode("utf-8", "replace")
        raise ConfigError(f"--url {url}: POST {path} answered HTTP {e.code}: {detail}") from None
    except OSError as e:
        raise ConfigError(f"--url {url}: POST {path} failed ({e})") from None


def token_counter(url: str, model: str, headers: dict[str, str]) -> Callable[[str], int]:
    """text -> the prompt tokens of a one-user-message conversation, as the server counts it."""

    def count(text: str) -> int:
        body = {"model": model, "input": [{"role": "user", "content": text}]}
        return int(_post(url, "/v1/responses/input_tokens", body, headers)["input_tokens"])

    return count


def _words(rng: random.Random, n: int) -> list[str]:
    letters = string.ascii_lowercase
    return ["".join(rng.choices(letters, k=rng.randint(2, 7))) for _ in range(n)]


def exact_prompt(count: Callable[[str], int], length: int, rng: random.Random) -> str:
    """A prompt of random words whose rendered conversation is exactly `length` tokens.
    Raises ConfigError when the template alone is longer, or the length cannot be hit."""
    words = _words(rng, length)  # each word is at least one token: `length` words overshoot
    lo, hi = 0, length  # count(words[:lo]) <= length (lo 0: checked below) < count(words[:hi])
    first = count(words[0])
    if first > length:
        raise ConfigError(
            f"--input-len {length}: a one-word conversation already renders to {first} prompt "
            "tokens (the chat template's own); ask for more"
        )
    lo = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count(" ".join(words[:mid])) <= length:
            lo = mid
        else:
            hi = mid
    text = " ".join(words[:lo])
    have = count(text)
    while have < length:
        for filler in FILLERS:
            n = count(text + filler)
            if have < n <= length:
                text, have = text + filler, n
                break
        else:
            raise ConfigError(
                f"--input-len {length}: cannot pad a prompt of {have} tokens to the exact length"
            )
    return text


def make_prompts(count: Callable[[str], int], n: int, length: int, seed: int) -> list[str]:
    """`n` distinct prompts of exactly `length` prompt tokens each (seeded)."""
    rng = random.Random(seed)
    return [exact_prompt(count, length, random.Random(rng.getrandbits(64))) for _ in range(n)]


def first_model(url: str, headers: dict[str, str]) -> str:
    req = urllib.request.Request(url.rstrip("/") + "/v1/models", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())["data"][0]["id"]
    except OSError as e:
        raise ConfigError(f"--url {url}: cannot list models ({e})") from None


def run_serve(args: argparse.Namespace) -> dict[str, Any]:
    from ninfer.bench.loadgen import server_load, summarise
    from ninfer.commands.bench import limit_figures

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    model = args.model or first_model(args.url, headers)
    work = ceilings = None
    if args.artifact:
        from ninfer.artifact import Artifact
        from ninfer.bench.limits import measure_ceilings, plan_weight_bytes, work_model
        from ninfer.commands.bench import _default_device
        from ninfer.passes.options import CompileOptions
        from ninfer.passes.pipeline import compile_artifact

        device = _default_device(args.device)
        plan = compile_artifact(Artifact(args.artifact), CompileOptions(
            device="cuda" if device.startswith("cuda") else "cpu", max_concurrency=args.max_concurrency or max(args.concurrency)))  # fmt: skip
        work = work_model(plan, plan_weight_bytes(plan))
        ceilings = measure_ceilings(device, plan.dtype)
    count = token_counter(args.url, model, headers)
    sizes = [args.num_requests or c for c in args.concurrency]
    # one prompt per request of every level, plus the warm-up's: none repeats
    prompts = make_prompts(count, 1 + sum(sizes), args.input_len, args.seed)
    server_load(args.url, model, prompts[:1], 1, 2, headers)  # warm-up
    results, used = [], 1
    for c, n in zip(args.concurrency, sizes):
        batch = prompts[used : used + n]
        used += n
        row: dict[str, Any] = {
            "batch": c,
            **summarise(server_load(args.url, model, batch, c, args.output_len, headers)),
        }
        if work is not None:
            row.update(limit_figures(row, work, ceilings, c, args.input_len, args.output_len))
        results.append(row)
    report: dict[str, Any] = {"mode": "serve", "url": args.url, "model": model, "input_len": args.input_len,
                              "output_len": args.output_len, "results": results}  # fmt: skip
    if ceilings is not None:
        report.update(device=ceilings.device, copy_gb_per_s=ceilings.copy_bytes_per_s / 1e9,
                      matmul_tflops=ceilings.matmul_flops_per_s / 1e12,
                      matmul_dtype=ceilings.matmul_dtype)  # fmt: skip
    else:
        report["limit"] = (
            "not computed: pass --artifact (the served model) to compare with the device limit"
        )
    return report
