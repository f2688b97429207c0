"""A folded RMSNorm input whose f16 copy overflows, shared by the fp8 and nvfp4 tensor-core GEMV
tests of the fp32 fallback."""

from __future__ import annotations

import torch

from kernels.folded_norm import NORM_STATS, NormedX


def overflowing_normed_x(s: torch.Tensor) -> NormedX:
    """s [1, H] bf16 with s[0, 7] set to 3e5 (in place) and a 0.75 gain: u = f16(s * gain)
    holds inf, and the producer's sum of s² sits in one of the partial-sum slots. The input's
    projection is that of rmsnorm(s, gain, eps=1e-6)."""
    s[0, 7] = 3.0e5
    g = torch.full((s.shape[1],), 0.75, dtype=torch.bfloat16, device=s.device)
    u = (s.float() * g.float()).half()
    assert torch.isinf(u).any()
    stats = torch.zeros(NORM_STATS, dtype=torch.float32, device=s.device)
    stats[3] = s.float().pow(2).sum()
    return NormedX(s, u, g, False, stats, 1e-6)
