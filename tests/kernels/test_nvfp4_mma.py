"""nvfp4 weights on the tensor-core decode GEMV (kernels/nvfp4_mma.py's layout, run by
kernels/fp8_mma.py): the layout on the CPU (through the interpreter), the kernel on the GPU."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernels.fp8_mma import NORM_STATS, Fp8MmaConfig, NormedX, ResidualNorm, fp8_mma
from kernels.nvfp4_mma import DECODE_SCALE, prepare, repack_words, unpack_words, word_values
from kernels.quant_decode import decode_e2m1
from kernels.quant_gemm import quant_linear_reference, quantize_weight_nvfp4
from tests.kernels.norm_inputs import overflowing_normed_x


def _all_words() -> torch.Tensor:
    """Every 16-bit pattern in the low half, each against a different high half: all values
    of every nibble position meet all values of the others in the same half."""
    lo = torch.arange(65536, dtype=torch.int64)
    hi = (lo * 40503 + 12345) % 65536
    return (lo | (hi << 16)).to(torch.int64)


def _bytes(words: torch.Tensor) -> torch.Tensor:
    """int64 32-bit patterns [n] -> their little-endian bytes as one row [1, 4n]."""
    b = torch.stack([(words >> (8 * i)) & 0xFF for i in range(4)], dim=-1)
    return b.to(torch.uint8).reshape(1, -1)


def test_repack_round_trips() -> None:
    packed = _bytes(_all_words())
    words = repack_words(packed)
    assert words.dtype == torch.int32 and words.shape == (1, packed.shape[1] // 4)
    assert torch.equal(unpack_words(words), packed)
    assert len(set(repack_words(packed).view(-1).tolist())) == 65536  # a bijection


@triton.jit
def _values_kernel(w_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    v0, v1, v2, v3, v4, v5, v6, v7 = word_values(tl.load(w_ptr + i, mask=ok, other=0))
    o = out_ptr + i * 8
    tl.store(o, v0, mask=ok)
    tl.store(o + 1, v1, mask=ok)
    tl.store(o + 2, v2, mask=ok)
    tl.store(o + 3, v3, mask=ok)
    tl.store(o + 4, v4, mask=ok)
    tl.store(o + 5, v5, mask=ok)
    tl.store(o + 6, v6, mask=ok)
    tl.store(o + 7, v7, mask=ok)


def test_decoded_words_are_the_stored_values(device) -> None:
    """word_values (the integer ops the kernel's inline assembly runs, with the multiplies that
    add two shifted copies) gives every word's 8 e2m1 values * 2^-14 in K order, signs and
    zeros included."""
    packed = _bytes(_all_words())
    words = repack_words(packed).reshape(-1).to(device)
    out = torch.empty(words.numel() * 8, dtype=torch.float32, device=device)
    _values_kernel[(triton.cdiv(words.numel(), 1024),)](words, out, words.numel(), BLOCK=1024)
    want = decode_e2m1(packed).reshape(-1)
    assert torch.equal(out.cpu() * DECODE_SCALE, want)
    neg_zero = torch.signbit(want) & (want == 0)
    assert torch.equal(torch.signbit(out.cpu())[neg_zero], neg_zero[neg_zero])


def _weight(N: int, K: int, device: str, seed: int, rows: bool = False):
    g = torch.Generator(device="cpu").manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.05
    w[:, :16] *= 1e-4  # a block whose e4m3 scale is subnormal
    q, s, gs = quantize_weight_nvfp4(w.to(device))
    gscale = torch.linspace(0.5, 2.0, N, device=device) * gs if rows else gs
    return q, s, gscale


def _x(K: int, device: str, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(1, K, generator=g).to(device=device, dtype=torch.bfloat16)


def _close(y: torch.Tensor, ref: torch.Tensor) -> None:
    torch.testing.assert_close(
        y.float(), ref.float(), rtol=1e-2, atol=1e-2 * float(ref.float().abs().max())
    )


def _swiglu(y: torch.Tensor) -> torch.Tensor:
    g, u = y.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(g) * u).to(y.dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("glu", [False, True])
@pytest.mark.parametrize(
    "cfg", [Fp8MmaConfig(2, 1), Fp8MmaConfig(4, 2), Fp8MmaConfig(8, 4), Fp8MmaConfig(4, 2, 2)],
    ids=str,
)  # fmt: skip
@pytest.mark.parametrize("N,K", [(96, 512), (100, 1056), (37, 4128), (6144, 4096)])
def test_nvfp4_mma_matches_reference(device, glu, cfg, N, K) -> None:
    """Ragged shapes (N not a multiple of the block, K not of the chunk), programs looping over
    blocks (per_sm), one global scale or one per row."""
    for rows in (False, True):
        q, s, gs = _weight(N, K, device, seed=N + K, rows=rows)
        x = _x(2 * K if glu else K, device, seed=1)
        ref = quant_linear_reference(x, q, s, "nvfp4", gs, glu=glu)
        _close(fp8_mma(x, prepare(q, s, gs), None, cfg, glu=glu), ref)


@pytest.mark.gpu
def test_nvfp4_mma_large_x_recomputed(device) -> None:
    """x beyond f16 sends the rows to the fp32 path (from the repacked words)."""
    N, K = 64, 1024
    q, s, gs = _weight(N, K, device, seed=3)
    x = _x(K, device, seed=4)
    x[0, 5] = 3.0e5
    x[0, 700] = -1.0e6
    y = fp8_mma(x, prepare(q, s, gs), None, Fp8MmaConfig(4, 2))
    assert torch.isfinite(y).all()
    _close(y, quant_linear_reference(x, q, s, "nvfp4", gs))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "cfg", [Fp8MmaConfig(2, 1), Fp8MmaConfig(4, 2), Fp8MmaConfig(8, 2)], ids=str
)
@pytest.mark.parametrize("N,K", [(96, 512), (74, 4128), (24576, 4096)])
def test_nvfp4_mma_swiglu_epilogue(device, cfg, N, K) -> None:
    q, s, gs = _weight(N, K, device, seed=N)
    x = _x(K, device, seed=2)
    y = fp8_mma(x, prepare(q, s, gs), None, cfg, swiglu_out=True)
    assert y.shape == (1, N // 2)
    _close(y, _swiglu(quant_linear_reference(x, q, s, "nvfp4", gs)))
    x[0, 3] = 1.0e5  # beyond f16: the fp32 path
    y = fp8_mma(x, prepare(q, s, gs), None, cfg, swiglu_out=True)
    _close(y, _swiglu(quant_linear_reference(x, q, s, "nvfp4", gs)))


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [Fp8MmaConfig(2, 2), Fp8MmaConfig(4, 4, 1)], ids=str)
def test_nvfp4_rmsnorm_between_two_projections(device, cfg) -> None:
    """The folded RMSNorm (kernels/folded_norm.py) with nvfp4 projections on both sides."""
    from kernels.rmsnorm import rmsnorm_reference

    H, K1, N2 = 4096, 4096, 6144
    q1, s1, g1 = _weight(H, K1, device, seed=H)
    w1 = prepare(q1, s1, g1)
    x = _x(K1, device, seed=5)
    r = _x(H, device, seed=6) * 4
    g = (torch.rand(H, generator=torch.Generator().manual_seed(1)) + 0.5).to(device, torch.bfloat16)
    stats = torch.zeros(NORM_STATS, dtype=torch.float32, device=device)
    s, u = fp8_mma(x, w1, None, cfg, residual=ResidualNorm(r, g, False, stats))
    assert torch.equal(s, (fp8_mma(x, w1, None, cfg).float() + r.float()).to(torch.bfloat16))
    q2, s2, g2 = _weight(N2, H, device, seed=N2)
    normed = rmsnorm_reference(s, g, 1e-6)[0]
    ref = quant_linear_reference(normed, q2, s2, "nvfp4", g2)
    y = fp8_mma(NormedX(s, u, g, False, stats, 1e-6), prepare(q2, s2, g2), None, cfg)
    _close(y, ref)


@pytest.mark.gpu
def test_nvfp4_normed_input_beyond_f16_recomputed(device) -> None:
    """A folded norm's f16 copy holding inf sends the rows to the fp32 path, which reads s and
    the gain (and the repacked words)."""
    from kernels.rmsnorm import rmsnorm_reference

    H, N = 512, 64
    x = overflowing_normed_x(_x(H, device, seed=8))
    q, sc, gs = _weight(N, H, device, seed=9)
    ref = quant_linear_reference(rmsnorm_reference(x.s, x.gain, 1e-6)[0], q, sc, "nvfp4", gs)
    _close(fp8_mma(x, prepare(q, sc, gs), None, Fp8MmaConfig(4, 2)), ref)


@pytest.mark.gpu
def test_cuda_weights_keep_a_repacked_copy(device, monkeypatch) -> None:
    """The CUDA runtime's nvfp4 weight: the stored bytes for batches above 1 and prefill, the
    repacked copy for batch 1 (counted in nbytes, not in the bytes a product reads); one row of
    bf16 x runs the tensor-core GEMV, more rows quant_linear, both as the reference."""
    from ninfer.runtime.executors.cuda import weights as cuda_weights

    N, K = 256, 1024
    q, s, gs = _weight(N, K, device, seed=11)
    w = cuda_weights._packed("nvfp4", [{"data": q, "scale": s, "global_scale": torch.tensor(gs)}])
    seg = w.segments[0]
    assert seg.mma is not None and torch.equal(unpack_words(seg.mma.words), q)
    assert w.nbytes() == w.read_bytes() + N * K // 2 + 4 * N
    calls = []
    monkeypatch.setattr(
        cuda_weights, "fp8_mma", lambda *a, **k: calls.append(a[3]) or fp8_mma(*a, **k)
    )
    for rows in (1, 3):
        x = _x(rows * K, device, seed=rows).view(rows, K)
        _close(w.linear(x), quant_linear_reference(x, q, s, "nvfp4", gs))
    assert len(calls) == 1
    monkeypatch.setenv("NINFER_NVFP4_MMA", "0")
    w0 = cuda_weights._packed("nvfp4", [{"data": q, "scale": s, "global_scale": torch.tensor(gs)}])
    assert w0.segments[0].mma is None and w0.nbytes() == w0.read_bytes()
