"""Gated delta rule (Gated DeltaNet), recurrent form, over variable-length sequences: the decode
step (one token per sequence) and a sequential prefill.

Contract (Hv = R * Hk; value head h reads key head h // R):
    q, k   [T, Hk, Dk]; v [T, Hv, Dv]; g [T, Hv] log-decay (fp32, <= 0); beta [T, Hv] in (0, 1)
    state  [N, Hv, Dk, Dv] fp32, updated IN PLACE to the state after each sequence's last token
    cu_seqlens [N+1] int32
    returns o [T, Hv, Dv] in v.dtype

Slot-indexed form (``state_slots`` [N] int32/int64, distinct): ``state`` is the whole slot pool
[S, Hv, Dk, Dv] and sequence n updates row state_slots[n] in place (other rows untouched), so
the caller needs no gather/scatter copies.

Spill form (speculative verify chunks; needs ``state_slots``): ``spill_slots`` [T] int32, one
per token. A sequence whose first token has spill_slots >= 0 writes the state after each of its
tokens t into row spill_slots[cu[n] + t] and leaves row state_slots[n] as it was unless it is one
of those rows (each program reads its slice of S once, before its first write); a sequence whose
tokens have -1 updates row state_slots[n] as above.

q, k, v, g, beta may be views (e.g. of a projection output): the last dim contiguous, token and
head strides free.

Per token, in fp32: q, k <- l2norm (if ``qk_l2norm``), q <- q * scale (default Dk^-½);
    S <- e^g S;  δ = β (v − Sᵀk);  S <- S + k δᵀ;  o = Sᵀq
Grid (N, Hv, cdiv(Dv, BV)): each program keeps its [Dk, BV] slice of S in registers across the
sequence, so programs never share state.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gdr_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    b_ptr,
    s_ptr,
    o_ptr,
    cu_ptr,
    slot_ptr,
    spill_ptr,
    scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_gt,
    stride_bt,
    stride_ot,
    stride_oh,
    stride_sn,
    stride_sh,
    R: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    L2NORM: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
    HAS_SPILL: tl.constexpr,
):
    n = tl.program_id(0)
    h = tl.program_id(1)
    hk = h // R
    dk = tl.arange(0, BK)
    dv = tl.program_id(2) * BV + tl.arange(0, BV)
    kmask = dk < DK
    vmask = dv < DV
    smask = kmask[:, None] & vmask[None, :]
    if HAS_SLOTS:
        row = tl.load(slot_ptr + n).to(tl.int64)  # the sequence's row of the slot pool
    else:
        row = n.to(tl.int64)
    s_ptrs = s_ptr + row * stride_sn + h * stride_sh + dk[:, None] * DV + dv[None, :]
    S = tl.load(s_ptrs, mask=smask, other=0.0)  # [BK, BV] fp32
    start = tl.load(cu_ptr + n).to(tl.int64)
    length = tl.load(cu_ptr + n + 1) - tl.load(cu_ptr + n)
    for i in range(length):
        t64 = start + i
        q = tl.load(q_ptr + t64 * stride_qt + hk * stride_qh + dk, mask=kmask, other=0.0).to(
            tl.float32
        )
        k = tl.load(k_ptr + t64 * stride_kt + hk * stride_kh + dk, mask=kmask, other=0.0).to(
            tl.float32
        )
        v = tl.load(v_ptr + t64 * stride_vt + h * stride_vh + dv, mask=vmask, other=0.0).to(
            tl.float32
        )
        g = tl.load(g_ptr + t64 * stride_gt + h).to(tl.float32)
        beta = tl.load(b_ptr + t64 * stride_bt + h).to(tl.float32)
        if L2NORM:
            q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6)
            k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
        q = q * scale
        S = S * tl.exp(g)
        kv_mem = tl.sum(S * k[:, None], axis=0)  # [BV]
        delta = (v - kv_mem) * beta
        S = S + k[:, None] * delta[None, :]
        o = tl.sum(S * q[:, None], axis=0)
        tl.store(
            o_ptr + t64 * stride_ot + h * stride_oh + dv, o.to(o_ptr.dtype.element_ty), mask=vmask
        )
        if HAS_SPILL:  # a verify chunk keeps the state after every token
            dst = tl.load(spill_ptr + t64)
            if dst >= 0:
                spill_ptrs = s_ptrs + (dst.to(tl.int64) - row) * stride_sn  # its slice there
                tl.store(spill_ptrs, S, mask=smask)
    if HAS_SPILL:  # the final state goes to `row` unless the sequence spilled
        first = tl.load(spill_ptr + start, mask=length > 0, other=-1)
        if first < 0:
            tl.store(s_ptrs, S, mask=smask)
    else:
        tl.store(s_ptrs, S, mask=smask)


def gated_delta_rule_recurrent(
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
    state_slots: torch.Tensor | None = None,
    spill_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Recurrent gated delta rule; mutates ``state`` (rows state_slots[n] of the pool when
    given, else row n of [N, ...]; with spill_slots [T], the spilling sequences' rows after
    each token instead); returns o [T, Hv, Dv] (module docstring)."""
    hk, dk = q.shape[1:]
    hv, dv = v.shape[1:]
    N = cu_seqlens.shape[0] - 1
    assert hv % hk == 0 and state.shape[1:] == (hv, dk, dv) and state.dtype == torch.float32
    if state_slots is None:
        assert state.shape[0] == N
    else:
        assert state_slots.shape == (N,)
    if spill_slots is not None:
        assert state_slots is not None and spill_slots.shape == (q.shape[0],)
    assert state.stride()[1:] == (dk * dv, dv, 1)
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    assert g.stride(-1) == 1 and beta.stride(-1) == 1
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if N == 0:
        return o
    bk = triton.next_power_of_2(dk)
    bv = min(32, triton.next_power_of_2(dv))
    _gdr_kernel[(N, hv, triton.cdiv(dv, bv))](
        q,
        k,
        v,
        g,
        beta,
        state,
        o,
        cu_seqlens,
        cu_seqlens if state_slots is None else state_slots,  # unread without slots
        cu_seqlens if spill_slots is None else spill_slots,  # unread without spill slots
        dk**-0.5 if scale is None else scale,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        g.stride(0),
        beta.stride(0),
        o.stride(0),
        o.stride(1),
        state.stride(0),
        state.stride(1),
        R=hv // hk,
        DK=dk,
        DV=dv,
        BK=bk,
        BV=bv,
        L2NORM=qk_l2norm,
        HAS_SLOTS=state_slots is not None,
        HAS_SPILL=spill_slots is not None,
        num_warps=4,
    )
    return o


def gated_delta_rule_reference(
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference (out of place): returns (o [T, Hv, Dv] in v.dtype, final state)."""
    hk, dk = q.shape[1:]
    hv = v.shape[1]
    R = hv // hk
    scale = dk**-0.5 if scale is None else scale
    qf = q.float().repeat_interleave(R, 1)
    kf = k.float().repeat_interleave(R, 1)
    if qk_l2norm:
        qf = qf * torch.rsqrt((qf * qf).sum(-1, keepdim=True) + 1e-6)
        kf = kf * torch.rsqrt((kf * kf).sum(-1, keepdim=True) + 1e-6)
    qf = qf * scale
    o = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    S_all = state.clone()
    for n in range(state.shape[0]):
        S = S_all[n]  # [Hv, Dk, Dv]
        for t in range(int(cu_seqlens[n]), int(cu_seqlens[n + 1])):
            S = S * g[t].float().exp()[:, None, None]
            kv_mem = torch.einsum("hkv,hk->hv", S, kf[t])
            delta = (v[t].float() - kv_mem) * beta[t].float()[:, None]
            S = S + kf[t][:, :, None] * delta[:, None, :]
            o[t] = torch.einsum("hkv,hk->hv", S, qf[t])
        S_all[n] = S
    return o.to(v.dtype), S_all
