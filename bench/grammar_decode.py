"""Constrained decoding through the engine: host mask cost per step and decode speed, on vs off.

    python3 bench/grammar_decode.py [ARTIFACT] [--device cpu|cuda] [--dtype D] [--batch 8]
                                    [--tokens 128] [--rounds 3] [--steps 300] [--out FILE.json]

ARTIFACT defaults to the demo model (SmolLM2-135M-Instruct, vocab 49152). Imports only torch,
llguidance and ninfer, so it runs on any host ninfer runs on (CPU here; the H200 for the ratio
that matters: the mask is filled on the host while the device computes the step).

1. Mask cost, in isolation: `--batch` sequences under the nested JSON schema below (objects three
   deep, enums, arrays, bounded strings, a pattern, required fields), each step = the engine's
   host fill of every row (`ConstraintState.step_mask`: llguidance's batched call), timed; then
   each row advances by a random allowed token (not timed); a finished document restarts.
   Also the device side (`StepMask.apply`: the mask's copy and the -inf fill of [batch, vocab]
   logits, synchronised for timing only). Median and p99 per step.
2. Decode through the engine (`ninfer.LLM`, the serving engine): `--batch` requests of `--tokens`
   output tokens each, sampled (temperature 0.7, fixed seeds), run together, with no constraint
   (ignore_eos: every request runs to `--tokens`) and constrained to a JSON array of nested
   objects that cannot close within the run (a Lark grammar over the same schema, in ninfer's JSON
   layout: 256 documents before the `]`), so
   the batch stays full to the end. Decode
   tok/s = the batch's output tokens after the first, over the time from the last request's
   first token to the last finish (prefill excluded); the median of `--rounds` rounds, each
   running off and on in turn so a change in the machine's load hits both. The engine's own
   host fill time per step is measured by timing its ConstraintState during the constrained run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ninfer import LLM
from ninfer.artifact.demo import demo_artifact_path
from ninfer.artifact.format import Artifact
from ninfer.constrain import Grammar, JsonSchema, TokenizerInfo, compile_constraint
from ninfer.constrain.schema import JSON_OPTIONS
from ninfer.constrain.state import ConstraintState
from ninfer.runtime.request import Request, SamplingParams

NESTED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0},
        "status": {"enum": ["open", "closed", "pending"]},
        "owner": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 24},
                "role": {"enum": ["admin", "user"]},
                "address": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "maxLength": 20},
                        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                    },
                    "required": ["city", "zip"],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "role", "address"],
            "additionalProperties": False,
        },
        "tags": {
            "type": "array",
            "items": {"type": "string", "maxLength": 12},
            "minItems": 1,
            "maxItems": 4,
        },
        "score": {"type": "number", "minimum": 0, "maximum": 100},
        "done": {"type": "boolean"},
    },
    "required": ["id", "status", "owner", "tags", "done"],
    "additionalProperties": False,
}
# nested documents without end within any --tokens the bench uses: the array closes only after
# 256 documents (each one is tens of tokens), so the batch stays full to the end
ENDLESS_LARK = (
    '%llguidance {}\nstart: "[" doc (", " doc)~255 "]"\ndoc: %json '
    + json.dumps({**NESTED_SCHEMA, "x-guidance": JSON_OPTIONS})
    + "\n"
)
PROMPTS = [
    "List the open tickets as JSON.", "Give me the support queue as JSON objects.",
    "Dump every ticket record in JSON.", "Show the backlog as a JSON array.",
    "Return all issues as JSON.", "Export the tasks to JSON.", "Print the ticket list as JSON.",
    "Write the records as a JSON array of objects.",
]  # fmt: skip


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def mask_cost(info: TokenizerInfo, batch: int, steps: int, device: str, seed: int) -> dict:
    """Section 1 (see the module docstring): ms per step, host fill and device apply."""
    constraint = compile_constraint(JsonSchema(NESTED_SCHEMA), info)
    state = ConstraintState(batch)
    rng = random.Random(seed)
    ids = list(range(batch))
    outputs: dict[int, list[int]] = {i: [] for i in ids}
    next_id = batch
    logits = torch.zeros(batch, info.vocab_size, device=device)
    fill_ms, apply_ms, docs = [], [], 0
    for _ in range(steps):
        rows = [(i, constraint) for i in ids]
        t0 = time.perf_counter()
        mask = state.step_mask(rows)
        fill_ms.append((time.perf_counter() - t0) * 1e3)
        assert mask is not None and not mask.dead
        _sync(device)
        t0 = time.perf_counter()
        masked = mask.apply(logits)
        _sync(device)
        apply_ms.append((time.perf_counter() - t0) * 1e3)
        allowed = torch.isfinite(masked).cpu()
        for r, seq_id in enumerate(ids):
            choices = torch.nonzero(allowed[r]).flatten().tolist()
            outputs[seq_id].append(rng.choice(choices))
            verdict = state.advance(seq_id, outputs[seq_id])
            assert verdict.error is None, verdict
            if verdict.stop or outputs[seq_id][-1] in info.eos_token_ids:
                state.forget(seq_id)
                del outputs[seq_id]
                ids[r], outputs[next_id] = next_id, []
                next_id, docs = next_id + 1, docs + 1
    return {
        "fill_ms_median": statistics.median(fill_ms),
        "fill_ms_p99": _pct(fill_ms, 0.99),
        "apply_ms_median": statistics.median(apply_ms),
        "apply_ms_p99": _pct(apply_ms, 0.99),
        "documents_finished": docs,
        "steps": steps,
    }


class _TimedState:
    """Wraps an engine's ConstraintState.step_mask to record its host time per call."""

    def __init__(self, state: ConstraintState) -> None:
        self.ms: list[float] = []
        inner = state.step_mask

        def timed(rows):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            out = inner(rows)
            if out is not None:
                self.ms.append((time.perf_counter() - t0) * 1e3)
            return out

        state.step_mask = timed  # type: ignore[method-assign]


def decode_run(llm: LLM, info: TokenizerInfo, batch: int, tokens: int, constrained: bool) -> dict:
    """One batch of `batch` requests, constrained or not; tok/s as in the module docstring."""
    endless = Grammar(ENDLESS_LARK, "lark")
    constraint = compile_constraint(endless, info) if constrained else None
    requests = [
        Request(
            tuple(llm.tokenizer.encode(PROMPTS[i % len(PROMPTS)])),
            SamplingParams(max_tokens=tokens, temperature=0.7, seed=i, ignore_eos=not constrained),
            constraint=constraint,
        )
        for i in range(batch)
    ]
    handles = [llm.engine.submit(r) for r in requests]
    outs = [h.result(timeout=3600) for h in handles]
    for out in outs:
        if out.finish_reason != "length":
            raise RuntimeError(f"a request ended early ({out.finish_reason}): {out}")
    # engine clock from arrival: the decode window opens when every request has its first token
    first = max(o.timings.ttft_s for o in outs)  # type: ignore[type-var]
    last = max(o.timings.total_s for o in outs)
    produced = sum(len(o.token_ids) for o in outs)
    return {
        "tokens": produced,
        "decode_tok_s": (produced - len(outs)) / (last - first),
        "wall_tok_s": produced / last,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact", nargs="?", help="a .ninfer file (default: the demo model)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="activation dtype (the engine's default)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300, help="steps of the isolated mask timing")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write the figures as JSON here too")
    args = ap.parse_args()
    path = Path(args.artifact) if args.artifact else demo_artifact_path()
    info = TokenizerInfo.from_artifact(Artifact(path))
    report: dict[str, Any] = {
        "command": "python3 bench/grammar_decode.py " + " ".join(sys.argv[1:]),
        "artifact": path.name,
        "vocab": info.vocab_size,
        "device": args.device,
        "host": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        "torch_threads": torch.get_num_threads(),
        "batch": args.batch,
    }
    if args.device == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    report["mask"] = mask_cost(info, args.batch, args.steps, args.device, args.seed)
    options: dict[str, Any] = {"device": args.device, "max_concurrency": args.batch}
    if args.dtype:
        options["dtype"] = args.dtype
    context = 64 + args.tokens + 16
    llm = LLM(str(path), kv_capacity=args.batch * context, max_context=context, **options)
    try:
        timed = _TimedState(llm.engine._constraints)  # the engine's own host fills
        decode_run(llm, info, args.batch, min(16, args.tokens), False)  # warm-up
        decode_run(llm, info, args.batch, min(16, args.tokens), True)
        timed.ms.clear()
        off, on = [], []
        for _ in range(args.rounds):
            off.append(decode_run(llm, info, args.batch, args.tokens, False)["decode_tok_s"])
            on.append(decode_run(llm, info, args.batch, args.tokens, True)["decode_tok_s"])
    finally:
        llm.close()
    report["decode"] = {
        "tokens_per_request": args.tokens,
        "rounds": args.rounds,
        "off_tok_s": statistics.median(off),
        "on_tok_s": statistics.median(on),
        "on_over_off": statistics.median(on) / statistics.median(off),
        "off_tok_s_rounds": off,
        "on_tok_s_rounds": on,
        "engine_fill_ms_median": statistics.median(timed.ms),
        "engine_fill_ms_p99": _pct(timed.ms, 0.99),
        "engine_fill_steps": len(timed.ms),
    }
    m, d = report["mask"], report["decode"]
    print(f"{report['artifact']} (vocab {report['vocab']}) on {args.device}, batch {args.batch}")
    print(f"  host:  {report['host']}, {report['torch_threads']} torch threads")
    print(
        f"  mask fill (host, isolated): median {m['fill_ms_median']:.3f} ms, "
        f"p99 {m['fill_ms_p99']:.3f} ms per step ({m['documents_finished']} documents)"
    )
    print(
        f"  mask apply ({args.device}): median {m['apply_ms_median']:.3f} ms, "
        f"p99 {m['apply_ms_p99']:.3f} ms per step"
    )
    print(
        f"  mask fill (host, in the engine): median {d['engine_fill_ms_median']:.3f} ms, "
        f"p99 {d['engine_fill_ms_p99']:.3f} ms over {d['engine_fill_steps']} steps"
    )
    print(
        f"  decode: off {d['off_tok_s']:.1f} tok/s, on {d['on_tok_s']:.1f} tok/s "
        f"({100 * d['on_over_off']:.1f}% of off), median of {args.rounds} rounds"
    )
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
