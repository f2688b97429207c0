"""Shard the model over `tensor_parallel` ranks for rank `tp_rank` (Megatron-style tensor
parallelism). Every rank compiles the same graph with its own rank; the result computes that
rank's part, and the collectives (ops `all_reduce`, `all_gather`) make every rank's residual
stream, and the logits, whole again.

    block        column-parallel (rows split)          row-parallel (columns split)
    attention    q, k, v (+ biases): heads, KV heads   o_proj, then all_reduce
    MLP          gate, up                              down, then all_reduce
    DeltaNet     in_proj qkv (q | k | v each split),   out_proj, then all_reduce
                 z, b, a, conv1d, A_log, dt_bias:
                 key / value heads
    MoE          every expert's gate / up              every expert's down; the shared expert
                 (its intermediate size split)         as the MLP; one all_reduce of the sum
    LM head      vocabulary rows (ceil(V/N) each)      all_gather of the logits: the sampler
                                                       sees the whole vocabulary on every rank
    replicated   embedding, every RMSNorm weight (q/k norms are per head_dim), the router,
                 the shared-expert gate

    x ─▶ norm ─▶ q/k/v (1/N heads) ─▶ attention ─▶ o (1/N of K) ─▶ all_reduce ─▶ + x

A row-parallel bias is kept by rank 0 only (the all_reduce adds it once). MoE experts are
split along their intermediate size rather than spread whole over the ranks: every rank then
does the same work whatever the router picks (no load imbalance at small batch, no token
exchange), and the block needs the same single all_reduce as a dense MLP.

Each rank holds 1/N of the KV heads and of the recurrent state, so choose_kv and plan_memory,
which run after this pass, size the KV pool and the ledger per rank. Refused with a ConfigError
(naming the numbers) when the heads, KV heads, DeltaNet heads or intermediate sizes are not
divisible by N; the vocabulary need not be.
"""

from __future__ import annotations

import re
from typing import Any

from ninfer.errors import ConfigError
from ninfer.ir.graph import Graph, Op, Shard, Weight
from ninfer.ir.ops import infer
from ninfer.passes.base import Pass
from ninfer.passes.options import CompileOptions

_RESIDUAL = re.compile(r"^L\d+\.x_(mid|out)$")  # x + mixer(h), x + ffn(h) of the decoder


def _check(g: Graph, n: int) -> None:
    """ConfigError unless every split dimension divides by `n`."""
    flag = f"--tensor-parallel {n}"
    for op in g.ops:
        a = op.attrs
        if op.kind == "attention" and (a["heads"] % n or a["kv_heads"] % n):
            raise ConfigError(
                f"{flag}: the model has {a['heads']} attention heads and {a['kv_heads']} KV "
                f"heads; both must be divisible by {n}"
            )
        if op.kind == "gated_delta_rule" and (a["k_heads"] % n or a["v_heads"] % n):
            raise ConfigError(
                f"{flag}: the model has {a['k_heads']} Gated DeltaNet key heads and "
                f"{a['v_heads']} value heads; both must be divisible by {n}"
            )
        if op.kind == "moe_experts" and a["inter"] % n:
            raise ConfigError(
                f"{flag}: the experts' intermediate size {a['inter']} is not divisible by {n}"
            )
        if op.kind == "linear" and op.attrs.get("proj") == "down":
            inter = g.weights[op.inputs[1]].type.shape[1]
            if inter % n:
                raise ConfigError(
                    f"{flag}: the MLP intermediate size {inter} is not divisible by {n}"
                )


class _Sharder:
    def __init__(self, g: Graph, options: CompileOptions):
        self.g = g
        self.n, self.r = options.tensor_parallel, options.tp_rank
        self.done: set[str] = set()

    def weight(self, name: str, dim: int, segments: tuple[int, ...] = (), rename: str = "") -> str:
        """Keep this rank's part of every source of weight `name` along source dimension
        `dim` (under the new name `rename` when given, the original staying whole)."""
        w = self.g.weights[name]
        if name in self.done:
            return name
        shard = Shard(dim, self.r, self.n, segments)
        wdim = dim + (1 if w.layout == "stack" else 0)  # stack: [E, *source]
        shape = list(w.type.shape)
        shape[wdim] = shard.size(shape[wdim])
        out = rename or name
        self.g.weights[out] = Weight(
            out, w.type.with_shape(*shape), w.format, w.sources, w.layout,
            (shard,) * len(w.sources),
        )  # fmt: skip
        self.done.add(out)
        return out


def _gdn_segments(g: Graph, group: str) -> tuple[int, ...]:
    """(q, k, v) widths of a DeltaNet layer's qkv projection and conv (`L<i>.…` group)."""
    cache = g.meta["caches"][f"state.{group.split('.')[0]}"]
    vd = cache["v_heads"] * cache["v_dim"]
    kd = (cache["conv_dim"] - vd) // 2
    return (kd, kd, vd)


def _run(graph: Graph, options: CompileOptions) -> Graph:
    g = graph.copy()
    n, rank = options.tensor_parallel, options.tp_rank
    _check(g, n)
    s = _Sharder(g, options)
    producer = g.producer()
    users = g.users()
    ops: list[Op] = []
    reduces = gathers = 0
    for op in g.ops:
        a, kind = op.attrs, op.kind
        group, proj = str(a.get("group", "")), a.get("proj")
        if kind == "add" and len(op.outputs) == 1 and _RESIDUAL.match(op.outputs[0]):
            part = op.inputs[1]
            ops.append(Op("all_reduce", (part,), (f"{part}.reduced",), {"parts": n}))
            op.inputs = (op.inputs[0], f"{part}.reduced")
            reduces += 1
        elif kind == "linear" and group.endswith((".attn_in", ".mlp_in")):
            for w in op.inputs[1:]:
                s.weight(w, 0)
        elif kind == "linear" and group.endswith(".gdn_in"):
            segments = _gdn_segments(g, group) if proj == "qkv" else ()
            for w in op.inputs[1:]:
                s.weight(w, 0, segments)
        elif kind == "linear" and proj in ("o", "down"):
            s.weight(op.inputs[1], 1)
            if len(op.inputs) == 3 and rank != 0:  # the all_reduce adds rank 0's bias once
                op.inputs = op.inputs[:2]
        elif kind == "split_gated_q":
            a["heads"] //= n
        elif kind == "attention":
            a["heads"] //= n
            a["kv_heads"] //= n
        elif kind == "causal_conv1d":
            s.weight(op.inputs[1], 0, _gdn_segments(g, op.outputs[0]))
        elif kind == "split" and g.ops[producer[op.inputs[0]]].kind == "causal_conv1d":
            a["sizes"] = [size // n for size in a["sizes"]]
        elif kind == "gdn_gates":
            for w in op.inputs[2:]:
                s.weight(w, 0)
        elif kind == "gated_delta_rule":
            a["k_heads"] //= n
            a["v_heads"] //= n
        elif kind == "moe_experts":
            s.weight(op.inputs[3], 0)
            s.weight(op.inputs[4], 0)
            s.weight(op.inputs[5], 1)
            a["inter"] //= n
        elif kind == "logits":
            head = op.inputs[1]
            shared = len(users.get(head, [])) > 1  # a tied embedding stays whole for `embed`
            rename = head.removesuffix(".weight") + ".vocab_part.weight" if shared else ""
            vocab = g.weights[head].type.shape[0]
            part = s.weight(head, 0, rename=rename)
            logits = op.outputs[0]
            op.inputs = (op.inputs[0], part)
            op.outputs = (f"{logits}.part",)
            ops.append(op)
            op = Op("all_gather", op.outputs, (logits,), {"parts": n, "size": vocab})
            gathers += 1
        ops.append(op)
    g.ops = ops
    for cache in g.meta["caches"].values():
        if cache["kind"] == "kv":
            cache["kv_heads"] //= n
        else:
            cache["conv_dim"] //= n
            cache["v_heads"] //= n
    _retype(g)
    g.prune()
    g.meta["parallel"] = {"world": n, "rank": rank, "all_reduce": reduces, "all_gather": gathers}
    return g


def _retype(g: Graph) -> None:
    """Recompute every op output's type, in order, from the sharded weights and attrs."""
    values: dict[str, Any] = {}
    for op in g.ops:
        types = infer(op.kind, [values.get(i) or g.type_of(i) for i in op.inputs], op.attrs)
        values.update(zip(op.outputs, types))
    g.values = values


SHARD = Pass("shard", _run, "tensor parallelism: this rank's heads, columns and vocab rows")
