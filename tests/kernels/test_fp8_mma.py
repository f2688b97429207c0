from __future__ import annotations

import json

import pytest
import torch

from kernels import fp8_mma as fp8_mma_mod
from kernels.compile_check import run_fresh
from kernels.fp8_gemv import fp8_gemv_reference
from kernels.fp8_mma import Fp8MmaConfig, fp8_mma, fp8_mma_config, usable
from kernels.quant_gemm import quant_linear, quantize_weight_fp8
from tests.kernels.norm_inputs import overflowing_normed_x

_COMPILE_CHECK = """
import json
from kernels.compile_check import loop_stats
from kernels.fp8_mma import Fp8MmaConfig, compile_fp8_mma
out = []
for cfg, glu in [(Fp8MmaConfig(8, 4), False), (Fp8MmaConfig(4, 2), True)]:
    ptx = compile_fp8_mma(cfg, glu=glu, even=False).asm["ptx"]
    st = loop_stats(ptx, 0)._asdict()
    st["mma"] = ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")
    st["cvt"] = ptx.count("cvt.rn.f16x2.e4m3x2")
    out.append(st)
print(json.dumps(out))
"""


def test_fp8_mma_compiles_for_sm90() -> None:
    """Compiled for sm_90 (no GPU needed), the K loop issues only 16-byte loads (BN weight rows,
    two of x, twice that with GLU), converts e4m3 pairs with cvt.rn.f16x2.e4m3x2 and feeds f16
    mma.sync without moving data through shared memory."""
    pytest.importorskip("triton.backends.nvidia")
    plain, glu2 = json.loads(run_fresh(_COMPILE_CHECK))
    # BN 8 weight rows + x pairs 0..3 and 4..7 of one row
    assert plain["loads_16b"] == plain["loads"] == 8 + 2
    # BN 4 rows + 2 halves x (gate, up)
    assert glu2["loads_16b"] == glu2["loads"] == 4 + 2 * 2
    for st in (plain, glu2):
        assert st["shared"] == st["barriers"] == st["shuffles"] == 0, st
        assert st["mma"] > 0 and st["cvt"] > 0, st


def test_fp8_mma_off_in_the_interpreter() -> None:
    """No tensor-core path where the interpreter runs the kernels, nor for x it cannot take."""
    if torch.cuda.is_available():
        pytest.skip("checks the CPU interpreter")
    assert fp8_mma_config(4096, 4096, 1) is None
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    assert not usable(x, torch.zeros(8, 64, dtype=torch.uint8))


def test_table_fields(tmp_path) -> None:
    """A table entry is [bn, warps, per_sm] with an optional register cap (maxnreg)."""
    from kernels.gemv import load_table

    p = tmp_path / "t.json"
    p.write_text('{"4096:12288:0": {"1": [8, 4, 0]}, "4096:4096:0": {"1": [4, 4, 0, 64]}}')
    t = load_table(p, fp8_mma_mod._config_type)
    assert t[(4096, 12288, False, 1)] == Fp8MmaConfig(8, 4, 0, 0)
    assert t[(4096, 4096, False, 1)] == Fp8MmaConfig(4, 4, 0, 64)


def _weight(N: int, K: int, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.05
    q, s = quantize_weight_fp8(w.to(device))
    return q, s


def _x(M: int, K: int, device: str, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(M, K, generator=g).to(device=device, dtype=torch.bfloat16)


def _close(y: torch.Tensor, ref: torch.Tensor) -> None:
    torch.testing.assert_close(
        y.float(), ref.float(), rtol=1e-2, atol=1e-2 * float(ref.float().abs().max())
    )


@pytest.mark.gpu
@pytest.mark.parametrize("glu", [False, True])
@pytest.mark.parametrize(
    "cfg",
    [Fp8MmaConfig(2, 1), Fp8MmaConfig(4, 2), Fp8MmaConfig(8, 4), Fp8MmaConfig(8, 8)],
    ids=str,
)
@pytest.mark.parametrize("N,K", [(96, 512), (100, 1000), (37, 4100), (6144, 4096)])
def test_fp8_mma_matches_reference(device, glu, cfg, N, K) -> None:
    """Ragged shapes too: N not a multiple of the rows per block, K not of the chunk (words past
    K masked); programs looping over several blocks (per_sm) and one per block."""
    q, s = _weight(N, K, device, seed=N + K)
    x = _x(1, 2 * K if glu else K, device, seed=1)
    _close(fp8_mma(x, q, s, cfg, glu=glu), fp8_gemv_reference(x, q, s, glu=glu))


@pytest.mark.gpu
@pytest.mark.parametrize("glu", [False, True])
def test_fp8_mma_large_x_recomputed_exactly(device, glu) -> None:
    """x values f16 cannot hold (|x| >= 65504) send the rows to the fp32 path: the result
    equals the reference, also for rows whose weight there is zero (0 * inf is NaN on the
    tensor cores, 0 in the reference); a NaN in x gives NaN rows, as the reference does."""
    N, K = 64, 1024
    q, s = _weight(N, K, device, seed=3)
    q[::3, 5] = 0  # e4m3 zero where x[5] overflows f16
    x = _x(1, 2 * K if glu else K, device, seed=4)
    x[0, 5] = 3.0e5
    x[0, K + 7 if glu else 7] = -1.0e6
    ref = fp8_gemv_reference(x, q, s, glu=glu)
    y = fp8_mma(x, q, s, Fp8MmaConfig(8, 2), glu=glu)
    assert torch.isfinite(y).all()
    _close(y, ref)
    x[0, 9] = float("nan")
    assert torch.isnan(fp8_mma(x, q, s, Fp8MmaConfig(8, 2), glu=glu)).all()
    if not glu:  # bf16 at the edge: 65280 (f16 holds it) on tensor cores, 65536 and inf in fp32
        for edge in (65280.0, -65280.0, 65536.0, float("-inf")):
            x = _x(1, K, device, seed=4)
            x[0, 11] = edge
            _close(fp8_mma(x, q, s, Fp8MmaConfig(4, 2)), fp8_gemv_reference(x, q, s))


@pytest.mark.gpu
@pytest.mark.parametrize("N,K,glu", [(4096, 4096, False), (4096, 12288, True)])
def test_fp8_mma_model_shapes(device, N, K, glu) -> None:
    q, s = _weight(N, K, device, seed=0)
    x = _x(1, 2 * K if glu else K, device, seed=1)
    ref = fp8_gemv_reference(x, q, s, glu=glu)
    for cfg in (Fp8MmaConfig(4, 4), Fp8MmaConfig(8, 2, 3), Fp8MmaConfig(2, 8)):
        _close(fp8_mma(x, q, s, cfg, glu=glu), ref)


@pytest.mark.gpu
def test_quant_linear_takes_the_mma_kernel_where_the_table_says(device, monkeypatch) -> None:
    N, K = 256, 512
    q, s = _weight(N, K, device, seed=1)
    x = _x(1, K, device, seed=2)
    calls = []

    def spy(*args, **kwargs):
        calls.append(args[3])
        return fp8_mma(*args, **kwargs)

    monkeypatch.setattr("kernels.quant_gemm.fp8_mma", spy)
    monkeypatch.setattr(fp8_mma_mod, "TABLE", {(N, K, False, 1): Fp8MmaConfig(4, 2)})
    _close(quant_linear(x, q, s, "fp8"), fp8_gemv_reference(x, q, s))
    assert calls == [Fp8MmaConfig(4, 2)]
    quant_linear(_x(2, K, device, seed=5), q, s, "fp8")  # M = 2: not in the table
    quant_linear(x.float(), q, s, "fp8")  # fp32 x: the FMA kernel
    assert len(calls) == 1


def _swiglu_reference(y: torch.Tensor) -> torch.Tensor:
    g, u = y.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(g) * u).to(y.dtype)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "cfg", [Fp8MmaConfig(2, 1), Fp8MmaConfig(4, 2, 2), Fp8MmaConfig(8, 4)], ids=str
)
@pytest.mark.parametrize("N,K", [(96, 512), (74, 4100), (24576, 4096)])
def test_fp8_mma_swiglu_epilogue(device, cfg, N, K) -> None:
    """w = [gate; up]: the kernel writes silu(gate) * up of each gate row and its up row (N / 2
    outputs; 74: a ragged last block), also when the program recomputes in fp32."""
    q, s = _weight(N, K, device, seed=N)
    x = _x(1, K, device, seed=2)
    ref = _swiglu_reference(fp8_gemv_reference(x, q, s))
    y = fp8_mma(x, q, s, cfg, swiglu_out=True)
    assert y.shape == (1, N // 2)
    _close(y, ref)
    x[0, 3] = 1.0e5  # beyond f16: the fp32 path
    _close(fp8_mma(x, q, s, cfg, swiglu_out=True), _swiglu_reference(fp8_gemv_reference(x, q, s)))


@pytest.mark.gpu
def test_quant_linear_swiglu_out(device, monkeypatch) -> None:
    """quant_linear(swiglu_out=True): the MMA epilogue where the table names the weight at
    batch 1, else the GEMV then silu_mul; the same result either way."""
    N, K = 256, 512
    q, s = _weight(N, K, device, seed=1)
    ref = _swiglu_reference(fp8_gemv_reference(_x(1, K, device, seed=2), q, s))
    monkeypatch.setattr(fp8_mma_mod, "TABLE", {(N, K, False, 1): Fp8MmaConfig(4, 2)})
    _close(quant_linear(_x(1, K, device, seed=2), q, s, "fp8", swiglu_out=True), ref)
    monkeypatch.setattr(fp8_mma_mod, "TABLE", {})
    _close(quant_linear(_x(1, K, device, seed=2), q, s, "fp8", swiglu_out=True), ref)
    x3 = _x(3, K, device, seed=3)
    want = _swiglu_reference(fp8_gemv_reference(x3, q, s))
    _close(quant_linear(x3, q, s, "fp8", swiglu_out=True), want)


def _norm_ref(s: torch.Tensor, g: torch.Tensor, eps: float, zc: bool) -> torch.Tensor:
    from kernels.rmsnorm import rmsnorm_reference

    return rmsnorm_reference(s, g, eps, zero_centered=zc)[0]


@pytest.mark.gpu
@pytest.mark.parametrize("zc", [False, True])
@pytest.mark.parametrize(
    "cfg", [Fp8MmaConfig(2, 2), Fp8MmaConfig(4, 4), Fp8MmaConfig(8, 2, 1)], ids=str
)
@pytest.mark.parametrize("H,K1,N2", [(4096, 4096, 6144), (100, 1000, 38)])
def test_rmsnorm_between_two_projections(device, zc, cfg, H, K1, N2) -> None:
    """fuse_norm_linear's kernels: the first projection's residual epilogue gives s = r + y
    exactly as the separate add rounds it, u = f16(s * gain) and the sum of s² (also with
    programs that loop over several blocks, and a ragged last block whose missing rows add
    nothing); the second projection, given NormedX, equals the projection of rmsnorm(s) * gain,
    with and without SwiGLU epilogue."""
    from kernels.fp8_mma import NORM_STATS, NormedX, ResidualNorm

    q1, s1 = _weight(H, K1, device, seed=H)
    x = _x(1, K1, device, seed=5)
    r = _x(1, H, device, seed=6) * 4
    g = (torch.rand(H, generator=torch.Generator().manual_seed(1)) + 0.5).to(device, torch.bfloat16)
    stats = torch.zeros(NORM_STATS, dtype=torch.float32, device=device)
    s, u = fp8_mma(x, q1, s1, cfg, residual=ResidualNorm(r, g, zc, stats))
    want_s = (fp8_mma(x, q1, s1, cfg).float() + r.float()).to(torch.bfloat16)
    assert torch.equal(s, want_s)
    gain = g.float() + 1.0 if zc else g.float()
    assert torch.equal(u, (s.float() * gain).half())
    torch.testing.assert_close(stats.sum(), s.float().pow(2).sum(), rtol=1e-5, atol=0)

    eps = 1e-6
    normed = NormedX(s, u, g, zc, stats, eps)
    torch.testing.assert_close(normed.materialize(), _norm_ref(s, g, eps, zc))
    q2, s2 = _weight(N2, H, device, seed=N2)
    ref = fp8_gemv_reference(_norm_ref(s, g, eps, zc), q2, s2)
    _close(fp8_mma(normed, q2, s2, cfg), ref)
    _close(fp8_mma(normed, q2, s2, cfg, swiglu_out=True), _swiglu_reference(ref))


@pytest.mark.gpu
def test_normed_input_beyond_f16_recomputed(device) -> None:
    """s * gain beyond f16 (u holds inf) sends the rows to the fp32 path, which reads s and the
    gain: the result still equals the projection of rmsnorm(s) * gain."""
    H, N = 512, 64
    x = overflowing_normed_x(_x(1, H, device, seed=8))
    q, sc = _weight(N, H, device, seed=9)
    ref = fp8_gemv_reference(_norm_ref(x.s, x.gain, 1e-6, False), q, sc)
    _close(fp8_mma(x, q, sc, Fp8MmaConfig(4, 2)), ref)
