"""kernels.attn_prologue: the fused q/k norm + rotary + KV write against its torch reference and
against the unfused kernels it replaces (rmsnorm -> rotary_ -> write_kv)."""

from __future__ import annotations

import pytest
import torch

from kernels.attn_prologue import attention_prologue, attention_prologue_reference
from kernels.kv_cache import alloc_kv_cache, as_kernel_arg, dequantize_kv, quantize_kv, write_kv
from kernels.quant_decode import decode_fp8
from kernels.rmsnorm import rmsnorm
from kernels.rotary import rope_inv_freq, rotary_

PAGES, PAGE = 4, 8


def _qkv(T: int, H: int, Hkv: int, D: int, dtype: torch.dtype, device: str, seed: int):
    """q [T, H, D], k/v [T, Hkv, D] as strided views into one fused [T, (H + 2 Hkv) D] buffer."""
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(T, (H + 2 * Hkv) * D, generator=g) * 3).to(device=device, dtype=dtype)
    q = qkv[:, : H * D].unflatten(-1, (H, D))
    k = qkv[:, H * D : (H + Hkv) * D].unflatten(-1, (Hkv, D))
    v = qkv[:, (H + Hkv) * D :].unflatten(-1, (Hkv, D))
    return q, k, v


def _caches(Hkv: int, D: int, k_fmt: str, v_fmt: str, dtype: torch.dtype, device: str) -> dict:
    kc, ks = alloc_kv_cache(PAGES, PAGE, Hkv, D, k_fmt, dtype, device)
    vc, vs = alloc_kv_cache(PAGES, PAGE, Hkv, D, v_fmt, dtype, device)
    return {
        "k_cache": kc,
        "v_cache": vc,
        "k_scale": ks,
        "v_scale": vs,
        "k_fmt": k_fmt,
        "v_fmt": v_fmt,
    }


def _unfused(
    q, k, v, positions, inv_freq, *, q_norm_w, k_norm_w, eps, zero_centered, slots, scale=1.0, **c
):
    """The launches the fused kernel replaces: rmsnorm kernel, rotary_ kernel, write_kv."""
    D = q.shape[-1]

    def norm(x, w):
        if w is None:
            return x.clone()
        y, _ = rmsnorm(x.reshape(-1, D), w, eps, zero_centered=zero_centered)
        return y.view(x.shape)

    qn, kn = norm(q, q_norm_w), norm(k, k_norm_w)
    if inv_freq is not None:
        rotary_(qn, positions, inv_freq, scale=scale)
        rotary_(kn, positions, inv_freq, scale=scale)
    write_kv(c["k_cache"], c["k_scale"], kn, slots, c["k_fmt"])
    write_kv(c["v_cache"], c["v_scale"], v, slots, c["v_fmt"])
    return qn


def _norm_args(D: int, dtype, device: str, seed: int, slots, zero_centered: bool) -> dict:
    """attention_prologue's keywords with random q/k norm weights (seeded) and `slots`."""
    g = torch.Generator().manual_seed(seed)
    return {
        "q_norm_w": torch.randn(D, generator=g).to(device, dtype),
        "k_norm_w": torch.randn(D, generator=g).to(device, dtype),
        "eps": 1e-6,
        "zero_centered": zero_centered,
        "slots": slots,
    }


def _assert_kv_close(got: dict, want: dict, tol: float, min_equal: float) -> None:
    """Caches equal up to `tol` (plain; for int8/fp8 relative to the row's amax) plus one
    quantisation step, and at least `min_equal` of the stored bytes identical."""
    for side in ("k", "v"):
        fmt = got[f"{side}_fmt"]
        gd, gs = got[f"{side}_cache"], got[f"{side}_scale"]
        wd, ws = want[f"{side}_cache"], want[f"{side}_scale"]
        a, b = dequantize_kv(gd, gs, fmt), dequantize_kv(wd, ws, fmt)
        if fmt == "plain":
            torch.testing.assert_close(a, b, atol=tol, rtol=tol)
            continue
        torch.testing.assert_close(gs, ws, atol=0, rtol=tol)
        s = ws[..., None]
        step = s if fmt == "int8" else b.abs() / 8 + s * 2.0**-9
        amax = s * (127.0 if fmt == "int8" else 448.0)  # of each (token, head) row
        assert ((a - b).abs() <= step * 1.01 + tol * amax).all(), f"{side} {fmt}"
        same = (as_kernel_arg(gd) == as_kernel_arg(wd)).float().mean().item()
        assert same >= min_equal, f"{side} {fmt}: only {same:.3f} of the bytes agree"


# (dtype, H, Hkv, D, rotary_dim (0: none), norm (None | "plain" | "zc"), k_fmt, v_fmt)
CASES = [
    (torch.float32, 4, 2, 32, 32, None, "plain", "plain"),
    (torch.float32, 6, 3, 32, 16, "plain", "int8", "int8"),
    (torch.float32, 4, 1, 32, 8, "zc", "fp8", "fp8"),
    (torch.bfloat16, 4, 2, 32, 16, "zc", "plain", "plain"),
    (torch.bfloat16, 8, 2, 32, 32, "plain", "fp8", "fp8"),
    (torch.bfloat16, 4, 2, 32, 32, "zc", "int8", "plain"),
    (torch.bfloat16, 4, 4, 32, 0, "plain", "fp8", "int8"),
]


@pytest.mark.parametrize("dtype, H, Hkv, D, rd, norm, k_fmt, v_fmt", CASES)
def test_matches_unfused_kernels_and_reference(device, dtype, H, Hkv, D, rd, norm, k_fmt, v_fmt):
    T = 5
    q, k, v = _qkv(T, H, Hkv, D, dtype, device, seed=H * 100 + rd)
    g = torch.Generator().manual_seed(7)
    ws = [torch.randn(D, generator=g).to(device, dtype) for _ in range(2)]
    args = {
        "q_norm_w": ws[0] if norm else None,
        "k_norm_w": ws[1] if norm else None,
        "eps": 1e-6,
        "zero_centered": norm == "zc",
        "slots": torch.tensor([29, 3, 17, 8, 30], dtype=torch.int32, device=device),
    }
    pos = torch.tensor([0, 1, 17, 4000, 131071], dtype=torch.int32, device=device)
    inv = rope_inv_freq(rd, 1e6, device) if rd else None
    pos = pos if rd else None
    fused = _caches(Hkv, D, k_fmt, v_fmt, dtype, device)
    out = attention_prologue(q, k, v, pos, inv, **args, **fused)
    assert out.shape == (T, H, D) and out.is_contiguous() and out.dtype == dtype

    # the unfused kernels: the same rounding points, so equal up to fp32 summation order
    unf = _caches(Hkv, D, k_fmt, v_fmt, dtype, device)
    q_unf = _unfused(q, k, v, pos, inv, **args, **unf)
    tol = 2e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out, q_unf, atol=tol, rtol=tol)
    _assert_kv_close(fused, unf, tol, min_equal=0.97)

    # the torch reference: rotary without the angle reduction, so bf16 may differ by an ulp
    ref = _caches(Hkv, D, k_fmt, v_fmt, dtype, device)
    q_ref = attention_prologue_reference(q, k, v, pos, inv, **args, **ref)
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, q_ref, atol=tol * 4, rtol=tol)
    _assert_kv_close(fused, ref, tol, min_equal=0.9)
    # slots not in the mapping stay untouched (zero)
    untouched = torch.ones(PAGES * PAGE, dtype=torch.bool)
    untouched[args["slots"].long().cpu()] = False
    for c in (fused["k_cache"], fused["v_cache"]):
        assert not as_kernel_arg(c).flatten(0, 1)[untouched.to(c.device)].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantised_bytes_equal_quantize_kv(device, dtype):
    """The in-kernel int8 / e4m3 rounding is quantize_kv's on the CPU, bit for bit: ties to
    even, subnormals, saturation, the sign of zero; rows with amax 127 / 448 get scale 1
    exactly. (The CPU, with IEEE divisions: torch on CUDA divides by a scalar as a multiply by
    its reciprocal, which can move the fp32 scale by an ulp.)"""
    fp8_row = [448.0, 1.0625, 1.1875, 0.5 * 2**-9, 1.5 * 2**-9, 2**-6 - 2**-10, 248.0, 447.0]
    fp8_row += [-0.0, -1e-6, -3.0, 7.5, -(2**-7), 0.0]
    int8_row = [127.0, 2.5, -2.5, 3.5, 0.5, -0.5, 1.5, 126.5, -127.0, 0.49, -0.0, 60.5, 7.0, 1.0]
    D = 16
    g = torch.Generator().manual_seed(3)
    for fmt, row in (("fp8", fp8_row), ("int8", int8_row)):
        v = torch.randn(3, 2, D, generator=g) * 5
        special = torch.tensor(row + [0.0] * (D - len(row)))
        v[0, 0] = special
        v[1, 1] = -special
        v[2, 0] = 0.0  # amax 0: scale 0, data 0
        v = v.to(device, dtype)
        k = torch.zeros_like(v)
        q = torch.zeros(3, 2, D, device=device, dtype=dtype)
        slots = torch.tensor([5, 0, 12], dtype=torch.int32, device=device)
        c = _caches(2, D, fmt, fmt, dtype, device)
        attention_prologue(q, k, v, None, None, slots=slots, **c)
        data, scale = quantize_kv(v.cpu(), fmt)
        got = as_kernel_arg(c["v_cache"]).flatten(0, 1)[slots.long()].cpu()
        assert torch.equal(got, data.to(got.dtype)), fmt
        got_scale = c["v_scale"].flatten(0, 1)[slots.long()].cpu()
        assert torch.equal(got_scale, scale) and got_scale[0, 0].item() == 1.0
    assert decode_fp8(torch.tensor([0x80], dtype=torch.uint8)).item() == 0.0


@pytest.mark.parametrize("H, Hkv, D, rd", [(32, 8, 128, 128), (16, 4, 256, 64)])
def test_realistic_shapes(device, H, Hkv, D, rd):
    """Qwen3-8B (32/8 heads of 128) and Qwen3.5 (16/4 heads of 256, rotary on 64) shapes."""
    T, dtype = 2, torch.bfloat16
    q, k, v = _qkv(T, H, Hkv, D, dtype, device, seed=D)
    args = _norm_args(D, dtype, device, 1, torch.tensor([31, 6], device=device), rd < D)
    pos = torch.tensor([9, 40000], device=device)
    inv = rope_inv_freq(rd, 1e6, device)
    fused = _caches(Hkv, D, "fp8", "plain", dtype, device)
    unf = _caches(Hkv, D, "fp8", "plain", dtype, device)
    out = attention_prologue(q, k, v, pos, inv, **args, **fused)
    want = _unfused(q, k, v, pos, inv, **args, **unf)
    torch.testing.assert_close(out, want, atol=1e-2, rtol=1e-2)
    _assert_kv_close(fused, unf, 1e-2, min_equal=0.97)


@pytest.mark.parametrize(
    "dtype, rd, k_fmt", [(torch.float32, 32, "plain"), (torch.bfloat16, 16, "fp8")]
)
def test_rope_scale(device, dtype, rd, k_fmt):
    """`scale` (YaRN's attention factor) multiplies cos and sin, as in kernels.rotary."""
    T, H, Hkv, D, scale = 4, 4, 2, 32, 1.1386
    q, k, v = _qkv(T, H, Hkv, D, dtype, device, seed=rd)
    slots = torch.tensor([2, 9, 30, 17], dtype=torch.int32, device=device)
    args = _norm_args(D, dtype, device, 5, slots, zero_centered=False)
    pos = torch.tensor([0, 40, 127, 5000], dtype=torch.int32, device=device)
    inv = rope_inv_freq(rd, 1e6, device)
    fused = _caches(Hkv, D, k_fmt, "plain", dtype, device)
    out = attention_prologue(q, k, v, pos, inv, **args, **fused, scale=scale)
    unf = _caches(Hkv, D, k_fmt, "plain", dtype, device)
    q_unf = _unfused(q, k, v, pos, inv, **args, **unf, scale=scale)
    tol = 2e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out, q_unf, atol=tol, rtol=tol)
    _assert_kv_close(fused, unf, tol, min_equal=0.97)
    ref = _caches(Hkv, D, k_fmt, "plain", dtype, device)
    q_ref = attention_prologue_reference(q, k, v, pos, inv, **args, **ref, scale=scale)
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, q_ref, atol=tol * 4, rtol=tol)
    _assert_kv_close(fused, ref, tol, min_equal=0.9)
    plain = attention_prologue(
        q, k, v, pos, inv, **args, **_caches(Hkv, D, k_fmt, "plain", dtype, device)
    )
    assert not torch.allclose(out.float(), plain.float(), atol=0.05)  # the scale is applied


def test_empty_step_and_refused_format(device):
    q, k, v = _qkv(0, 4, 2, 32, torch.float32, device, seed=0)
    c = _caches(2, 32, "plain", "plain", torch.float32, device)
    empty = torch.zeros(0, dtype=torch.int32, device=device)
    inv = rope_inv_freq(32, 1e4, device)
    assert attention_prologue(q, k, v, empty, inv, slots=empty, **c).shape == (0, 4, 32)
    c = _caches(2, 32, "plain", "nvfp4", torch.float32, device)
    with pytest.raises(ValueError, match="KV format 'nvfp4' is not fused"):
        attention_prologue(q, k, v, empty, inv, slots=empty, **c)
