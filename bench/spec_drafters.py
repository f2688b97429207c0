"""What the real speculative drafters cost per round, relative to a plain decode step.

    python bench/spec_drafters.py [--synthetic qwen3-8b] [--weights bf16] [--context 512]
                                  [--repeats 50] [--drafters mtp,dflash] [--heads full,draft]
                                  [--out bench/results/spec_drafters.md]

The synthetic model (random weights of a real shape, made on the device) carries random
drafters of the real layouts (build_synthetic(drafters=("mtp", "dflash"))): an MTP head of the
target's layer shapes and a 5-layer DFlash drafter of its width (block 16). Engines are built
by `build_engine` as `ninfer serve` builds them (EngineOptions spec "mtp" / "dflash",
draft_tokens, lm_head_draft), so the drafters run on the plan, executor and kernels that serve.
Each engine prefills one sequence of `--context` random tokens on its executor and hands the
captured hidden rows to the drafter through the speculator's `observe`, as the engine does
after every target step. Then, per engine, timed:

  decode   `executor.run` of one decode row (position `context`) on a plain engine (no
           --spec, so no hidden-state capture): the denominator of every ratio
  mtp      `drafter.propose` of that row with k = 1, 2, 3: the head re-runs the tip position
           (one target row, as a round after no accepted draft) and k - 1 positions of its own
           output, each with the LM head (full, or the reduced one of --lm-head-draft); and
           k = 3 after 2 accepted drafts (rows "k=3, a=2"): before each such call, untimed,
           the target computes the fed token and 2 drafts and the committed tokens grow by
           those and a bonus token (as a verify step that accepted 2), so the head's first
           step is those 3 positions
  dflash   `drafter.propose` with k = 7 and 15: one forward of the 5 layers over the block of
           16 positions against the context K/V of the `context` positions, and the LM head on
           the k drafted positions

Not timed: `observe` (MTP keeps the rows; DFlash computes the context K/V of the k + 1
verified rows, a fraction of a round) and the verify forward (bench/spec_verify.py).
Each figure is the median of `--repeats` calls after two warm-up calls (the first catches the
drafter up over the prompt), timed with the host clock around the call and a device sync,
which is what a round costs the engine loop; all in one process. The issue's H200 targets
(Qwen3-8B, bf16) are in the table's last column.

`--heads full` or `--heads draft` times only the drafters with the full LM head or only those
with --lm-head-draft. One process per (drafter, head) is what a server runs; in one process
the later engines' rounds ran slower on the H200 (the first engine's DFlash round 0.98 ms,
the same round after three MTP engines 1.07 ms), so each figure is best taken alone.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

from ninfer.bench.synthetic import build_synthetic
from ninfer.bench.timing import timed
from ninfer.runtime.build import build_engine
from ninfer.runtime.config import EngineOptions
from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.request import SamplingParams
from ninfer.runtime.step import SeqChunk, StepBatch
from ninfer.spec.drafter import DraftRow

PAGE = 16
ACCEPTED = 2  # the MTP round timed after that many accepted drafts
# (drafter, --lm-head-draft) -> (the k timed, the target ratio per drafted token (MTP)
# or per round (DFlash))
CASES: dict[tuple[str, bool], tuple[tuple[int, ...], float]] = {
    ("mtp", False): ((1, 2, 3), 0.12),
    ("mtp", True): ((1, 2, 3), 0.06),
    ("dflash", False): ((7, 15), 0.25),
    ("dflash", True): ((7, 15), 0.15),
}


class Rig:
    """An engine of `source` (spec None: plain) with one sequence of `prompt` in its KV pages,
    its hidden rows handed to the drafter as the engine hands them."""

    def __init__(
        self, source: Any, device: str, prompt: list[int], next_id: int, grow: int = 0, **spec: Any
    ):
        ctx = -(-(len(prompt) + 32 + grow) // PAGE) * PAGE  # grow: tokens `accept` may add
        # batch 1: one lane (and so few CUDA Graph buckets to capture per engine)
        options = EngineOptions.of(
            device=device, max_concurrency=1, max_context=ctx, kv_capacity=ctx + 2 * PAGE,
            page_size=PAGE, prefill_chunk=max(1024, len(prompt)), prefix_reuse=False, **spec,
        )  # fmt: skip
        self.engine = build_engine(source, options)
        self.ex = self.engine.executor
        self.table = tuple(range(ctx // PAGE))
        self.context = len(prompt)
        self.next_id = next_id
        batch = StepBatch((SeqChunk(0, tuple(prompt), 0, self.table),))
        self.ex.run(batch)
        self.spec = self.engine.speculator
        if self.spec is not None:
            self.spec.observe(batch, self.ex)  # as the engine, after every target step
        self.tokens = (*prompt, next_id)  # committed: the last is the one the target computes
        self.sampler = Sampler()
        # a request's sampling, made once as the engine's (a round reuses the request's own)
        self.params = SamplingParams(temperature=0.0)

    def close(self) -> None:
        self.engine.close()

    def decode(self) -> torch.Tensor:
        chunk = SeqChunk(0, (self.next_id,), self.context, self.table)
        return self.ex.run(StepBatch((chunk,)))

    def accept(self, a: int) -> None:
        """The state after a verify step that accepted `a` drafts: the target computes the
        fed token and the `a` drafts, the drafter observes their rows, and the committed
        tokens grow by the drafts and a bonus token (arbitrary ids)."""
        n = len(self.tokens) - 1
        vocab = int(self.ex.plan.model["vocab"])
        new = tuple((self.tokens[-1] * 7 + 11 * (i + 1)) % vocab for i in range(a + 1))
        batch = StepBatch((SeqChunk(0, (self.tokens[-1], *new[:a]), n, self.table),))
        self.ex.run(batch)
        self.spec.observe(batch, self.ex)
        self.tokens = (*self.tokens, *new)

    def propose(self, k: int) -> None:
        row = DraftRow(0, self.tokens, self.context, k, self.params)
        (draft,) = self.spec.drafter.propose([row], self.sampler)
        if len(draft.tokens) != k:  # a round that drafted less than asked measures nothing
            raise RuntimeError(f"{self.spec.name} drafted {len(draft.tokens)} tokens, not {k}")


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per (drafter, lm_head_draft, k), plus the decode step first."""
    source, hf = build_synthetic(
        args.synthetic, args.weights, args.device, seed=0, drafters=("mtp", "dflash")
    )
    del hf  # the transformers model is not used; its weights are the source's
    vocab = int(source.config["vocab_size"])
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, vocab, (args.context,), generator=g).tolist()
    next_id = int(torch.randint(0, vocab, (1,), generator=g))
    plain = Rig(source, args.device, prompt, next_id)
    base = timed(plain.decode, args.repeats)
    plain.close()
    rows = [{"drafter": "decode step", "k": 1, "ms": base * 1e3, "ratio": 1.0, "per": 1.0}]
    for (name, lm_head), (ks, target) in CASES.items():
        if name not in args.drafters or ("draft" if lm_head else "full") not in args.heads:
            continue
        grow = (args.repeats + 2) * (ACCEPTED + 1) if name == "mtp" else 0
        rig = Rig(source, args.device, prompt, next_id, grow, spec=name, draft_tokens=max(ks),
                  lm_head_draft=lm_head)  # fmt: skip
        label = name + (" --lm-head-draft" if lm_head else "")
        runs = [(k, k, None) for k in ks]
        if name == "mtp":  # k = 3 after 2 accepted drafts (module docstring)
            runs.append((f"{max(ks)}, a={ACCEPTED}", max(ks), lambda rig=rig: rig.accept(ACCEPTED)))
        for shown, k, setup in runs:
            t = timed(lambda rig=rig, k=k: rig.propose(k), args.repeats, setup)
            per = t / base / (k if name == "mtp" else 1)
            rows.append({"drafter": label, "k": shown, "ms": t * 1e3, "ratio": t / base,
                         "per": per, "target": target})  # fmt: skip
            print(f"{label} k={shown}: {t * 1e3:.3f} ms", file=sys.stderr)
        rig.close()
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown table: per MTP row the ratio per drafted token, per DFlash row per round
    (what the targets bound)."""
    out = [
        "| drafter | k | ms per round | of a decode step | per drafted token | target |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        per = f"{r['per']:.3f}" if r["drafter"].startswith("mtp") else "-"
        target = "-"
        if "target" in r:
            unit = "per drafted token" if r["drafter"].startswith("mtp") else "per round"
            ok = "met" if r["per"] <= r["target"] else "missed"
            target = f"<= {r['target']:.2f} {unit} ({ok})"
        out.append(
            f"| {r['drafter']} | {r['k']} | {r['ms']:.3f} | {r['ratio']:.3f} | {per} | {target} |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synthetic", default="qwen3-8b")
    ap.add_argument("--weights", default="bf16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument(
        "--drafters", default="mtp,dflash", help="which drafters to time (comma-separated)"
    )
    ap.add_argument(
        "--out", default=None, help="also write the markdown report here (and its rows as .json)"
    )
    ap.add_argument(
        "--heads", default="full,draft",
        help="full: the drafters with the full LM head; draft: with --lm-head-draft",
    )  # fmt: skip
    args = ap.parse_args(argv)
    args.heads = tuple(h.strip() for h in args.heads.split(",") if h.strip())
    if not args.heads or set(args.heads) - {"full", "draft"}:
        ap.error(f"--heads: {','.join(args.heads) or 'none given'}; choose from full, draft")
    if args.context < 1 or args.repeats < 1:
        ap.error("--context and --repeats must be at least 1")
    args.drafters = tuple(d.strip() for d in args.drafters.split(",") if d.strip())
    unknown = sorted(set(args.drafters) - {name for name, _ in CASES})
    if unknown or not args.drafters:
        ap.error(f"--drafters: unknown {', '.join(unknown) or 'none given'} (mtp, dflash)")
    rows = measure(args)
    if not all(math.isfinite(r["ratio"]) and r["ratio"] > 0 for r in rows):
        raise RuntimeError(f"a drafter's time is not a positive finite figure: {rows}")
    cmd = " ".join(sys.argv[1:] if argv is None else argv)
    lines = [
        f"# Drafter cost per round: synthetic {args.synthetic}, {args.weights}, {args.device}",
        "",
        f"Command: `python bench/spec_drafters.py {cmd}`",
        (
            f"Context {args.context} tokens, batch 1, median of {args.repeats} calls each;"
            f" ratios to the plain decode step ({rows[0]['ms']:.3f} ms). Targets: the issue's"
            " for Qwen3-8B bf16 on an H200 (met / missed says how this run compares)."
        ),
        "",
        *table(rows),
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report)
        meta = {"command": f"python bench/spec_drafters.py {cmd}", "context": args.context,
                "repeats": args.repeats, "synthetic": args.synthetic, "weights": args.weights}  # fmt: skip
        Path(args.out).with_suffix(".json").write_text(
            json.dumps({"meta": meta, "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
