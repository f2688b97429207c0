"""An RMSNorm split between the two projections around it (ninfer/passes/fuse_norm_linear.py).

The projection before the norm adds the residual in its epilogue and leaves what the norm needs
(`ResidualNorm`): s = residual + y, u = f16(s * gain) and its programs' sums of s² in
NORM_STATS partial sums; the projection after it takes that as its input (`NormedX`) and scales
its row sums by 1 / sqrt(sum / K + eps). kernels/fp8_mma.py implements both ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NORM_STATS = 32  # partial sums of s² a residual-add epilogue leaves (program % NORM_STATS)


@dataclass(frozen=True)
class NormedX:
    """rmsnorm(s) * gain as the projection after it reads it, the norm left for that projection
    to finish (the producer, a projection with a `ResidualNorm` epilogue, wrote s and u):
    s [1, K] (bf16), u = f16(s * gain) [1, K], the gain [K] (applied as 1 + gain when
    zero-centred), and ``stats``, fp32 [NORM_STATS] partial sums of s² (their total is the
    sum). The consumer scales its row sums by 1 / sqrt(sum / K + eps)."""

    s: torch.Tensor
    u: torch.Tensor
    gain: torch.Tensor
    zero_centered: bool
    stats: torch.Tensor
    eps: float

    def materialize(self) -> torch.Tensor:
        """The normalised input itself (for a consumer that cannot fold the norm in)."""
        from kernels.rmsnorm import rmsnorm

        return rmsnorm(self.s, self.gain, self.eps, zero_centered=self.zero_centered)[0]


@dataclass(frozen=True)
class ResidualNorm:
    """The epilogue of a projection whose output y joins the residual stream right before an
    RMSNorm: s = residual + y (as a separate add would round it), u = f16(s * gain), and the
    partial sums of s² added into ``stats`` (fp32 [NORM_STATS], zero before the launch)."""

    residual: torch.Tensor
    gain: torch.Tensor
    zero_centered: bool
    stats: torch.Tensor


def check_norm_parts(u, gain, stats, n: int, x: torch.Tensor) -> None:
    """What the kernels read of a folded norm: u f16 [1, n], the gain [n] in x's dtype, the
    partial sums contiguous fp32 [NORM_STATS]."""
    assert u.shape == (1, n) and u.dtype == torch.float16 and u.stride(-1) == 1, u.shape
    assert gain.shape == (n,) and gain.stride(0) == 1 and gain.dtype == x.dtype, gain.shape
    ok = stats.shape == (NORM_STATS,) and stats.dtype == torch.float32 and stats.is_contiguous()
    assert ok, (
        f"stats must be contiguous fp32 [{NORM_STATS}], got {stats.dtype} {tuple(stats.shape)}"
    )
