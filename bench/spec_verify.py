"""What a speculative round costs on this device, measured on the executor that serves.

    python bench/spec_verify.py [--synthetic qwen3-8b] [--weights bf16] [--context 512]
                                [--repeats 50] [--out bench/results/spec_verify.md]

Speculative decoding pays off when  tau / (verify ratio + draft ratio) > 1, where tau is the
mean number of tokens a round commits, the verify ratio is the cost of the target forward
over the k+1 verified positions divided by a plain one-token decode step, and the draft ratio
is the drafter's cost per round over that same decode step. This script measures the two
ratios for random weights of a real shape (nothing can be downloaded to the GPU machine), on
the plan, executor and kernels `ninfer serve` uses:

verify, two ways (the same k+1 tokens of one sequence at positions P..P+k):
  rows   k+1 one-token rows of the same sequence in one decode step (the rows share the block
         table; row i attends to positions <= P+i, whose KV rows 0..i write earlier in the same
         layer): the decode kernels and the CUDA Graph bucket of k+1 rows. Its logits are checked
         against k+1 sequential decode steps.
  chunk  one chunk of k+1 tokens with every position's logits: the prefill path (eager).
drafters, as synthetic models of the target's width (ratios to the target's decode step):
  mtp        one decoder layer + the LM head, one decode step per drafted token (an MTP head
             re-run N times; its extra input projection is left out)
  dflash     five decoder layers over a block of k+1 positions in one forward (rows), plus the
             LM head on each
  `--lm-head-draft` variants of both: the head reduced to the 32,768 most frequent tokens
             (the size FR-Spec uses).

Each figure is the median of `--repeats` timed runs (host clock around the step with a device
sync, which is what a round costs the engine loop), all in one process.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from ninfer.bench.synthetic import build_synthetic
from ninfer.bench.timing import timed
from ninfer.runtime.build import build_engine
from ninfer.runtime.config import EngineOptions
from ninfer.runtime.step import SeqChunk, StepBatch

PAGE = 16
DRAFT_VOCAB = 32768  # the reduced head size FR-Spec uses


class Rig:
    """One synthetic model behind the serving executor, with one sequence of `context`
    prompt tokens already in its KV pages."""

    def __init__(self, name: str, weights: str, device: str, context: int, **overrides: Any):
        source, _ = build_synthetic(name, weights, device, seed=0, overrides=overrides)
        ctx = -(-(context + 32) // PAGE) * PAGE
        options = EngineOptions.of(
            device=device, max_concurrency=8, max_context=ctx, kv_capacity=ctx + 8 * PAGE,
            page_size=PAGE, prefill_chunk=max(1024, context), prefix_reuse=False,
        )  # fmt: skip
        self.engine = build_engine(source, options)
        self.ex = self.engine.executor
        self.vocab = int(self.engine.plan.model["vocab"])
        self.context = context
        self.table = tuple(range(ctx // PAGE))
        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(0, self.vocab, (context,), generator=g).tolist()
        self.ex.run(StepBatch((SeqChunk(0, tuple(prompt), 0, self.table),)))
        self.next_ids = torch.randint(0, self.vocab, (8,), generator=g).tolist()

    def close(self) -> None:
        self.engine.close()

    def decode(self, pos_offset: int = 0, token: int | None = None) -> torch.Tensor:
        t = self.next_ids[0] if token is None else token
        chunk = SeqChunk(0, (t,), self.context + pos_offset, self.table)
        return self.ex.run(StepBatch((chunk,)))

    def rows(self, n: int) -> torch.Tensor:
        chunks = tuple(
            SeqChunk(0, (self.next_ids[i],), self.context + i, self.table) for i in range(n)
        )
        return self.ex.run(StepBatch(chunks))

    def chunk(self, n: int) -> torch.Tensor:
        c = SeqChunk(0, tuple(self.next_ids[:n]), self.context, self.table)
        return self.ex.run(StepBatch((c,)), all_logits=True)


def rows_match_sequential(rig: Rig, n: int) -> float:
    """Largest |difference| between the logits of n verify rows and n sequential decode steps
    (relative to the logits' scale)."""
    together = rig.rows(n).float()
    alone = torch.cat([rig.decode(i, rig.next_ids[i]).float() for i in range(n)])
    return float((together - alone).abs().max() / alone.abs().max())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synthetic", default="qwen3-8b")
    ap.add_argument("--weights", default="bf16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out", default=None, help="also write the markdown report here")
    args = ap.parse_args(argv)
    lines = [
        f"# Speculative round costs: synthetic {args.synthetic}, {args.weights}, {args.device}",
        "",
        f"Command: `python bench/spec_verify.py {' '.join(sys.argv[1:] if argv is None else argv)}`",
        f"Context {args.context} tokens, batch 1, median of {args.repeats} steps each.",
        "",
    ]
    target = Rig(args.synthetic, args.weights, args.device, args.context)
    base = timed(target.decode, args.repeats)
    lines += [
        f"Plain decode step: {base * 1e3:.3f} ms",
        "",
        "| k+1 | verify rows (ms) | ratio | verify chunk (ms) | ratio | rows vs sequential |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for n in (2, 3, 4, 5, 8):
        r = timed(lambda n=n: target.rows(n), args.repeats)
        c = timed(lambda n=n: target.chunk(n), args.repeats)
        err = rows_match_sequential(target, n)
        lines.append(
            f"| {n} | {r * 1e3:.3f} | {r / base:.3f} | {c * 1e3:.3f} | {c / base:.3f} | {err:.1e} |"
        )
    target.close()
    lines += ["", "| drafter | per round (ms) | of a decode step |", "| --- | --- | --- |"]
    for label, layers, vocab, block in (
        ("mtp, per drafted token", 1, None, 1),
        ("mtp --lm-head-draft, per drafted token", 1, DRAFT_VOCAB, 1),
        ("dflash, 5 layers, block 8", 5, None, 8),
        ("dflash --lm-head-draft, 5 layers, block 8", 5, DRAFT_VOCAB, 8),
    ):
        over: dict[str, Any] = {"num_hidden_layers": layers}
        if vocab:
            over["vocab_size"] = vocab
        rig = Rig(args.synthetic, args.weights, args.device, args.context, **over)
        t = timed((lambda rig=rig, block=block: rig.rows(block)), args.repeats)
        rig.close()
        lines.append(f"| {label} | {t * 1e3:.3f} | {t / base:.3f} |")
        print(lines[-1], file=sys.stderr)
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
