"""The decoder skeleton every architecture shares.

    x = embed(tokens)
    for each layer i:   x = x + mixer_i(norm_in(x));   x = x + ffn_i(norm_post(x))
    logits = lm_head(norm_final(x[logit_rows]))         # only rows that want logits

Step inputs: tokens i32[T], positions i32[T], logit_rows i32[R]. With a vision tower
(`vision`, which adds the vision stage and returns its output), positions are 3-axis [3, T] and
`media_embeds` [M, hidden] replace the embeddings of the `media_rows` i32[M] placeholder rows
right after the lookup; the graph's outputs are then logits and the vision stage's output.
Architecture files supply the
mixer (attention or Gated DeltaNet) and ffn (MLP or MoE) per layer, and whether RMSNorm is
zero-centred (y = x/rms(x) * (1 + w), Qwen3.5) or plain (y = x/rms(x) * w).

Hidden-state capture (`add_captures`, CompileOptions.capture) adds per-position outputs [T,
hidden] after the logits (and the vision output), for drafters that read the target's hidden
states (MTP, DFlash): `hidden.final` = norm_final(x) over EVERY position (the logits then read
its rows: same numbers), `hidden.L{i}` = the residual stream after layer i. `meta["capture"]`
maps each captured name ("final", "L{i}") to its output.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ninfer.artifact.model_spec import ModelSpec
from ninfer.errors import ConfigError
from ninfer.ir.builder import GraphBuilder, TensorTable
from ninfer.ir.graph import Graph, Op
from ninfer.ir.types import TensorType

Block = Callable[[GraphBuilder, ModelSpec, int, str], str]


def build_decoder(
    s: ModelSpec,
    tensors: TensorTable,
    dtype: str,
    mixer: Block,
    ffn: Block,
    zero_centered: bool,
    declared: dict[str, str] | None = None,
    vision: Callable[[GraphBuilder], str] | None = None,
) -> Graph:
    b = GraphBuilder(s.architecture, tensors, dtype)
    outputs = [] if vision is None else [vision(b)]
    tokens = b.input("tokens", TensorType("i32", ("T",)))
    b.input("positions", TensorType("i32", ("T",) if vision is None else (3, "T")))
    rows = b.input("logit_rows", TensorType("i32", ("R",)))
    nattr = {"eps": s.eps, "zero_centered": zero_centered}
    embedding = b.sized("model.embed_tokens.weight", s.vocab, "vocab_size")
    x = b.op1("embed", [tokens, embedding], {"dtype": dtype}, "x")
    if vision is not None:
        media = b.input("media_embeds", TensorType(dtype, ("M", s.hidden)))
        media_rows = b.input("media_rows", TensorType("i32", ("M",)))
        x = b.op1("media_merge", [x, media, media_rows], None, "x_media")
    for i in range(s.layers):
        p = f"model.layers.{i}"
        h = b.op1("rmsnorm", [x, b.weight(f"{p}.input_layernorm.weight")], nattr, f"L{i}.h")
        x = b.op1("add", [x, mixer(b, s, i, h)], None, f"L{i}.x_mid")
        h = b.op1(
            "rmsnorm", [x, b.weight(f"{p}.post_attention_layernorm.weight")], nattr, f"L{i}.h_post"
        )
        x = b.op1("add", [x, ffn(b, s, i, h)], None, f"L{i}.x_out")
    last = b.op1("select_rows", [x, rows], None, "x_last")
    h = b.op1("rmsnorm", [last, b.weight("model.norm.weight")], nattr, "h_final")
    head = (
        "model.embed_tokens.weight"
        if s.tie_embeddings or not b.has("lm_head.weight")
        else "lm_head.weight"
    )
    logits = b.op1("logits", [h, b.weight(head)], None, "logits")
    return b.finish(
        [logits, *outputs],
        architecture=s.architecture,
        hybrid=s.is_hybrid,
        vocab=s.vocab,
        hidden=s.hidden,
        layer_types=list(s.layer_types),
        max_position=s.max_position,
        declared=declared or {},
    )


_LAYER = re.compile(r"L(0|[1-9][0-9]*)")


def add_captures(g: Graph, capture: tuple[str, ...]) -> Graph:
    """`g` (as build_decoder made it) with the hidden states `capture` names as extra outputs
    (module docstring); in place, returns `g`. ConfigError for a name that is neither "final"
    nor "L{i}" of an existing layer."""
    if not capture:
        return g
    layers = len(g.meta["layer_types"])
    names: dict[str, str] = {}
    for c in capture:
        m = _LAYER.fullmatch(c)
        if c != "final" and (m is None or int(m.group(1)) >= layers):
            raise ConfigError(
                f"capture {c!r}: name 'final' or a layer 'L0'..'L{layers - 1}' of this"
                f" {layers}-layer model"
            )
        names[c] = f"hidden.{c}"
    prod = g.producer()
    for c, out in names.items():
        if c == "final":  # select_rows(x) -> rmsnorm  ==>  rmsnorm(x) -> select_rows
            i, j = prod["x_last"], prod["h_final"]
            x, rows = g.ops[i].inputs
            norm = g.ops[j]
            g.ops[i] = Op("rmsnorm", (x, norm.inputs[1]), (out,), dict(norm.attrs))
            g.ops[j] = Op("select_rows", (out, rows), ("h_final",), {})
            g.values[out] = g.values[x]
            del g.values["x_last"]
        else:  # the residual stream after the layer, renamed so the output says what it is
            old = f"{c}.x_out"
            g.ops = [
                Op(
                    op.kind,
                    tuple(out if n == old else n for n in op.inputs),
                    tuple(out if n == old else n for n in op.outputs),
                    op.attrs,
                    op.kernel,
                )
                for op in g.ops
            ]
            g.values[out] = g.values.pop(old)
    g.outputs.extend(names.values())
    g.meta["capture"] = names
    return g
