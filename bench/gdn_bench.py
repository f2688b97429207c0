# ruff: noqa: B023  (each lambda is timed before the loop moves on)
"""Gated DeltaNet prefill on CUDA: the chunked kernel (kernels/gdn_chunk.py) against the
token-by-token recurrent one (kernels/gdn_recurrent.py), at Qwen3.5-9B's DeltaNet shapes
(16 key / 32 value heads of 128), for one sequence of T tokens; and, when the `fla-core`
package is importable, its chunked `chunk_gated_delta_rule` (q and k repeated to the value heads,
as transformers' Qwen3.5 does before calling it).

    python3 bench/gdn_bench.py [--lens 16,64,256,1024,4096]

Prints, per T, both kernels' median times (triton.testing.do_bench) and the largest difference
of their outputs and final states. The executor switches to the chunked kernel for chunks of at
least ninfer.runtime.cuda_ops.GDN_CHUNK_MIN_TOKENS tokens; this run is where that number comes
from.
"""

from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench

from kernels.gdn_chunk import gated_delta_rule_chunked
from kernels.gdn_recurrent import gated_delta_rule_recurrent

try:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
except ImportError:
    chunk_gated_delta_rule = None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lens", default="16,32,64,128,256,1024,4096")
    args = p.parse_args()
    hk, hv, d = 16, 32, 128
    head = f"{'T':>6} {'recurrent ms':>13} {'chunked ms':>11} {'speed-up':>9} {'max |do|':>9} {'max |dS|':>9}"
    if chunk_gated_delta_rule is not None:
        head += f" {'fla ms':>8} {'fla |do|':>9} {'fla |dS|':>9}"
    print(head)
    for T in (int(x) for x in args.lens.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(T)
        q = torch.randn(T, hk, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(T, hk, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(T, hv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        g = -torch.rand(T, hv, device="cuda", generator=gen) * 0.1
        beta = torch.rand(T, hv, device="cuda", generator=gen).to(torch.bfloat16)
        s0 = torch.randn(1, hv, d, d, device="cuda", generator=gen) * 0.1
        cu = torch.tensor([0, T], dtype=torch.int32, device="cuda")
        s_rec, s_chk = s0.clone(), s0.clone()
        o_rec = gated_delta_rule_recurrent(q, k, v, g, beta, s_rec, cu, scale=d**-0.5)
        o_chk = gated_delta_rule_chunked(q, k, v, g, beta, s_chk, cu, scale=d**-0.5)
        do = (o_rec.float() - o_chk.float()).abs().max().item()
        ds = (s_rec - s_chk).abs().max().item()
        s = s0.clone()
        t_rec = do_bench(lambda: gated_delta_rule_recurrent(q, k, v, g, beta, s, cu, scale=d**-0.5))
        t_chk = do_bench(lambda: gated_delta_rule_chunked(q, k, v, g, beta, s, cu, scale=d**-0.5))
        line = f"{T:6d} {t_rec:13.3f} {t_chk:11.3f} {t_rec / t_chk:8.2f}x {do:9.2e} {ds:9.2e}"
        if chunk_gated_delta_rule is not None:
            r = hv // hk
            qr, kr = (x.repeat_interleave(r, dim=1)[None] for x in (q, k))
            cu64 = cu.long()

            def fla() -> tuple[torch.Tensor, torch.Tensor]:
                return chunk_gated_delta_rule(
                    qr, kr, v[None], g[None], beta[None], scale=d**-0.5, initial_state=s0,
                    output_final_state=True, cu_seqlens=cu64, use_qk_l2norm_in_kernel=True,
                )  # fmt: skip

            o_fla, s_fla = fla()
            dof = (o_rec.float() - o_fla[0].float()).abs().max().item()
            dsf = (s_rec - s_fla).abs().max().item()
            line += f" {do_bench(fla):8.3f} {dof:9.2e} {dsf:9.2e}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
