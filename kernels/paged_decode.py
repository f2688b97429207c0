"""Paged attention for decode (one query token per sequence), flash-decoding style.

Contract:
    q            [B, Hq, D]   bf16/fp16/fp32; Hq = G * Hkv (GQA: query head h reads kv head h // G)
    k/v cache    [num_pages, page_size, Hkv, X] (+ scales), layout and formats of kernels.kv_cache
    block_tables [B, max_pages] int32: page ids of each sequence, in order
    seq_lens     [B] int32: tokens in the cache for each sequence (the new token's K/V included);
                 0 is allowed (padding rows of a CUDA-graph batch) and gives a zero output
    out          [B, Hq, D] in q.dtype = softmax(q kᵀ * scale) v over the first seq_lens[b] tokens

Grid (B, Hkv, num_splits): one program reads one KV head once for its whole query group
(the G heads are the rows of a tl.dot, padded to 16), over a contiguous 1/num_splits of the
sequence. With several splits, each writes (o, log2-sum-exp) partials in fp32 and a second
kernel merges them. The launch never reads seq_lens on the host, so it can be CUDA-graph
captured; num_splits is chosen from shapes only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.kv_cache import FMT_CODE, as_kernel_arg, gather_kv, kv_strides, load_kv_tile
from kernels.launch import f32_dot, hw_fp8, pdl_args, pdl_wait

LOG2E = 1.4426950408889634


@triton.jit
def _decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    bt_ptr,
    seqlen_ptr,
    out_ptr,
    po_ptr,
    plse_ptr,
    qk_scale,
    stride_qb,
    stride_qh,
    stride_ob,
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
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    KFMT: tl.constexpr,
    VFMT: tl.constexpr,
    KSC_FP8: tl.constexpr,
    VSC_FP8: tl.constexpr,
    F32_DOT: tl.constexpr,
    HW_FP8: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    b = tl.program_id(0)
    hk = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seqlen_ptr + b)
    per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    gmask = g < G
    dmask = d < D
    heads = hk * G + g  # [BLOCK_G] query heads of this kv head
    q = tl.load(
        q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=gmask[:, None] & dmask[None, :],
        other=0.0,
    )
    if F32_DOT:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < end
        page = tl.load(bt_row + n // PAGE, mask=nmask, other=0)
        slot = page.to(tl.int64) * PAGE + n % PAGE  # [BLOCK_N]
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
        )  # [BLOCK_N, BLOCK_D] f32
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
        s = tl.where(nmask[None, :], s * qk_scale, float("-inf"))  # [BLOCK_G, BLOCK_N], log2 units
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

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    omask = gmask[:, None] & dmask[None, :]
    if NUM_SPLITS == 1:
        optr = out_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + d[None, :]
        tl.store(optr, o.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        row = (b.to(tl.int64) * (G * tl.num_programs(1)) + heads) * NUM_SPLITS + split  # [BLOCK_G]
        tl.store(po_ptr + row[:, None] * D + d[None, :], o, mask=omask)
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(plse_ptr + row, lse, mask=gmask)


@triton.jit
def _merge_kernel(
    po_ptr,
    plse_ptr,
    out_ptr,
    Hq,
    stride_ob,
    stride_oh,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    row = (b.to(tl.int64) * Hq + h) * NUM_SPLITS + s
    smask = s < NUM_SPLITS
    lse = tl.load(plse_ptr + row, mask=smask, other=float("-inf"))
    m = tl.max(lse, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m_safe)  # [BLOCK_S]; 0 for empty splits
    o = tl.load(
        po_ptr + row[:, None] * D + d[None, :], mask=smask[:, None] & (d < D)[None, :], other=0.0
    )
    o = tl.where(w[:, None] > 0, o, 0.0)
    total = tl.sum(w, axis=0)
    res = tl.sum(o * w[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + b.to(tl.int64) * stride_ob + h * stride_oh + d,
        res.to(out_ptr.dtype.element_ty),
        mask=d < D,
    )


def _default_splits(
    batch: int, hkv: int, max_tokens: int, block_n: int, device: torch.device
) -> int:
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = triton.cdiv(2 * sms, batch * hkv)
    return max(1, min(want, 32, triton.cdiv(max_tokens, block_n)))


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    k_fmt: str = "plain",
    v_fmt: str = "plain",
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """Decode attention over paged KV; see the module docstring. Returns out [B, Hq, D].
    block_n: tokens per tile (default 64 up to D=128, else 32)."""
    B, Hq, D = q.shape
    assert q.stride(-1) == 1
    page_size, hkv = k_cache.shape[1], k_cache.shape[2]
    assert Hq % hkv == 0, "Hq must be a multiple of Hkv"
    G = Hq // hkv
    if out is None:
        out = torch.empty((B, Hq, D), dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    block_d = max(16, triton.next_power_of_2(D))
    block_n = block_n or (64 if block_d <= 128 else 32)
    block_g = max(16, triton.next_power_of_2(G))
    if num_splits is None:
        num_splits = _default_splits(B, hkv, block_tables.shape[1] * page_size, block_n, q.device)
    if num_splits > 1:
        po = torch.empty((B, Hq, num_splits, D), dtype=torch.float32, device=q.device)
        plse = torch.empty((B, Hq, num_splits), dtype=torch.float32, device=q.device)
    else:
        po = plse = out  # unused
    k_ss, k_sh, ks_ss, ks_sh = kv_strides(k_cache, k_scale)
    v_ss, v_sh, vs_ss, vs_sh = kv_strides(v_cache, v_scale)
    _decode_kernel[(B, hkv, num_splits)](
        q,
        as_kernel_arg(k_cache),
        as_kernel_arg(v_cache),
        k_scale if k_scale is not None else q,
        v_scale if v_scale is not None else q,
        block_tables,
        seq_lens,
        out,
        po,
        plse,
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
        G=G,
        D=D,
        BLOCK_G=block_g,
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        NUM_SPLITS=num_splits,
        KFMT=FMT_CODE[k_fmt],
        VFMT=FMT_CODE[v_fmt],
        KSC_FP8=k_scale is not None and k_scale.dtype == torch.uint8,
        VSC_FP8=v_scale is not None and v_scale.dtype == torch.uint8,
        F32_DOT=f32_dot(q.dtype),
        HW_FP8=hw_fp8(),
        num_warps=num_warps,
        **pdl_args(q.device),
    )
    if num_splits > 1:
        merge_splits(po, plse, out)
    return out


def merge_splits(po: torch.Tensor, plse: torch.Tensor, out: torch.Tensor) -> None:
    """out [B, Hq, D] from the split partials po [B, Hq, S, D] (fp32 o) and plse [B, Hq, S]
    (log2-sum-exp, -inf for an empty split)."""
    B, Hq, S, D = po.shape
    _merge_kernel[(B, Hq)](
        po,
        plse,
        out,
        Hq,
        out.stride(0),
        out.stride(1),
        D=D,
        BLOCK_D=triton.next_power_of_2(D),
        NUM_SPLITS=S,
        BLOCK_S=triton.next_power_of_2(S),
        **pdl_args(out.device),
    )


def paged_attention_decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    k_fmt: str = "plain",
    v_fmt: str = "plain",
) -> torch.Tensor:
    """Torch reference of :func:`paged_attention_decode`: gather, dequantise, softmax, fp32."""
    B, Hq, D = q.shape
    out = torch.zeros((B, Hq, D), dtype=torch.float32, device=q.device)
    for b in range(B):
        n = int(seq_lens[b])
        if n == 0:
            continue
        k = gather_kv(k_cache, k_scale, k_fmt, block_tables[b], n)  # [n, Hkv, D]
        v = gather_kv(v_cache, v_scale, v_fmt, block_tables[b], n)
        G = Hq // k.shape[1]
        k = k.repeat_interleave(G, dim=1)
        v = v.repeat_interleave(G, dim=1)
        logits = torch.einsum("hd,nhd->hn", q[b].float(), k) * scale  # [Hq, n]
        out[b] = torch.einsum("hn,nhd->hd", logits.softmax(-1), v)
    return out.to(q.dtype)
