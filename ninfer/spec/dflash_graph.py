"""The DFlash drafter's block forward as CUDA Graphs of fused kernels (CUDA only; the eager
DFlashModel.forward stays the reference and the CPU path, ninfer/spec/dflash_model.py).

Eager, a round of Qwen3-8B's 5-layer drafter launched ~390 kernels for 1.6 ms of GPU work and
built zeroed per-layer context tensors on the host each round (6.5 ms in all, 1.6x a decode
step). Here a round is one graph replay of ~55 kernels:

    staging  one device buffer [layers, 2 (K, V), P rows, n + C, kv_heads, head_dim]: row b's
             first n entries are its block's own K/V (the graph writes them each round), then
             its context. A sequence keeps its row from round to round and only the context rows
             added or recomputed since are copied in (one copy per row and round, all layers).
    graph    per B rows (B a power of two, B <= P): inputs tokens [B, n], their positions
             [B, n] and context lengths [B] (one host-to-device copy per round; the block's
             staging rows are fixed at capture, so the graph does no index math); body: the
             embedding, per layer kernels.rmsnorm (+ residual) -> fused q/k/v GEMM ->
             kernels.attn_prologue (q/k norm, rope, the block's K/V into its staging rows) ->
             kernels.block_attention (GQA, split over the context, its length read on the
             device) -> o GEMM -> rmsnorm (+ residual) -> fused gate/up GEMM ->
             kernels.silu_mul -> down GEMM; the final norm, the LM head (full, or the reduced
             one of --lm-head-draft) over the n positions, and the argmax of positions
             1 .. n-1 mapped to token ids.
    GEMMs    the launch the H200 sweeps chose for that weight shape and row count
             (ninfer/passes/gemm_launch.py: kernels.gemv for 1-4 rows, the tensor-core skinny
             tiles for 5-16, else cuBLAS); a shape the sweep did not measure (the reduced head)
             takes the skinny tiles of the nearest measured width of the same depth
             (ninfer/spec/gemm.py). With --lm-head-draft the layers' projections are read as
             fp8 rows (ninfer/spec/draft_head.py Fp8Rows: e4m3 bytes and a scale per row,
             half the bytes, kernels/fp8_skinny.py's tiles) for a round of one sequence (16
             rows); wider rounds read the bf16 weights. Drafts may then differ where the bf16
             forward's top two are within the quantisation error; verification, with the
             target's weights, decides the output either way.

A graph is captured on first use of its B; growing P or C reallocates the staging buffer and
drops every graph (captured again on next use), so C grows by doubling. Rounds whose staging
would pass STAGING_MAX_BYTES run eagerly. The graph's outputs are overwritten by its next
replay: callers read them first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from kernels.attn_prologue import attention_prologue
from kernels.block_attention import block_attention, block_splits
from kernels.rmsnorm import rmsnorm
from kernels.silu_mul import silu_mul
from ninfer.spec.dflash_model import DFlashModel
from ninfer.spec.draft_head import Fp8Rows
from ninfer.spec.gemm import dense_gemm

STAGING_MAX_BYTES = 1 << 30  # the eager path's per-round context tensors are as large
MIN_CONTEXT = 256  # the smallest staging context (C): fewer early reallocations
FP8_LAYER_ROWS = 16  # fp8 layer rows serve one sequence's block; wider rounds read bf16


class Staged(Protocol):
    """What the staging buffer knows of one sequence's context (the drafter's per-sequence
    state carries it): its row there and how many of its context rows that row holds as they
    are now (the drafter lowers it when it cuts the context)."""

    slot: int | None
    synced: int


@dataclass
class _Graph:
    rows: int
    graph: Any  # torch.cuda.CUDAGraph; None: not captured (the body runs each round)
    host: torch.Tensor  # pinned int64 [rows * (2n + 1)]: tokens, their positions, lengths
    device: torch.Tensor  # its device copy, the graph's input
    copied: Any  # torch.cuda.Event: the last host-to-device copy has read `host` (captured)
    slots: torch.Tensor  # [rows * n] the block's staging rows (read by the graph)
    ids: torch.Tensor  # [rows, n - 1] int64: the argmax draft of each position
    logits: torch.Tensor  # [rows * n, V]: the head's logits (V: the reduced head's rows)


def _pow2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


class DFlashGraphs:
    """CUDA Graphs of `model`'s block forward (module docstring). Fuses each layer's q/k/v and
    gate/up weights into one tensor and points model.w's entries at views of them (the same
    values: the eager forward and context_kv read them unchanged)."""

    def __init__(self, model: DFlashModel, capture: bool = True, fp8_layers: bool = False) -> None:
        """`capture` False: each round runs the graph body eagerly instead of replaying it
        (the same kernels: a CPU test runs them under the Triton interpreter). `fp8_layers`
        (--lm-head-draft on CUDA): the layers' projections also as fp8 rows (module
        docstring)."""
        self.m = model
        self.capture = capture and model.device.type == "cuda"
        s = model.cfg.spec
        self.n = model.cfg.block_size
        self.kv_heads, self.head_dim = s.kv_heads, s.head_dim
        w = model.w
        self.qkv, self.gate_up = [], []
        for i in range(s.layers):
            p = f"layers.{i}"
            self.qkv.append(_fuse(w, [f"{p}.self_attn.{x}_proj.weight" for x in "qkv"]))
            self.gate_up.append(_fuse(w, [f"{p}.mlp.{x}_proj.weight" for x in ("gate", "up")]))
        # fp8 copies of the projections, keyed by the weight (bf16 rows: the eager forward's)
        self._fp8: dict[tuple[int, tuple[int, ...]], Fp8Rows] = {}
        if fp8_layers:
            for i in range(s.layers):
                p = f"layers.{i}"
                for wt in (self.qkv[i], w[f"{p}.self_attn.o_proj.weight"], self.gate_up[i],
                           w[f"{p}.mlp.down_proj.weight"]):  # fmt: skip
                    self._fp8[_key(wt)] = Fp8Rows(wt, fp8=True, fp8_max_rows=FP8_LAYER_ROWS)
        self.inv = model._inv.float().contiguous()
        elt = torch.empty((), dtype=model.dtype).element_size()
        self._row_bytes = s.layers * 2 * s.kv_heads * s.head_dim * elt  # per staged position
        self._ar = np.arange(self.n)
        self._buf: torch.Tensor | None = None  # the staging buffer
        self._P = self._C = 0
        self._owner: list[Staged | None] = []
        self._graphs: dict[int, _Graph] = {}
        self._pool = None
        # event records on the hot path take the stream (current_stream() is slow Python)
        self._stream = torch.cuda.current_stream(model.device) if self.capture else None
        self.rounds = 0  # rounds replayed from a graph (tests)
        self.captures = 0

    # -- staging -------------------------------------------------------------------------
    def _need(self, rows: int, context: int) -> tuple[int, int]:
        return max(self._P, _pow2(rows)), max(self._C, _pow2(max(context, MIN_CONTEXT)))

    def fits(self, rows: int, context: int) -> bool:
        """Whether a round of `rows` rows of up to `context` context rows stays within
        STAGING_MAX_BYTES (else the caller runs it eagerly)."""
        P, C = self._need(rows, context)
        return P * (self.n + C) * self._row_bytes <= STAGING_MAX_BYTES

    def _ensure(self, rows: int, context: int) -> None:
        P, C = self._need(rows, context)
        if self._buf is not None and (P, C) == (self._P, self._C):
            return
        for st in self._owner:
            if st is not None:
                st.slot, st.synced = None, 0
        self._graphs.clear()  # they read the old buffer
        self._buf = None
        s = self.m.cfg.spec
        shape = (s.layers, 2, P, self.n + C, self.kv_heads, self.head_dim)
        self._buf = torch.zeros(shape, dtype=self.m.dtype, device=self.m.device)
        self._P, self._C = P, C
        self._owner = [None] * P
        self._pool = torch.cuda.graph_pool_handle() if self.capture else None

    def release(self, st: Staged) -> None:
        """A sequence finished: its staging row is free."""
        if st.slot is not None and st.slot < len(self._owner) and self._owner[st.slot] is st:
            self._owner[st.slot] = None
        st.slot, st.synced = None, 0

    def _stage(self, b: int, st: Staged, kv: torch.Tensor | None, c: int) -> None:
        """Row b holds st's context rows [0, c) (kv [layers, 2, >= c, width]) after this."""
        if self._owner[b] is not st:
            old = self._owner[b]
            if old is not None:
                old.slot, old.synced = None, 0
            if st.slot is not None and self._owner[st.slot] is st:
                self._owner[st.slot] = None
            self._owner[b], st.slot, st.synced = st, b, 0
        if st.synced < c:
            lo = st.synced
            dst = self._buf[:, :, b, self.n + lo : self.n + c]
            dst.copy_(kv[:, :, lo:c].unflatten(-1, (self.kv_heads, self.head_dim)))
        st.synced = c

    # -- rounds --------------------------------------------------------------------------
    def run(
        self, rows: list[tuple[Staged, torch.Tensor | None, int, int, int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One round for `rows` (staging state, context K/V [layers, 2, cap, width], context
        rows n, last committed token, its position): (ids [B', n - 1], logits [B' * n, V]),
        B' >= len(rows) (rows past len(rows) are padding). Valid until the next call."""
        B = len(rows)
        self._ensure(B, max(r[2] for r in rows))
        for b, (st, kv, c, _, _) in enumerate(rows):
            self._stage(b, st, kv, c)
        g = self._graphs.get(_pow2(B)) or self._capture(_pow2(B))
        if g.copied is not None:
            g.copied.synchronize()  # the previous round's copy has read the pinned buffer
        h = g.host.numpy()
        R, n = g.rows, self.n
        h[: R * n] = self.m.cfg.mask_token_id
        h[R * n :] = 0
        for b, (_, _, c, token, pos) in enumerate(rows):
            h[b * n] = token
            np.add(self._ar, pos, out=h[R * n + b * n : R * n + (b + 1) * n])
            h[2 * R * n + b] = c
        g.device.copy_(g.host, non_blocking=True)
        if g.graph is None:
            g.ids, g.logits = self._forward(g.device, g.slots, R)
            self.rounds += 1
            return g.ids, g.logits
        g.copied.record(self._stream)
        g.graph.replay()
        self.rounds += 1
        return g.ids, g.logits

    def _capture(self, R: int) -> _Graph:
        n = self.n
        host = torch.zeros(R * (2 * n + 1), dtype=torch.int64, pin_memory=self.capture)
        host[: R * n] = self.m.cfg.mask_token_id
        dev = host.to(self.m.device)
        slots = torch.arange(R * n, device=self.m.device)
        slots += (slots // n) * self._C  # row b's block: staging rows [b, 0 : n)
        if not self.capture:
            g = _Graph(R, None, host, dev, None, slots, *self._forward(dev, slots, R))
            self._graphs[R] = g
            return g
        side = torch.cuda.Stream(self.m.device)
        side.wait_stream(torch.cuda.current_stream(self.m.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # compile every kernel variant before capture
                self._forward(dev, slots, R)
        torch.cuda.current_stream(self.m.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            ids, logits = self._forward(dev, slots, R)
        g = _Graph(R, graph, host, dev, torch.cuda.Event(), slots, ids, logits)
        g.copied.record()
        self._graphs[R] = g
        self.captures += 1
        return g

    def _forward(
        self, dev: torch.Tensor, slots: torch.Tensor, R: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The graph body (module docstring) over the input buffer `dev` (tokens, positions,
        lengths) with the block's staging rows `slots`."""
        m, s, n = self.m, self.m.cfg.spec, self.n
        T, H, Hkv, D = R * n, s.heads, s.kv_heads, s.head_dim
        tokens, positions, lengths = dev[:T], dev[T : 2 * T], dev[2 * T :]
        splits = block_splits(n + self._C, R * Hkv)
        w = m.w
        x = F.embedding(tokens, m.embed)
        res = None
        for i in range(s.layers):
            p = f"layers.{i}"
            h, res = rmsnorm(x, w[f"{p}.input_layernorm.weight"], s.eps, residual=res)
            qkv = self._mm(h, self.qkv[i])
            q = attention_prologue(
                qkv[:, : H * D].unflatten(-1, (H, D)),
                qkv[:, H * D : (H + Hkv) * D].unflatten(-1, (Hkv, D)),
                qkv[:, (H + Hkv) * D :].unflatten(-1, (Hkv, D)),
                positions, self.inv,
                q_norm_w=w[f"{p}.self_attn.q_norm.weight"], k_norm_w=w[f"{p}.self_attn.k_norm.weight"],
                eps=s.eps, slots=slots, k_cache=self._buf[i, 0], v_cache=self._buf[i, 1],
                scale=m._scale,
            )  # fmt: skip
            o = block_attention(
                q, self._buf[i, 0], self._buf[i, 1], lengths, n, scale=D**-0.5, splits=splits
            )
            a = self._mm(o.view(T, H * D), w[f"{p}.self_attn.o_proj.weight"])
            h, res = rmsnorm(a, w[f"{p}.post_attention_layernorm.weight"], s.eps, residual=res)
            x = self._mm(silu_mul(self._mm(h, self.gate_up[i])), w[f"{p}.mlp.down_proj.weight"])
        y, _ = rmsnorm(x, w["norm.weight"], s.eps, residual=res)
        logits = self._mm(y, m.head) if m.draft_head is None else m.draft_head.logits(y)
        best = logits.view(R, n, -1)[:, 1:].argmax(dim=-1)
        ids = best if m.draft_ids is None else m.draft_ids[best]
        return ids, logits

    def _mm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        rows = self._fp8.get(_key(w))
        if rows is not None:
            return rows(x)
        return dense_gemm(w.shape[0], w.shape[1], x.shape[0])(x, w)


def _key(w: torch.Tensor) -> tuple[int, tuple[int, ...]]:
    return w.data_ptr(), tuple(w.shape)


def _fuse(w: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    """One [sum N, K] tensor of the weights `names`; w's entries become views of it."""
    fused = torch.cat([w[name] for name in names], dim=0)
    at = 0
    for name in names:
        rows = w[name].shape[0]
        w[name] = fused[at : at + rows]
        at += rows
    return fused
