# ruff: noqa: B023  (each lambda is timed before the loop moves on)
"""The DFlash drafter's block attention (kernels/block_attention.py) per key-range count.

    python -m bench.block_attention_splits [--out DIR]

A block of 16 query rows per sequence, Qwen3-8B heads (32 query, 8 KV, head dim 128), bf16,
1 and 4 sequences over contexts of 512, 2048 and 8192 keys: the time of one launch (split and
combine) under CUDA-graph replay for 1, 2, 4, 8 and 16 ranges, and the count `block_splits`
picks. Writes block_attention_splits_h200.{json,md} to --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from triton.testing import do_bench_cudagraph

from kernels.block_attention import block_attention, block_splits

BLOCK, HEADS, KV_HEADS, HEAD_DIM = 16, 32, 8, 128
SPLITS = (1, 2, 4, 8, 16)
CALLS = 20  # launches per replay: one launch is a few microseconds


def measure(ctx: int, batch: int) -> dict:
    k = torch.randn(batch, BLOCK + ctx, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(batch * BLOCK, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    lengths = torch.full((batch,), ctx, device="cuda", dtype=torch.int64)
    us = {}
    for sp in SPLITS:

        def run():
            for _ in range(CALLS):
                block_attention(q, k, v, lengths, BLOCK, scale=HEAD_DIM**-0.5, splits=sp)

        us[sp] = do_bench_cudagraph(run, rep=30) / CALLS * 1e3
    chosen = block_splits(BLOCK + ctx, batch * KV_HEADS)
    return {"context": ctx, "batch": batch, "us": us, "chosen": chosen}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    rows = [measure(ctx, b) for ctx in (512, 2048, 8192) for b in (1, 4)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.cuda.get_device_name()
    (out / "block_attention_splits_h200.json").write_text(
        json.dumps({"device": dev, "rows": rows}, indent=1)
    )
    lines = [
        f"# Block attention per key-range count: {dev}",
        "",
        "Command: `python -m bench.block_attention_splits`. Microseconds per launch (split and",
        (
            f"combine), a block of {BLOCK} rows per sequence, {HEADS} query / {KV_HEADS} KV "
            f"heads, head dim {HEAD_DIM}, bf16; 'chosen' is block_splits' count."
        ),
        "",
        "| context | sequences | " + " | ".join(f"{s} ranges" for s in SPLITS) + " | chosen |",
        "| --- | --- | " + " | ".join("---" for _ in SPLITS) + " | --- |",
    ]
    for r in rows:
        best = min(r["us"].values())
        cells = [f"**{t:.1f}**" if t == best else f"{t:.1f}" for t in r["us"].values()]
        lines.append(
            f"| {r['context']} | {r['batch']} | " + " | ".join(cells) + f" | {r['chosen']} |"
        )
    text = "\n".join(lines) + "\n"
    (out / "block_attention_splits_h200.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
