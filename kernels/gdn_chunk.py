"""Gated delta rule (Gated DeltaNet), chunked form, for prefill over variable-length sequences.

Same contract and in-place state update as ``kernels.gdn_recurrent.gated_delta_rule_recurrent``
(Hv = R * Hk; value head h reads key head h // R):
    q, k   [T, Hk, Dk]; v [T, Hv, Dv]; g [T, Hv] log-decay (fp32, <= 0); beta [T, Hv] in (0, 1)
    state  [N, Hv, Dk, Dv] fp32, updated IN PLACE to the state after each sequence's last token
    cu_seqlens [N+1] int32 (device); returns o [T, Hv, Dv] in v.dtype

Each sequence is cut into chunks of C = chunk_size tokens (the last one shorter). Within a chunk
(positions i, j; Γ_i = g_1 + ... + g_i, the cumulative log-decay from the chunk start; S the
state before the chunk; q, k l2-normalised, q scaled):
    A    = strict_lower(β_i k_i·k_j e^(Γ_i−Γ_j))                              [C, C]
    Tm   = (I + A)^-1                   (the UT transform; forward substitution)
    w    = Tm (β k e^Γ),  u = Tm (β v)                                         [C, Dk], [C, Dv]
    v'   = u − w S                      (the delta-rule corrections)           [C, Dv]
    o    = (q e^Γ) S + causal(q_i·k_j e^(Γ_i−Γ_j)) v'                          [C, Dv]
    S   <- e^Γ_last S + (k e^(Γ_last−Γ))ᵀ v'
Three kernels, all matrix products (tl.dot, fp32 "ieee"):
    1. _prep_kernel    grid (chunks, Hv):      Γ, Tm, w, u                (parallel over chunks)
    2. _state_kernel   grid (N, Hv, Dv/BV):    walks each sequence's chunks: stores the state
                       before every chunk, v' (over u), and the final state
    3. _output_kernel  grid (chunks, Hv, Dv/BV): o                         (parallel over chunks)
The chunk table (start, length of every chunk) is built on the device with torch ops sized by
the host bound cdiv(T, C) + N, so the call never reads a device value on the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _load_rows(ptr, rows, stride_t, col0, cols, tmask, cmask):
    """x[rows, col0 + cols] as fp32 [BT, BC], zero outside the masks."""
    x = tl.load(
        ptr + rows[:, None] * stride_t + col0 + cols[None, :],
        mask=tmask[:, None] & cmask[None, :],
        other=0.0,
    )
    return x.to(tl.float32)


@triton.jit
def _l2norm_rows(x, L2NORM: tl.constexpr):
    if L2NORM:
        x = x / tl.sqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]
    return x


@triton.jit
def _prep_kernel(
    k_ptr,
    v_ptr,
    g_ptr,
    b_ptr,
    cstart_ptr,
    clen_ptr,
    gc_ptr,
    w_ptr,
    u_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_gt,
    stride_bt,
    HV: tl.constexpr,
    R: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    L2NORM: tl.constexpr,
):
    c = tl.program_id(0)
    h = tl.program_id(1)
    start = tl.load(cstart_ptr + c)  # int64
    clen = tl.load(clen_ptr + c).to(tl.int32)  # 0 for the unused tail of the chunk table
    t = tl.arange(0, BT)
    tmask = t < clen
    rows = start + t
    dk = tl.arange(0, BK)
    dv = tl.arange(0, BV)
    kmask = dk < DK
    vmask = dv < DV
    k = _l2norm_rows(
        _load_rows(k_ptr, rows, stride_kt, (h // R) * stride_kh, dk, tmask, kmask), L2NORM
    )  # [BT, BK]
    v = _load_rows(v_ptr, rows, stride_vt, h * stride_vh, dv, tmask, vmask)  # [BT, BV]
    g = tl.load(g_ptr + rows * stride_gt + h, mask=tmask, other=0.0).to(tl.float32)
    beta = tl.load(b_ptr + rows * stride_bt + h, mask=tmask, other=0.0).to(tl.float32)
    gc = tl.cumsum(g, 0)  # [BT] Γ
    tl.store(gc_ptr + rows * HV + h, gc, mask=tmask)
    kb = k * beta[:, None]
    lower = t[:, None] > t[None, :]
    decay = tl.exp(tl.where(lower, gc[:, None] - gc[None, :], 0.0))
    A = tl.where(lower, tl.dot(kb, tl.trans(k), input_precision="ieee") * decay, 0.0)
    # Tm = (I + A)^-1 by forward substitution: row i = e_i − Σ_{j<i} A_ij Tm_j
    Tm = tl.where(t[:, None] == t[None, :], 1.0, 0.0)  # [BT, BT]
    for i in range(1, clen):
        a_i = tl.sum(tl.where(t[:, None] == i, A, 0.0), axis=0)  # [BT] row i of A
        corr = tl.sum(a_i[:, None] * Tm, axis=0)  # [BT]
        Tm = tl.where(t[:, None] == i, Tm - corr[None, :], Tm)
    w = tl.dot(Tm, kb * tl.exp(gc)[:, None], input_precision="ieee")  # [BT, BK]
    u = tl.dot(Tm, v * beta[:, None], input_precision="ieee")  # [BT, BV]
    tl.store(
        w_ptr + (rows * HV + h)[:, None] * DK + dk[None, :],
        w,
        mask=tmask[:, None] & kmask[None, :],
    )
    tl.store(
        u_ptr + (rows * HV + h)[:, None] * DV + dv[None, :],
        u,
        mask=tmask[:, None] & vmask[None, :],
    )


@triton.jit
def _state_kernel(
    k_ptr,
    s_ptr,
    cu_ptr,
    coff_ptr,
    gc_ptr,
    w_ptr,
    u_ptr,
    h_ptr,
    stride_kt,
    stride_kh,
    stride_sn,
    stride_sh,
    HV: tl.constexpr,
    R: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    L2NORM: tl.constexpr,
):
    n = tl.program_id(0)
    h = tl.program_id(1)
    t = tl.arange(0, BT)
    dk = tl.arange(0, BK)
    dv = tl.program_id(2) * BV + tl.arange(0, BV)
    kmask = dk < DK
    vmask = dv < DV
    smask = kmask[:, None] & vmask[None, :]
    s_off = dk[:, None] * DV + dv[None, :]  # [BK, BV] within one [Dk, Dv] state
    s_ptrs = s_ptr + n.to(tl.int64) * stride_sn + h * stride_sh + s_off
    S = tl.load(s_ptrs, mask=smask, other=0.0)  # [BK, BV] fp32
    start = tl.load(cu_ptr + n).to(tl.int64)
    end = tl.load(cu_ptr + n + 1).to(tl.int64)
    c0 = tl.load(coff_ptr + n)  # int64: index of this sequence's first chunk
    for c in range(tl.cdiv(end - start, BT)):
        row0 = start + c * BT
        rows = row0 + t
        tmask = rows < end
        # the state before chunk c, read by _output_kernel
        tl.store(h_ptr + ((c0 + c) * HV + h) * DK * DV + s_off, S, mask=smask)
        w = _load_rows(w_ptr, rows * HV + h, DK, 0, dk, tmask, kmask)  # [BT, BK]
        u = _load_rows(u_ptr, rows * HV + h, DV, 0, dv, tmask, vmask)  # [BT, BV]
        k = _l2norm_rows(
            _load_rows(k_ptr, rows, stride_kt, (h // R) * stride_kh, dk, tmask, kmask), L2NORM
        )
        gc = tl.load(gc_ptr + rows * HV + h, mask=tmask, other=0.0)  # [BT]
        last = tl.minimum(end - row0, BT) - 1
        g_last = tl.sum(tl.where(t == last, gc, 0.0), axis=0)
        v_new = u - tl.dot(w, S, input_precision="ieee")  # [BT, BV], zero on padded rows
        tl.store(
            u_ptr + (rows * HV + h)[:, None] * DV + dv[None, :],
            v_new,
            mask=tmask[:, None] & vmask[None, :],
        )
        kd = k * tl.exp(g_last - gc)[:, None]  # [BT, BK]
        S = S * tl.exp(g_last) + tl.dot(tl.trans(kd), v_new, input_precision="ieee")
    tl.store(s_ptrs, S, mask=smask)


@triton.jit
def _output_kernel(
    q_ptr,
    k_ptr,
    cstart_ptr,
    clen_ptr,
    gc_ptr,
    u_ptr,
    h_ptr,
    o_ptr,
    scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_ot,
    stride_oh,
    HV: tl.constexpr,
    R: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    L2NORM: tl.constexpr,
):
    c = tl.program_id(0)
    h = tl.program_id(1)
    start = tl.load(cstart_ptr + c)
    clen = tl.load(clen_ptr + c).to(tl.int32)
    t = tl.arange(0, BT)
    tmask = t < clen
    rows = start + t
    dk = tl.arange(0, BK)
    dv = tl.program_id(2) * BV + tl.arange(0, BV)
    kmask = dk < DK
    vmask = dv < DV
    hk = h // R
    q = _l2norm_rows(_load_rows(q_ptr, rows, stride_qt, hk * stride_qh, dk, tmask, kmask), L2NORM)
    q = q * scale
    k = _l2norm_rows(_load_rows(k_ptr, rows, stride_kt, hk * stride_kh, dk, tmask, kmask), L2NORM)
    gc = tl.load(gc_ptr + rows * HV + h, mask=tmask, other=0.0)  # [BT]
    S = tl.load(
        h_ptr + (c.to(tl.int64) * HV + h) * DK * DV + dk[:, None] * DV + dv[None, :],
        mask=kmask[:, None] & vmask[None, :],
        other=0.0,
    )  # [BK, BV] the state before this chunk (garbage for unused chunks: nothing is stored)
    v_new = _load_rows(u_ptr, rows * HV + h, DV, 0, dv, tmask, vmask)  # [BT, BV]
    causal = t[:, None] >= t[None, :]
    decay = tl.exp(tl.where(causal, gc[:, None] - gc[None, :], 0.0))
    attn = tl.where(causal, tl.dot(q, tl.trans(k), input_precision="ieee") * decay, 0.0)
    o = tl.dot(q * tl.exp(gc)[:, None], S, input_precision="ieee")
    o += tl.dot(attn, v_new, input_precision="ieee")  # [BT, BV]
    tl.store(
        o_ptr + rows[:, None] * stride_ot + h * stride_oh + dv[None, :],
        o.to(o_ptr.dtype.element_ty),
        mask=tmask[:, None] & vmask[None, :],
    )


def chunk_table(
    cu_seqlens: torch.Tensor, total: int, chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """On the device, without host syncs: (first_chunk [N+1], chunk_start [M], chunk_len [M])
    int64, M = cdiv(total, chunk_size) + N, an upper bound on the number of chunks. Chunks are
    numbered sequence by sequence; first_chunk[n] is sequence n's first, first_chunk[N] the
    count; entries past the count have length 0."""
    cu = cu_seqlens.long()
    N = cu.numel() - 1
    lens = cu[1:] - cu[:-1]  # [N]
    first = torch.zeros(N + 1, dtype=torch.long, device=cu.device)
    first[1:] = torch.cumsum((lens + chunk_size - 1) // chunk_size, 0)
    ids = torch.arange(triton.cdiv(total, chunk_size) + N, device=cu.device)  # [M]
    seq = torch.searchsorted(first[1:], ids, right=True).clamp_(max=N - 1)  # [M]
    start = cu[seq] + (ids - first[seq]) * chunk_size
    length = (cu[seq + 1] - start).clamp_(0, chunk_size)
    length = torch.where(ids < first[N], length, 0)
    return first, start, length


def gated_delta_rule_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    scale: float | None = None,
    qk_l2norm: bool = True,
    chunk_size: int = 64,
) -> torch.Tensor:
    """Chunked gated delta rule; mutates ``state``; returns o [T, Hv, Dv] (module docstring).

    chunk_size: a power of two >= 16. Scratch (fp32): Γ [T, Hv], w [T, Hv, Dk], u/v' [T, Hv, Dv]
    and the per-chunk states [cdiv(T, chunk_size) + N, Hv, Dk, Dv]."""
    T, hk, dk = q.shape
    hv, dv = v.shape[1:]
    N = state.shape[0]
    assert hv % hk == 0 and state.shape == (N, hv, dk, dv) and state.dtype == torch.float32
    assert state.is_contiguous() and q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    assert g.stride(-1) == 1 and beta.stride(-1) == 1
    assert chunk_size >= 16 and chunk_size & (chunk_size - 1) == 0
    o = torch.empty_like(v)
    if N == 0 or T == 0:
        return o
    dev = q.device
    first, cstart, clen = chunk_table(cu_seqlens, T, chunk_size)
    M = cstart.numel()
    gc = torch.empty(T, hv, dtype=torch.float32, device=dev)
    w = torch.empty(T, hv, dk, dtype=torch.float32, device=dev)
    u = torch.empty(T, hv, dv, dtype=torch.float32, device=dev)
    hs = torch.empty(M, hv, dk, dv, dtype=torch.float32, device=dev)
    bk = max(16, triton.next_power_of_2(dk))
    bv_full = max(16, triton.next_power_of_2(dv))
    bv = min(64, bv_full)
    common = {"HV": hv, "R": hv // hk, "DK": dk, "DV": dv, "BT": chunk_size, "BK": bk}
    common["L2NORM"] = qk_l2norm
    _prep_kernel[(M, hv)](
        k, v, g, beta, cstart, clen, gc, w, u,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), beta.stride(0),
        BV=bv_full, num_warps=8, **common,
    )  # fmt: skip
    _state_kernel[(N, hv, triton.cdiv(dv, bv))](
        k, state, cu_seqlens, first, gc, w, u, hs,
        k.stride(0), k.stride(1), state.stride(0), state.stride(1),
        BV=bv, num_warps=4, **common,
    )  # fmt: skip
    _output_kernel[(M, hv, triton.cdiv(dv, bv))](
        q, k, cstart, clen, gc, u, hs, o,
        dk**-0.5 if scale is None else scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), o.stride(0), o.stride(1),
        BV=bv, num_warps=4, **common,
    )  # fmt: skip
    return o
