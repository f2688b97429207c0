"""Non-causal attention of a drafted block over its own keys and a per-row context (DFlash).

Contract (B rows of n block tokens, T = B * n; H query heads in groups of rep = H / Hkv per
KV head; one dtype for q, the buffers and out):

    q       [T, H, D]: row b's block tokens are q[b * n : (b + 1) * n] (token and head strides
            free, last dim contiguous)
    k_buf   [P, S_max, Hkv, D] and v_buf alike (P >= B; last dim contiguous): row b's keys are
            k_buf[b, 0 : n + lengths[b]]: first the block's own n keys, then its context
    lengths [B] int32: context keys of each row (the rest of the buffer is never read)
    out     [T, H, D] in q.dtype:
            out[t, h] = softmax(q[t, h] · K_bᵀ * scale) V_b over every key of row b (no causal
            mask: each block token sees its whole block and all of the row's context),
            K_b, V_b = k_buf[b, : n + lengths[b], h // rep], v_buf[...]

Each program takes one (row, KV head) and the n * rep queries that share that head (GQA folded
into the query tile, so K/V are read once per group), over one of `splits` ranges of the row's
keys, with an online softmax in fp32. With splits > 1, the ranges' partial sums (fp32) and their
(max, sum) go to a scratch buffer and a second kernel combines them, COMBINE_ROWS query rows
per program, so a long context is read by many programs at once (flash-decoding). The key loop
bound is read from `lengths` on the device: no host sync, so the launch can be captured in a
CUDA Graph and replayed for any lengths that fit the buffer. Both kernels are launched with
programmatic dependent launch where the device has it (kernels/launch.py): they wait for the
kernel before them before their first load.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.launch import f32_dot, pdl_args, pdl_wait

NEG = tl.constexpr(-1.0e30)  # a masked score: exp(NEG - m) == 0 for any real max m, never NaN
BLOCK_N = 64  # keys per tile
COMBINE_ROWS = 8  # query rows per combining program (the H200: 8 beat 16, 32, 64)


@triton.jit
def _split_kernel(
    q_ptr, k_ptr, v_ptr, len_ptr, out_ptr, acc_ptr, ml_ptr,
    HKV, n, rep, D, scale,
    sq_t, sq_h, sk_p, sk_t, sk_h, sv_p, sv_t, sv_h, so_t, so_h,
    SPLITS: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, F32_DOT: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    bg = tl.program_id(0)
    sp = tl.program_id(1)
    b = bg // HKV
    g = bg % HKV
    r = tl.arange(0, BLOCK_Q)  # query r: block token r // rep, head g * rep + r % rep
    qm = r < n * rep
    tok = (b * n + r // rep).to(tl.int64)
    head = g * rep + r % rep
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    qmask = qm[:, None] & dm[None, :]
    q = tl.load(
        q_ptr + tok[:, None] * sq_t + head[:, None] * sq_h + d[None, :], mask=qmask, other=0.0
    )
    if F32_DOT:
        q = q.to(tl.float32)
    total = n + tl.load(len_ptr + b)
    chunk = tl.cdiv(tl.cdiv(total, SPLITS), BLOCK_N) * BLOCK_N
    lo = sp * chunk
    hi = tl.minimum(lo + chunk, total)
    m = tl.full([BLOCK_Q], NEG, dtype=tl.float32)
    s_sum = tl.zeros([BLOCK_Q], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], dtype=tl.float32)
    kb = k_ptr + b.to(tl.int64) * sk_p + g * sk_h
    vb = v_ptr + b.to(tl.int64) * sv_p + g * sv_h
    for start in range(lo, hi, BLOCK_N):
        key = start + tl.arange(0, BLOCK_N)
        km = key < hi
        kvm = km[:, None] & dm[None, :]
        k = tl.load(kb + key.to(tl.int64)[:, None] * sk_t + d[None, :], mask=kvm, other=0.0)
        v = tl.load(vb + key.to(tl.int64)[:, None] * sv_t + d[None, :], mask=kvm, other=0.0)
        if F32_DOT:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(km[None, :], s * scale, NEG)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        s_sum = s_sum * alpha + tl.sum(p, axis=1)
        if F32_DOT:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m = m_new
    if SPLITS == 1:
        o = acc / s_sum[:, None]
        optr = out_ptr + tok[:, None] * so_t + head[:, None] * so_h + d[None, :]
        tl.store(optr, o.to(out_ptr.dtype.element_ty), mask=qmask)
    else:
        part = (bg * SPLITS + sp).to(tl.int64)
        tl.store(acc_ptr + (part * BLOCK_Q + r)[:, None] * BLOCK_D + d[None, :], acc)
        tl.store(ml_ptr + (part * 2) * BLOCK_Q + r, m)
        tl.store(ml_ptr + (part * 2 + 1) * BLOCK_Q + r, s_sum)


@triton.jit
def _combine_kernel(
    acc_ptr, ml_ptr, out_ptr, HKV, n, rep, D, so_t, so_h,
    SPLITS: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    # grid (B * HKV, BLOCK_Q // ROWS): ROWS of the group's query rows per program, so the
    # partial sums (SPLITS x BLOCK_Q x BLOCK_D fp32 per group) are read by many programs
    pdl_wait(PDL)
    bg = tl.program_id(0)
    b = bg // HKV
    g = bg % HKV
    r = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    d = tl.arange(0, BLOCK_D)
    base = (bg * SPLITS).to(tl.int64)
    m_all = tl.full([ROWS], NEG, dtype=tl.float32)
    for sp in tl.static_range(SPLITS):
        m_all = tl.maximum(m_all, tl.load(ml_ptr + ((base + sp) * 2) * BLOCK_Q + r))
    total = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    for sp in tl.static_range(SPLITS):
        w = tl.exp(tl.load(ml_ptr + ((base + sp) * 2) * BLOCK_Q + r) - m_all)  # 0: empty range
        total += w * tl.load(ml_ptr + ((base + sp) * 2 + 1) * BLOCK_Q + r)
        part = tl.load(acc_ptr + ((base + sp) * BLOCK_Q + r)[:, None] * BLOCK_D + d[None, :])
        acc += w[:, None] * part
    qm = r < n * rep
    tok = (b * n + r // rep).to(tl.int64)
    head = g * rep + r % rep
    optr = out_ptr + tok[:, None] * so_t + head[:, None] * so_h + d[None, :]
    o = acc / total[:, None]
    tl.store(optr, o.to(out_ptr.dtype.element_ty), mask=qm[:, None] & (d < D)[None, :])


def block_splits(max_keys: int, groups: int = 1) -> int:
    """How many key ranges a launch over rows of up to `max_keys` keys splits into, for
    `groups` (rows x KV heads) programs per range: about 128 keys per program, at most 16 ranges
    (a power of two), and at most about 128 programs in all. More programs than that only add
    partial sums to combine: on the H200, 4 rows of 8 KV heads over 2048 keys take 14.0 us with
    4 ranges and 24.9 us with 16 (bench/results/block_attention_splits_h200.md)."""
    by_keys = triton.next_power_of_2(max(1, -(-max_keys // 128)))
    by_programs = 1 << max(0, (128 // max(1, groups)).bit_length() - 1)  # a power of two
    return min(16, by_keys, by_programs)


def block_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    lengths: torch.Tensor,
    n: int,
    *,
    scale: float,
    splits: int = 1,
) -> torch.Tensor:
    """out [T, H, D] (see the module docstring); `splits` (a power of two): key ranges per (row,
    KV head), block_splits(the buffer's keys per row) for a launch whose lengths vary."""
    T, H, D = q.shape
    B = lengths.shape[0]
    assert T == B * n and n >= 1, (T, B, n)
    assert k_buf.dim() == 4 and v_buf.shape == k_buf.shape and k_buf.shape[0] >= B
    Hkv = k_buf.shape[2]
    assert H % Hkv == 0 and k_buf.shape[3] == D
    assert q.stride(-1) == 1 and k_buf.stride(-1) == 1 and v_buf.stride(-1) == 1
    assert splits >= 1 and splits & (splits - 1) == 0, splits
    rep = H // Hkv
    out = torch.empty(T, H, D, dtype=q.dtype, device=q.device)
    if T == 0:
        return out
    block_q = max(16, triton.next_power_of_2(n * rep))
    block_d = max(16, triton.next_power_of_2(D))
    if splits > 1:
        acc = torch.empty(
            B * Hkv * splits * block_q * block_d, dtype=torch.float32, device=q.device
        )
        ml = torch.empty(B * Hkv * splits * 2 * block_q, dtype=torch.float32, device=q.device)
    else:
        acc = ml = out  # unused
    _split_kernel[(B * Hkv, splits)](
        q, k_buf, v_buf, lengths, out, acc, ml, Hkv, n, rep, D, float(scale),
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), k_buf.stride(2),
        v_buf.stride(0), v_buf.stride(1), v_buf.stride(2), out.stride(0), out.stride(1),
        SPLITS=splits, BLOCK_Q=block_q, BLOCK_D=block_d, BLOCK_N=BLOCK_N,
        F32_DOT=f32_dot(q.dtype), num_warps=4, **pdl_args(q.device),
    )  # fmt: skip
    if splits > 1:
        rows = min(block_q, COMBINE_ROWS)
        _combine_kernel[(B * Hkv, block_q // rows)](
            acc, ml, out, Hkv, n, rep, D, out.stride(0), out.stride(1),
            SPLITS=splits, BLOCK_Q=block_q, BLOCK_D=block_d, ROWS=rows, num_warps=4,
            **pdl_args(q.device),
        )  # fmt: skip
    return out


def block_attention_reference(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    lengths: torch.Tensor,
    n: int,
    *,
    scale: float,
) -> torch.Tensor:
    """Torch reference of :func:`block_attention` (fp32 math, one row at a time)."""
    T, H, D = q.shape
    rep = H // k_buf.shape[2]
    out = torch.empty(T, H, D, dtype=q.dtype, device=q.device)
    for b, c in enumerate(lengths.tolist()):
        k = k_buf[b, : n + c].float().repeat_interleave(rep, dim=1)  # [L, H, D]
        v = v_buf[b, : n + c].float().repeat_interleave(rep, dim=1)
        qb = q[b * n : (b + 1) * n].float()  # [n, H, D]
        w = torch.softmax(torch.einsum("thd,lhd->htl", qb, k) * scale, dim=-1)
        out[b * n : (b + 1) * n] = torch.einsum("htl,lhd->thd", w, v).to(q.dtype)
    return out
