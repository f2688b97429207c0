"""Causal depthwise conv1d (kernel width W, 4 in Qwen3.5) + SiLU over variable-length sequences,
with a carried conv state, for Gated DeltaNet prefill and decode.

Contract:
    x          [T, C] tokens of N sequences, concatenated (sequence n: rows cu[n] : cu[n+1])
    weight     [C, W]
    state      [N, C, W-1]: the W-1 inputs before each sequence's first token, oldest first
               (zeros for a fresh sequence)
    returns    (y [T, C] in x.dtype, new_state [N, C, W-1] in state.dtype)
    y[t, c] = silu(sum_i weight[c, i] * xx[t - (W-1) + i, c]),  xx = state ++ x of the sequence

Slot-indexed form (``state_slots`` [N] int32/int64, distinct): ``state`` is the whole slot pool
[S, C, W-1] and sequence n reads and overwrites row state_slots[n] IN PLACE (no gather/scatter
copies; other rows are untouched); the returned new_state is ``state`` itself.

Spill form (speculative verify chunks; needs ``state_slots``): ``spill_slots`` [T] int32, one
per token. A sequence whose first token has spill_slots >= 0 writes the state after each of its
positions t (the inputs t-(W-2) .. t, oldest first) into row spill_slots[cu[n] + t] and leaves
row state_slots[n] as it was unless it is one of those rows; a sequence whose tokens have -1
updates row state_slots[n] as above. Spill rows are distinct from each other and from every
other sequence's rows (state_slots[n] may be among its own).

x may be a view (e.g. columns of a projection output): last dim contiguous, token stride free.
Decode is the same call with one token per sequence (cu = arange(N+1)). Grid
(cdiv(max_len, BT), N, cdiv(C, BC)) with BT >= W-1, so only the first T-block of a sequence
reads its state; that same program writes the new state (after a barrier, so no thread of it
overwrites a state column another thread has yet to read), or every spilled state: their
columns before the chunk come from the old tail it holds in registers, so a spill row that is
the sequence's own row is only written after it was read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _conv_kernel(
    x_ptr,
    w_ptr,
    st_ptr,
    y_ptr,
    nst_ptr,
    cu_ptr,
    slot_ptr,
    spill_ptr,
    C,
    stride_xt,
    stride_yt,
    stride_wc,
    stride_sn,
    stride_sc,
    W: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    ACT: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
    HAS_SPILL: tl.constexpr,
):
    tb = tl.program_id(0)
    n = tl.program_id(1)
    if HAS_SLOTS:
        row = tl.load(slot_ptr + n).to(tl.int64)  # the sequence's row of the slot pool
    else:
        row = n.to(tl.int64)
    c = tl.program_id(2) * BC + tl.arange(0, BC)
    cmask = c < C
    start = tl.load(cu_ptr + n)
    L = tl.load(cu_ptr + n + 1) - start
    t = tb * BT + tl.arange(0, BT)
    st_base = st_ptr + row * stride_sn + c[None, :] * stride_sc
    if tb * BT < L:
        tmask = t < L
        acc = tl.zeros([BT, BC], dtype=tl.float32)
        for i in tl.static_range(W):
            src = t - (W - 1) + i  # [BT] position within the sequence; < 0 reads the state
            from_x = tmask & (src >= 0)
            from_s = tmask & (src < 0)
            xv = tl.load(
                x_ptr + (start + src).to(tl.int64)[:, None] * stride_xt + c[None, :],
                mask=from_x[:, None] & cmask[None, :],
                other=0.0,
            ).to(tl.float32)
            sv = tl.load(
                st_base + (src + W - 1)[:, None], mask=from_s[:, None] & cmask[None, :], other=0.0
            ).to(tl.float32)
            wi = tl.load(w_ptr + c * stride_wc + i, mask=cmask, other=0.0).to(tl.float32)
            acc += (xv + sv) * wi[None, :]
        if ACT:
            acc = acc * tl.sigmoid(acc)
        tl.store(
            y_ptr + (start + t).to(tl.int64)[:, None] * stride_yt + c[None, :],
            acc.to(y_ptr.dtype.element_ty),
            mask=tmask[:, None] & cmask[None, :],
        )
    if tb == 0:
        j = tl.arange(0, BT)  # new state slot j < W-1 holds position L - (W-1) + j
        jmask = j < W - 1
        src = L - (W - 1) + j
        xv = tl.load(
            x_ptr + (start + src).to(tl.int64)[:, None] * stride_xt + c[None, :],
            mask=(jmask & (src >= 0))[:, None] & cmask[None, :],
            other=0.0,
        )
        sv = tl.load(
            st_base + (src + W - 1)[:, None],
            mask=(jmask & (src < 0))[:, None] & cmask[None, :],
            other=0.0,
        )
        val = tl.where((src >= 0)[:, None], xv.to(tl.float32), sv.to(tl.float32))
        if HAS_SPILL:  # (a constexpr branch: steps without spill slots compile as before)
            if tl.load(spill_ptr + start, mask=L > 0, other=-1) >= 0:
                _spill_tails(
                    x_ptr, st_base, nst_ptr, spill_ptr, start, L, c, cmask, j, jmask,
                    stride_xt, stride_sn, stride_sc, W,
                )  # fmt: skip
            else:
                tl.debug_barrier()  # nst_ptr is st_ptr: every state read of this program first
                _store_tail(nst_ptr + row * stride_sn, c, cmask, j, jmask, stride_sc, val)
        else:
            if HAS_SLOTS:
                tl.debug_barrier()  # nst_ptr is st_ptr: every state read of this program first
            _store_tail(nst_ptr + row * stride_sn, c, cmask, j, jmask, stride_sc, val)


@triton.jit
def _store_tail(row_ptr, c, cmask, j, jmask, stride_sc, val):
    """Columns j < W-1 of one state row: val [BT, BC]."""
    tl.store(
        row_ptr + c[None, :] * stride_sc + j[:, None],
        val.to(row_ptr.dtype.element_ty),
        mask=jmask[:, None] & cmask[None, :],
    )


@triton.jit
def _spill_tails(
    x_ptr, st_base, nst_ptr, spill_ptr, start, L, c, cmask, j, jmask,
    stride_xt, stride_sn, stride_sc, W: tl.constexpr,
):  # fmt: skip
    """The tail after each position t of a spilling sequence into row spill[start + t]: inputs
    t-(W-2) .. t, the ones before the chunk from the old tail, which is read into registers
    before a barrier (a spill row may be the sequence's own row)."""
    old = tl.load(st_base + j[:, None], mask=jmask[:, None] & cmask[None, :], other=0.0)
    old = old.to(tl.float32)  # [BT, BC]: column j < W-1 of the old tail
    tl.debug_barrier()
    for t in range(L):
        dst = tl.maximum(tl.load(spill_ptr + start + t), 0).to(tl.int64)
        for i in tl.static_range(W - 1):  # column i: position t - (W-2) + i
            p = c * 0 + (t - (W - 2) + i)  # [BC], all equal
            xi = tl.load(
                x_ptr + (start + p).to(tl.int64) * stride_xt + c,
                mask=cmask & (p >= 0),
                other=0.0,
            ).to(tl.float32)
            si = tl.sum(tl.where(j[:, None] == p[None, :] + W - 1, old, 0.0), axis=0)
            tl.store(
                nst_ptr + dst * stride_sn + c * stride_sc + i,
                tl.where(p >= 0, xi, si).to(nst_ptr.dtype.element_ty),
                mask=cmask,
            )


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    max_len: int | None = None,
    activation: bool = True,
    state_slots: torch.Tensor | None = None,
    spill_slots: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen causal depthwise conv + SiLU with carried state; see the module docstring.

    max_len: the longest sequence (host int), computed from cu_seqlens (a sync) if omitted.
    state_slots: [N] rows of the pool ``state`` to read and update in place (then the returned
    new_state is ``state``); None: ``state`` is [N, C, W-1] and is left unchanged.
    spill_slots: [T] per-token rows of the pool for the states after each position of the
    sequences that spill (-1 elsewhere), with state_slots; None: no sequence spills."""
    T, C = x.shape
    W = weight.shape[1]
    N = cu_seqlens.shape[0] - 1
    assert x.stride(-1) == 1 and weight.shape[0] == C and weight.stride(-1) == 1
    if state_slots is None:
        assert state.shape == (N, C, W - 1)
        state = state.contiguous()
        new_state = torch.empty_like(state)
    else:
        assert state_slots.shape == (N,) and state.shape[1:] == (C, W - 1)
        assert state.stride(-1) == 1
        new_state = state  # updated in place, row state_slots[n]
    if spill_slots is not None:
        assert state_slots is not None and spill_slots.shape == (T,)
    y = torch.empty((T, C), dtype=x.dtype, device=x.device)
    if N == 0:
        return y, new_state
    if max_len is None:
        max_len = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    bt = max(triton.next_power_of_2(W - 1), min(64, triton.next_power_of_2(max(max_len, 1))))
    bc = min(128, triton.next_power_of_2(C))
    grid = (max(1, triton.cdiv(max_len, bt)), N, triton.cdiv(C, bc))
    _conv_kernel[grid](
        x,
        weight,
        state,
        y,
        new_state,
        cu_seqlens,
        cu_seqlens if state_slots is None else state_slots,  # unread without slots
        cu_seqlens if spill_slots is None else spill_slots,  # unread without spill slots
        C,
        x.stride(0),
        y.stride(0),
        weight.stride(0),
        state.stride(0),
        state.stride(1),
        W=W,
        BT=bt,
        BC=bc,
        ACT=activation,
        HAS_SLOTS=state_slots is not None,
        HAS_SPILL=spill_slots is not None,
    )
    return y, new_state


def causal_conv1d_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    activation: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`causal_conv1d` (torch conv1d per sequence, fp32)."""
    W = weight.shape[1]
    y = torch.empty_like(x)
    new_state = torch.empty_like(state)
    for n in range(state.shape[0]):
        a, b = int(cu_seqlens[n]), int(cu_seqlens[n + 1])
        xx = torch.cat([state[n].float(), x[a:b].float().T], dim=1)  # [C, W-1+L]
        new_state[n] = xx[:, -(W - 1) :].to(state.dtype)
        if b == a:
            continue
        out = torch.nn.functional.conv1d(
            xx[None], weight.float()[:, None, :], groups=weight.shape[0]
        )[0]  # [C, L]
        if activation:
            out = torch.nn.functional.silu(out)
        y[a:b] = out.T.to(x.dtype)
    return y, new_state
