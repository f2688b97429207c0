"""The attention prologue in one kernel: per-head q/k RMSNorm, rotary, and the KV-cache write.

Contract (T tokens; q [T, H, D], k and v [T, Hkv, D], any token/head strides, last dim
contiguous, so views into the fused qkv buffer work; one dtype for the three):

    qn = rmsnorm(q, q_norm_w) per head, rounded to q.dtype      (skipped when q_norm_w is None)
    kn = rmsnorm(k, k_norm_w) per head, rounded to k.dtype      (skipped when k_norm_w is None)
    q_out = rotary(qn), kr = rotary(kn), rounded to their dtype  (skipped when inv_freq is None;
            cos and sin multiplied by `scale`, 1.0 by default, as in kernels.rotary)
    cache[slots[t]] <- quantize(kr[t]), quantize(v[t])          (formats plain, int8, fp8)
    returns q_out [T, H, D] contiguous, in q.dtype

which is exactly the unfused composition kernels.rmsnorm.rmsnorm -> kernels.rotary.rotary_ ->
kernels.kv_cache.write_kv, up to fp32 summation order: the norm is y = x/rms(x)·w, or ·(1 + w)
when zero_centered, in fp32; rotary is the rotate-half layout on the first rotary_dim =
2·len(inv_freq) dims with kernels/rotary.py's angle reduction; int8/fp8 use one fp32 scale per
(token, head) = amax/127 or amax/448 and round to nearest even, as kernels.kv_cache.quantize_kv
(the e4m3 encoding is done on the bits, so it is exact on the GPU and in the interpreter).
nvfp4 is not handled here: callers keep the unfused route for it.

Grid (T, cdiv(H, BLOCK_H) + 2·cdiv(Hkv, BLOCK_H)): each program takes BLOCK_H heads of one token,
of q, of k or of v. A head is read as three tiles, [0, half), [half, rotary_dim) and the
pass-through [rotary_dim, D), so the rotation pairs line up without shuffles. No host syncs:
the launch can be captured in a CUDA Graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.kv_cache import as_kernel_arg, kv_strides, write_kv
from kernels.launch import pdl_args, pdl_wait
from kernels.rmsnorm import rmsnorm_reference
from kernels.rotary import cos_sin, rotary_reference

FUSED_FORMATS = {"plain": 0, "int8": 1, "fp8": 2}


@triton.jit
def _rne(v):
    """Round fp32 to the nearest integer, ties to even (torch.round); returns int32."""
    f = tl.floor(v)
    d = v - f
    fi = f.to(tl.int32)
    up = (d > 0.5) | ((d == 0.5) & ((fi & 1) == 1))
    return fi + up.to(tl.int32)


@triton.jit
def _encode_e4m3(y):
    """fp32 -> e4m3fn byte values (int32 0..255), round to nearest even, saturated at ±448:
    kernels.quant_decode.encode_fp8 on the bits (the sign of -0.0 is kept)."""
    sign = tl.where(y.to(tl.int32, bitcast=True) < 0, 0x80, 0)
    a = tl.minimum(tl.abs(y), 448.0)
    bits = a.to(tl.int32, bitcast=True)
    # normal: keep 3 mantissa bits (RNE on the 20 dropped ones), rebias the exponent 127 -> 7
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20) - ((127 - 7) << 3)
    # below 2^-6: subnormal code = a / 2^-9 rounded (8 is the smallest normal, 2^-6)
    sub = _rne(a * 512.0)
    return tl.where(a < 0.015625, sub, normal) | sign


@triton.jit
def _quantize(y, FMT: tl.constexpr):
    """Scaled values -> int8 (FMT 1: RNE, clamped to ±127) or e4m3fn byte values (FMT 2)."""
    if FMT == 1:
        return tl.minimum(tl.maximum(_rne(y), -127), 127)
    else:
        return _encode_e4m3(y)


@triton.jit
def _load3(ptr, heads, hmask, stride_h, j, jmask, r, rmask, HALF: tl.constexpr,
           ROT: tl.constexpr, HAS_REST: tl.constexpr):  # fmt: skip
    """Tiles [BLOCK_H, *] fp32 of dims [0, HALF), [HALF, ROT) and [ROT, D) of some heads."""
    base = ptr + heads[:, None].to(tl.int64) * stride_h
    m = hmask[:, None] & jmask[None, :]
    x1 = tl.load(base + j[None, :], mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF + j[None, :], mask=m, other=0.0).to(tl.float32)
    if HAS_REST:
        mp = hmask[:, None] & rmask[None, :]
        xp = tl.load(base + ROT + r[None, :], mask=mp, other=0.0).to(tl.float32)
    else:
        xp = tl.zeros([1, 1], dtype=tl.float32)
    return x1, x2, xp


@triton.jit
def _norm_rope(x1, x2, xp, w_ptr, c, s, j, jmask, r, rmask, D, eps, RND: tl.constexpr,
               HALF: tl.constexpr, ROT: tl.constexpr, HAS_REST: tl.constexpr,
               HAS_NORM: tl.constexpr, ZERO_CENTERED: tl.constexpr, HAS_ROPE: tl.constexpr):  # fmt: skip
    """Per-row RMSNorm (rounded to RND, as the unfused kernel stores it) then rotation."""
    if HAS_NORM:
        ss = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
        if HAS_REST:
            ss += tl.sum(xp * xp, axis=1)
        rstd = (1.0 / tl.sqrt(ss / D + eps))[:, None]
        w1 = tl.load(w_ptr + j, mask=jmask, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + j, mask=jmask, other=0.0).to(tl.float32)[None, :]
        if ZERO_CENTERED:
            w1 += 1.0
            w2 += 1.0
        x1 = (x1 * rstd * w1).to(RND).to(tl.float32)
        x2 = (x2 * rstd * w2).to(RND).to(tl.float32)
        if HAS_REST:
            wp = tl.load(w_ptr + ROT + r, mask=rmask, other=0.0).to(tl.float32)[None, :]
            if ZERO_CENTERED:
                wp += 1.0
            xp = (xp * rstd * wp).to(RND).to(tl.float32)
    if HAS_ROPE:
        o1 = x1 * c - x2 * s
        o2 = x2 * c + x1 * s
        x1 = o1.to(RND).to(tl.float32)
        x2 = o2.to(RND).to(tl.float32)
    return x1, x2, xp


@triton.jit
def _store_kv(x1, x2, xp, data_ptr, scale_ptr, slot, heads, hmask, j, jmask, r, rmask,
              stride_slot, stride_head, sc_slot, sc_head, HALF: tl.constexpr, ROT: tl.constexpr,
              HAS_REST: tl.constexpr, FMT: tl.constexpr):  # fmt: skip
    """Quantise rows [BLOCK_H, D] (as three tiles) and store them at one slot of the cache."""
    base = data_ptr + slot * stride_slot + heads[:, None].to(tl.int64) * stride_head
    m = hmask[:, None] & jmask[None, :]
    mp = hmask[:, None] & rmask[None, :]
    if FMT == 0:
        ty = data_ptr.dtype.element_ty
        tl.store(base + j[None, :], x1.to(ty), mask=m)
        tl.store(base + HALF + j[None, :], x2.to(ty), mask=m)
        if HAS_REST:
            tl.store(base + ROT + r[None, :], xp.to(ty), mask=mp)
    else:
        amax = tl.maximum(tl.max(tl.abs(x1), axis=1), tl.max(tl.abs(x2), axis=1))
        if HAS_REST:
            amax = tl.maximum(amax, tl.max(tl.abs(xp), axis=1))
        if FMT == 1:
            qmax = tl.full(amax.shape, 127.0, tl.float32)
        else:
            qmax = tl.full(amax.shape, 448.0, tl.float32)
        # IEEE divisions (div_rn), as torch on the CPU computes amax / qmax and 1 / scale
        scale = tl.math.div_rn(amax, qmax)  # [BLOCK_H]
        one = tl.full(amax.shape, 1.0, tl.float32)
        inv = tl.math.div_rn(one, tl.where(scale > 0, scale, one))
        inv = tl.where(scale > 0, inv, 0.0)[:, None]
        ty = data_ptr.dtype.element_ty
        tl.store(base + j[None, :], _quantize(x1 * inv, FMT).to(ty), mask=m)
        tl.store(base + HALF + j[None, :], _quantize(x2 * inv, FMT).to(ty), mask=m)
        if HAS_REST:
            tl.store(base + ROT + r[None, :], _quantize(xp * inv, FMT).to(ty), mask=mp)
        tl.store(scale_ptr + slot * sc_slot + heads.to(tl.int64) * sc_head, scale, mask=hmask)


@triton.jit
def _prologue_kernel(
    q_ptr, k_ptr, v_ptr, qo_ptr, pos_ptr, inv_freq_ptr, qw_ptr, kw_ptr, slot_ptr,
    kc_ptr, vc_ptr, ks_ptr, vs_ptr,
    H, HKV, D, eps, scale,
    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h,
    kc_slot, kc_head, ks_slot, ks_head, vc_slot, vc_head, vs_slot, vs_head,
    HALF: tl.constexpr, ROT: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_REST: tl.constexpr,
    HAS_REST: tl.constexpr, BLOCK_H: tl.constexpr, HAS_ROPE: tl.constexpr,
    HAS_QNORM: tl.constexpr, HAS_KNORM: tl.constexpr, ZERO_CENTERED: tl.constexpr,
    K_FMT: tl.constexpr, V_FMT: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    nqb = tl.cdiv(H, BLOCK_H)
    nkb = tl.cdiv(HKV, BLOCK_H)
    j = tl.arange(0, BLOCK_HALF)
    jmask = j < HALF
    r = tl.arange(0, BLOCK_REST)
    rmask = r < D - ROT
    hr = tl.arange(0, BLOCK_H)
    RND = q_ptr.dtype.element_ty
    if HAS_ROPE:
        inv = tl.load(inv_freq_ptr + j, mask=jmask, other=0.0)
        c, s = cos_sin(tl.load(pos_ptr + t).to(tl.float32) * inv)  # [1, BLOCK_HALF] each
        c = c * scale
        s = s * scale
    else:
        c = tl.zeros([1, BLOCK_HALF], dtype=tl.float32)
        s = tl.zeros([1, BLOCK_HALF], dtype=tl.float32)
    if hb < nqb:
        heads = hb * BLOCK_H + hr
        hmask = heads < H
        x1, x2, xp = _load3(q_ptr + t * sq_t, heads, hmask, sq_h, j, jmask, r, rmask,
                            HALF, ROT, HAS_REST)  # fmt: skip
        x1, x2, xp = _norm_rope(x1, x2, xp, qw_ptr, c, s, j, jmask, r, rmask, D, eps, RND,
                                HALF, ROT, HAS_REST, HAS_QNORM, ZERO_CENTERED, HAS_ROPE)  # fmt: skip
        base = qo_ptr + t * so_t + heads[:, None].to(tl.int64) * so_h
        m = hmask[:, None] & jmask[None, :]
        tl.store(base + j[None, :], x1.to(RND), mask=m)
        tl.store(base + HALF + j[None, :], x2.to(RND), mask=m)
        if HAS_REST:
            tl.store(base + ROT + r[None, :], xp.to(RND), mask=hmask[:, None] & rmask[None, :])
    else:
        slot = tl.load(slot_ptr + t).to(tl.int64)
        if hb < nqb + nkb:
            heads = (hb - nqb) * BLOCK_H + hr
            hmask = heads < HKV
            x1, x2, xp = _load3(k_ptr + t * sk_t, heads, hmask, sk_h, j, jmask, r, rmask,
                                HALF, ROT, HAS_REST)  # fmt: skip
            x1, x2, xp = _norm_rope(x1, x2, xp, kw_ptr, c, s, j, jmask, r, rmask, D, eps, RND,
                                    HALF, ROT, HAS_REST, HAS_KNORM, ZERO_CENTERED, HAS_ROPE)  # fmt: skip
            _store_kv(x1, x2, xp, kc_ptr, ks_ptr, slot, heads, hmask, j, jmask, r, rmask,
                      kc_slot, kc_head, ks_slot, ks_head, HALF, ROT, HAS_REST, K_FMT)  # fmt: skip
        else:
            heads = (hb - nqb - nkb) * BLOCK_H + hr
            hmask = heads < HKV
            x1, x2, xp = _load3(v_ptr + t * sv_t, heads, hmask, sv_h, j, jmask, r, rmask,
                                HALF, ROT, HAS_REST)  # fmt: skip
            _store_kv(x1, x2, xp, vc_ptr, vs_ptr, slot, heads, hmask, j, jmask, r, rmask,
                      vc_slot, vc_head, vs_slot, vs_head, HALF, ROT, HAS_REST, V_FMT)  # fmt: skip


def _check_heads(name: str, x: torch.Tensor, T: int, D: int) -> None:
    assert x.dim() == 3 and x.shape[0] == T and x.shape[2] == D, f"{name} must be [T, heads, {D}]"
    assert x.stride(-1) == 1, f"{name} must have a contiguous last dim"


def attention_prologue(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor | None,
    inv_freq: torch.Tensor | None,
    *,
    q_norm_w: torch.Tensor | None = None,
    k_norm_w: torch.Tensor | None = None,
    eps: float = 1e-6,
    zero_centered: bool = False,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    k_fmt: str = "plain",
    v_fmt: str = "plain",
    scale: float = 1.0,
) -> torch.Tensor:
    """Norm + rotate q and k, write k and v into the paged cache; returns q_out [T, H, D]
    (see the module docstring). Mutates k_cache/v_cache (and their scales) at ``slots``.

    positions: int [T] (plain rotary only); inv_freq: fp32 [rotary_dim // 2], or None with
    positions None for no rotary; scale: multiplies cos and sin (a runtime argument, YaRN's
    attention factor); slots: int [T] flat cache slots (page * page_size + row);
    caches: [num_pages, page_size, Hkv, D] as kernels.kv_cache.alloc_kv_cache makes them for
    k_fmt / v_fmt in ("plain", "int8", "fp8"), scales [num_pages, page_size, Hkv] fp32."""
    for fmt in (k_fmt, v_fmt):
        if fmt not in FUSED_FORMATS:
            raise ValueError(
                f"attention_prologue: KV format {fmt!r} is not fused; write it unfused"
            )
    T, H, D = q.shape
    _check_heads("q", q, T, D)
    _check_heads("k", k, T, D)
    _check_heads("v", v, T, D)
    assert k.shape == v.shape and k.dtype == q.dtype == v.dtype
    Hkv = k.shape[1]
    has_rope = inv_freq is not None
    if has_rope:
        assert positions is not None and positions.shape == (T,), "positions must be [T]"
        half = inv_freq.numel()
        assert 0 < 2 * half <= D
        inv = inv_freq.to(torch.float32).contiguous()
        positions = positions.contiguous()
    else:
        assert D % 2 == 0
        half, inv = D // 2, q.new_zeros(1, dtype=torch.float32)
        positions = slots
    for w in (q_norm_w, k_norm_w):
        assert w is None or w.shape == (D,), f"norm weights must be [{D}]"
    q_out = torch.empty(T, H, D, dtype=q.dtype, device=q.device)
    if T == 0:
        return q_out
    kc, vc = as_kernel_arg(k_cache), as_kernel_arg(v_cache)
    kc_slot, kc_head, ks_slot, ks_head = kv_strides(kc, k_scale)
    vc_slot, vc_head, vs_slot, vs_head = kv_strides(vc, v_scale)
    rot = 2 * half
    block_d = triton.next_power_of_2(D)
    block_h = min(max(1, 1024 // block_d), triton.next_power_of_2(max(H, Hkv)))
    grid = (T, triton.cdiv(H, block_h) + 2 * triton.cdiv(Hkv, block_h))
    _prologue_kernel[grid](
        q, k, v, q_out, positions, inv,
        q_norm_w if q_norm_w is not None else q, k_norm_w if k_norm_w is not None else q,
        slots.contiguous(), kc, vc,
        k_scale if k_scale is not None else inv, v_scale if v_scale is not None else inv,
        H, Hkv, D, eps, float(scale),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_out.stride(0), q_out.stride(1),
        kc_slot, kc_head, ks_slot, ks_head, vc_slot, vc_head, vs_slot, vs_head,
        HALF=half, ROT=rot, BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_REST=triton.next_power_of_2(max(D - rot, 1)), HAS_REST=D > rot,
        BLOCK_H=block_h, HAS_ROPE=has_rope, HAS_QNORM=q_norm_w is not None,
        HAS_KNORM=k_norm_w is not None, ZERO_CENTERED=zero_centered,
        K_FMT=FUSED_FORMATS[k_fmt], V_FMT=FUSED_FORMATS[v_fmt], num_warps=4,
        **pdl_args(q.device),
    )  # fmt: skip
    return q_out


def attention_prologue_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor | None,
    inv_freq: torch.Tensor | None,
    *,
    q_norm_w: torch.Tensor | None = None,
    k_norm_w: torch.Tensor | None = None,
    eps: float = 1e-6,
    zero_centered: bool = False,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    k_fmt: str = "plain",
    v_fmt: str = "plain",
    scale: float = 1.0,
) -> torch.Tensor:
    """Torch reference of :func:`attention_prologue` (same contract; any kv_cache format)."""
    D = q.shape[-1]

    def norm(x: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
        if w is None:
            return x
        y, _ = rmsnorm_reference(x.reshape(-1, D), w, eps, zero_centered=zero_centered)
        return y.view(x.shape)

    q, k = norm(q, q_norm_w), norm(k, k_norm_w)
    if inv_freq is not None:
        q = rotary_reference(q, positions, inv_freq, scale=scale)
        k = rotary_reference(k, positions, inv_freq, scale=scale)
    write_kv(k_cache, k_scale, k, slots, k_fmt)
    write_kv(v_cache, v_scale, v, slots, v_fmt)
    return q.contiguous()
