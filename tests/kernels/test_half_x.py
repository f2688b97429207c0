"""`HalfX`: the SwiGLU epilogue of the tensor-core GEMV writes the activation's f16 copy too
(``half_out``), and the next GEMV reads that copy instead of converting bf16 x in its K loop.
Same results as the bf16 input, to the bit, fp8 and nvfp4 (the fp32 path included)."""

from __future__ import annotations

import json

import pytest
import torch

from kernels.compile_check import run_fresh
from kernels.folded_norm import NORM_STATS, HalfX, ResidualNorm
from kernels.fp8_mma import Fp8MmaConfig, fp8_mma
from kernels.nvfp4_mma import prepare
from kernels.quant_gemm import quantize_weight_fp8, quantize_weight_nvfp4

_COMPILE_CHECK = """
import json
from kernels.fp8_mma import Fp8MmaConfig, compile_fp8_mma
out = []
for fp4 in (False, True):
    for half in (False, True):
        ptx = compile_fp8_mma(Fp8MmaConfig(4, 2), glu=False, even=True, fp4=fp4, residual=True,
                              half=half, row_words=512 if fp4 else 1024).asm["ptx"]
        out.append(ptx.count("cvt.rn.f16x2.f32"))
print(json.dumps(out))
"""


def test_half_input_has_no_conversion_in_the_kernel() -> None:
    """Compiled for sm_90 (no GPU needed): with a `HalfX` input the kernel converts no x to f16
    (a bf16 input does, in its K loop), fp8 and nvfp4."""
    pytest.importorskip("triton.backends.nvidia")
    fp8_bf16, fp8_half, fp4_bf16, fp4_half = json.loads(run_fresh(_COMPILE_CHECK))
    assert fp8_bf16 > 0 and fp4_bf16 > 0
    assert fp8_half == fp4_half == 0


def _weight(fmt: str, N: int, K: int, device: str, seed: int):
    """(w, scale) as fp8_mma takes them: fp8 bytes and row scales, or the repacked nvfp4 copy."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    w = (torch.randn(N, K, generator=g) * 0.05).to(device)
    if fmt == "fp8":
        return quantize_weight_fp8(w)
    return prepare(*quantize_weight_nvfp4(w)), None


def _x(K: int, device: str, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(1, K, generator=g).to(device=device, dtype=torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize(
    "cfg", [Fp8MmaConfig(2, 1), Fp8MmaConfig(4, 2), Fp8MmaConfig(8, 4)], ids=str
)
@pytest.mark.parametrize("I,H", [(96, 512), (6144, 4096), (160, 1056)])
def test_half_hand_off_equals_the_bf16_one(device, fmt, cfg, I, H) -> None:
    """gate/up ([2I, H]) with ``half_out`` writes the same activation as without, and its exact
    f16 copy; down ([H, I]) from that `HalfX` equals down from the bf16 activation, plain and
    with the residual-norm epilogue (K not a multiple of the chunk: the masked path)."""
    gu, gs = _weight(fmt, 2 * I, H, device, seed=I)
    dn, ds = _weight(fmt, H, I, device, seed=H)
    x = _x(H, device, seed=1)
    act = fp8_mma(x, gu, gs, cfg, swiglu_out=True)
    y, u = fp8_mma(x, gu, gs, cfg, swiglu_out=True, half_out=True)
    assert torch.equal(y, act) and torch.equal(u, act.half())
    assert torch.equal(fp8_mma(HalfX(y, u), dn, ds, cfg), fp8_mma(act, dn, ds, cfg))
    r = _x(H, device, seed=2)
    gain = torch.rand(H, generator=torch.Generator().manual_seed(3)).to(device, torch.bfloat16)
    outs = []
    for inp in (act, HalfX(y, u)):
        stats = torch.zeros(NORM_STATS, dtype=torch.float32, device=device)
        res = ResidualNorm(r, gain, False, stats)
        outs.append((*fp8_mma(inp, dn, ds, cfg, residual=res), stats))
    (s1, u1, st1), (s2, u2, st2) = outs
    assert torch.equal(s1, s2) and torch.equal(u1, u2)
    # the programs add their sums of s² with atomics, in no fixed order
    torch.testing.assert_close(st1, st2, rtol=1e-5, atol=0.0)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_half_input_beyond_f16_recomputed(device, fmt) -> None:
    """An activation f16 cannot hold is inf in the copy: the rows go to the fp32 path, which
    reads the bf16 x, as they do from a bf16 input."""
    dn, ds = _weight(fmt, 64, 1024, device, seed=5)
    act = _x(1024, device, seed=6)
    act[0, 9] = 2.0e5
    u = act.half()
    assert torch.isinf(u).any()
    y = fp8_mma(HalfX(act, u), dn, ds, Fp8MmaConfig(4, 2))
    assert torch.isfinite(y).all()
    assert torch.equal(y, fp8_mma(act, dn, ds, Fp8MmaConfig(4, 2)))
