# ruff: noqa: B023  (each closure is timed before the loop moves on)
"""Gated DeltaNet prefill on CUDA: the token-by-token recurrent kernel (kernels/gdn_recurrent.py)
against the chunked `chunk_gated_delta_rule` of the `fla-core` package (q and k repeated to the
value heads, as transformers' Qwen3.5 does before calling it), at Qwen3.5-9B's DeltaNet shapes
(16 key / 32 value heads of 128), for one sequence of T tokens.

    python3 bench/gdn_bench.py [--lens 16,64,256,1024,4096]

Prints, per T, both kernels' median times (triton.testing.do_bench) and the largest difference
of their outputs and final states. The executor switches to fla for chunks of at least
ninfer.runtime.executors.cuda.ops.GDN_CHUNKED_MIN_TOKENS tokens when it is installed; this run is where
that number comes from. (A chunked kernel of our own, WY form in three Triton kernels, measured
10x slower than the recurrent one here and was removed: bench/results/HISTORY.md, `h200/gdn_bench.txt`.)
"""

from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench

from kernels.gdn_recurrent import gated_delta_rule_recurrent

try:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
except ImportError:
    chunk_gated_delta_rule = None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lens", default="64,256,1024,4096")
    args = p.parse_args()
    if chunk_gated_delta_rule is None:
        raise SystemExit("fla-core is not installed: nothing to compare the recurrent kernel with")
    hk, hv, d = 16, 32, 128
    print(
        f"{'T':>6} {'recurrent ms':>13} {'fla ms':>8} {'speed-up':>9} {'max |do|':>9} {'max |dS|':>9}"
    )
    for T in (int(x) for x in args.lens.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(T)
        q = torch.randn(T, hk, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(T, hk, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(T, hv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        g = -torch.rand(T, hv, device="cuda", generator=gen) * 0.1
        beta = torch.rand(T, hv, device="cuda", generator=gen).to(torch.bfloat16)
        s0 = torch.randn(1, hv, d, d, device="cuda", generator=gen) * 0.1
        cu = torch.tensor([0, T], dtype=torch.int32, device="cuda")
        qr, kr = (x.repeat_interleave(hv // hk, dim=1)[None] for x in (q, k))
        s_rec = s0.clone()

        def recurrent() -> torch.Tensor:
            return gated_delta_rule_recurrent(q, k, v, g, beta, s_rec, cu, scale=d**-0.5)

        def fla() -> tuple[torch.Tensor, torch.Tensor]:
            return chunk_gated_delta_rule(
                qr, kr, v[None], g[None], beta[None], scale=d**-0.5, initial_state=s0,
                output_final_state=True, cu_seqlens=cu.long(), use_qk_l2norm_in_kernel=True,
            )  # fmt: skip

        o_rec = recurrent()
        o_fla, s_fla = fla()
        do = (o_rec.float() - o_fla[0].float()).abs().max().item()
        ds = (s_rec - s_fla).abs().max().item()
        t_rec, t_fla = do_bench(recurrent), do_bench(fla)
        print(
            f"{T:6d} {t_rec:13.3f} {t_fla:8.3f} {t_rec / t_fla:8.2f}x {do:9.2e} {ds:9.2e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
