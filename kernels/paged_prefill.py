"""Causal paged attention for prefill chunks (chunked prefill), over the same page layout and
storage formats as decode (kernels.kv_cache).

Contract:
    q            [T, Hq, D]: the new tokens of N sequences, concatenated; sequence n owns rows
                 cu_seqlens_q[n] : cu_seqlens_q[n+1]
    cu_seqlens_q [N+1] int32, starting at 0
    seq_lens     [N] int32: tokens in the cache for sequence n *including* this chunk, whose
                 K/V must already be written to the pages; the chunk sits at positions
                 seq_lens[n] - q_len .. seq_lens[n] - 1, after a prefix already in the pages
    block_tables [N, max_pages] int32
    out          [T, Hq, D] in q.dtype; query at position p attends to cache positions 0..p

Grid (cdiv(max_q_len, BLOCK_M), N, Hq): a program owns BLOCK_M queries of one head and streams
the causal part of that sequence's KV in BLOCK_N tiles (online softmax, fp32 accumulators).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.kv_cache import FMT_CODE, as_kernel_arg, gather_kv, kv_strides, load_kv_tile
from kernels.launch import f32_dot, hw_fp8
from kernels.paged_decode import LOG2E


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    bt_ptr,
    cu_ptr,
    seqlen_ptr,
    out_ptr,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_bt,
    k_ss,
    k_sh,
    ks_ss,
    ks_sh,
    v_ss,
    v_sh,
    vs_ss,
    vs_sh,
    PAGE: tl.constexpr,
    G: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KFMT: tl.constexpr,
    VFMT: tl.constexpr,
    KSC_FP8: tl.constexpr,
    VSC_FP8: tl.constexpr,
    F32_DOT: tl.constexpr,
    HW_FP8: tl.constexpr,
):
    mb = tl.program_id(0)
    n_seq = tl.program_id(1)
    h = tl.program_id(2)
    hk = h // G
    q_start = tl.load(cu_ptr + n_seq)
    q_len = tl.load(cu_ptr + n_seq + 1) - q_start
    if mb * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seqlen_ptr + n_seq)
    ctx = seq_len - q_len  # position of the chunk's first token

    i = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    imask = i < q_len
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    rows = (q_start + i).to(tl.int64)
    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + h * stride_qh + d[None, :],
        mask=imask[:, None] & dmask[None, :],
        other=0.0,
    )
    if F32_DOT:
        q = q.to(tl.float32)
    qpos = ctx + i  # [BLOCK_M]

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    bt_row = bt_ptr + n_seq.to(tl.int64) * stride_bt
    end = tl.minimum(seq_len, ctx + (mb + 1) * BLOCK_M)
    for n0 in range(0, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < end
        page = tl.load(bt_row + n // PAGE, mask=nmask, other=0)
        slot = page.to(tl.int64) * PAGE + n % PAGE
        k = load_kv_tile(
            k_ptr,
            ks_ptr,
            slot,
            hk,
            d,
            nmask,
            dmask,
            k_ss,
            k_sh,
            ks_ss,
            ks_sh,
            KFMT,
            KSC_FP8,
            HW_FP8,
        )
        v = load_kv_tile(
            v_ptr,
            vs_ptr,
            slot,
            hk,
            d,
            nmask,
            dmask,
            v_ss,
            v_sh,
            vs_ss,
            vs_sh,
            VFMT,
            VSC_FP8,
            HW_FP8,
        )
        if F32_DOT:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k.to(q.dtype)))
        allowed = nmask[None, :] & (n[None, :] <= qpos[:, None])
        s = tl.where(allowed, s * qk_scale, float("-inf"))  # [BLOCK_M, BLOCK_N]
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if F32_DOT:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(q.dtype), v.to(q.dtype))
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + rows[:, None] * stride_ot + h * stride_oh + d[None, :],
        o.to(out_ptr.dtype.element_ty),
        mask=imask[:, None] & dmask[None, :],
    )


def paged_attention_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    k_fmt: str = "plain",
    v_fmt: str = "plain",
    max_q_len: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal chunked-prefill attention over paged KV; see the module docstring.

    max_q_len: the longest chunk (host int); computed from cu_seqlens_q (a sync) if omitted."""
    T, Hq, D = q.shape
    assert q.stride(-1) == 1
    page_size, hkv = k_cache.shape[1], k_cache.shape[2]
    assert Hq % hkv == 0, "Hq must be a multiple of Hkv"
    n_seqs = seq_lens.shape[0]
    if out is None:
        out = torch.empty((T, Hq, D), dtype=q.dtype, device=q.device)
    if T == 0 or n_seqs == 0:
        return out
    if max_q_len is None:
        max_q_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    block_d = max(16, triton.next_power_of_2(D))
    block_m = 64 if block_d <= 128 else 32
    block_n = 64 if block_d <= 64 else 32
    k_ss, k_sh, ks_ss, ks_sh = kv_strides(k_cache, k_scale)
    v_ss, v_sh, vs_ss, vs_sh = kv_strides(v_cache, v_scale)
    grid = (triton.cdiv(max_q_len, block_m), n_seqs, Hq)
    _prefill_kernel[grid](
        q,
        as_kernel_arg(k_cache),
        as_kernel_arg(v_cache),
        k_scale if k_scale is not None else q,
        v_scale if v_scale is not None else q,
        block_tables,
        cu_seqlens_q,
        seq_lens,
        out,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        k_ss,
        k_sh,
        ks_ss,
        ks_sh,
        v_ss,
        v_sh,
        vs_ss,
        vs_sh,
        PAGE=page_size,
        G=Hq // hkv,
        D=D,
        BLOCK_M=block_m,
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        KFMT=FMT_CODE[k_fmt],
        VFMT=FMT_CODE[v_fmt],
        KSC_FP8=k_scale is not None and k_scale.dtype == torch.uint8,
        VSC_FP8=v_scale is not None and v_scale.dtype == torch.uint8,
        F32_DOT=f32_dot(q.dtype),
        HW_FP8=hw_fp8(),
        num_warps=4,
        num_stages=2,
    )
    return out


def paged_attention_prefill_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    k_fmt: str = "plain",
    v_fmt: str = "plain",
) -> torch.Tensor:
    """Torch reference of :func:`paged_attention_prefill` (gather, dequantise, masked softmax)."""
    T, Hq, D = q.shape
    out = torch.zeros((T, Hq, D), dtype=torch.float32, device=q.device)
    for n in range(seq_lens.shape[0]):
        a, b = int(cu_seqlens_q[n]), int(cu_seqlens_q[n + 1])
        L = int(seq_lens[n])
        if b == a:
            continue
        k = gather_kv(k_cache, k_scale, k_fmt, block_tables[n], L)  # [L, Hkv, D]
        v = gather_kv(v_cache, v_scale, v_fmt, block_tables[n], L)
        G = Hq // k.shape[1]
        k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
        qpos = torch.arange(L - (b - a), L, device=q.device)
        logits = torch.einsum("thd,nhd->htn", q[a:b].float(), k) * scale  # [Hq, t, L]
        mask = torch.arange(L, device=q.device)[None, :] <= qpos[:, None]
        logits = logits.masked_fill(~mask, float("-inf"))
        out[a:b] = torch.einsum("htn,nhd->thd", logits.softmax(-1), v)
    return out.to(q.dtype)
