"""The MTP (multi-token prediction) head's graph: the `--spec mtp` drafter's own small plan.

Qwen3.5 / Qwen3-Next checkpoints carry one MTP layer under `mtp.*` (as vLLM's
qwen3_next_mtp / qwen3_5 MTP models read them); our trained heads use the same names:

    e = pre_fc_norm_embedding(embed(tokens))         tokens: the NEXT token of each position
    h = pre_fc_norm_hidden(hidden)                   hidden: the target's hidden after its final
                                                     norm at that position (or the head's own
                                                     output, when it drafts past the first token)
    x = fc(concat[e, h])                             mtp.fc.weight [hidden, 2*hidden]
    x = decoder layer (mtp.layers.0.*): one full-attention layer of the target's kind, its own
        paged KV cache kv.L0 (its own pages)
    out = mtp.norm(x)                                output `hidden.final` [T, hidden]
    logits = lm_head(out[logit_rows])                the target's embedding / lm_head, shared

Step inputs: tokens i32[T], positions i32[T], hidden [T, hidden], logit_rows i32[R]. The
concat is computed as fc[:, :H] e + fc[:, H:] h: two views of the stored fc weight (a Shard
along the input dimension), so no concat op is needed. `meta["capture"]` names the output
hidden "final", so an executor keeps it as `executor.hidden["final"]` like a target's.

The head of a vision plan (the target runs its tower, --vision; `s.rope` then carries
`mrope_axes`) reads what the target's text stage reads, as vLLM's Qwen3.5 MTP does (its
drafter's inputs are the multimodal embeddings, one position ahead of the target's, and the
target's 3-axis positions): positions are 3-axis [3, T] and `media_embeds` [M, hidden] replace
the embeddings of the `media_rows` i32[M] rows whose next token is an image or video
placeholder (media_merge), so a placeholder is embedded by the vision tower's output, not by
its pad id's row. The head has no tower: the embeddings are the ones the target's vision stage
computed (ninfer/spec/mtp_media.py); `meta["media"]` says so in the plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ninfer.artifact.model_spec import ModelSpec
from ninfer.ir.builder import GraphBuilder, MissingTensor, TensorTable
from ninfer.ir.graph import Graph, Shard, Weight
from ninfer.ir.models import blocks
from ninfer.ir.ops import SignatureError
from ninfer.ir.types import TensorType

PREFIX = "mtp.layers"
# per architecture: the attention of its layers (qk_norm, gated, zero-centred norms, qkv bias)
_ATTENTION = {
    "llama": (False, False, False, False),
    "qwen2": (False, False, False, True),
    "qwen3": (True, False, False, False),
    "qwen3_moe": (True, False, False, False),
    "qwen3_5": (True, True, True, False),
    "qwen3_5_moe": (True, True, True, False),
}


def has_mtp(tensors: TensorTable) -> bool:
    """Whether the artifact carries an MTP head (its `mtp` component)."""
    return any(t.startswith("mtp.") for t in tensors)


def _fc_half(b: GraphBuilder, s: ModelSpec, index: int) -> str:
    """Columns [index*H, (index+1)*H) of mtp.fc.weight [H, 2H], as a weight of its own."""
    src = "mtp.fc.weight"
    if src not in b.tensors:
        raise MissingTensor(src)
    fmt, shape = b.tensors[src]
    if tuple(shape) != (s.hidden, 2 * s.hidden):
        raise SignatureError(f"{src} is {list(shape)}, expected [{s.hidden}, {2 * s.hidden}]")
    name = f"{src}[{'embed' if index == 0 else 'hidden'}]"
    b.graph.weights[name] = Weight(
        name, TensorType(b.dtype, (s.hidden, s.hidden)), fmt, (src,), "plain", (Shard(1, index, 2),)
    )
    return name


def build_mtp(s: ModelSpec, tensors: TensorTable, dtype: str, logits: bool = True) -> Graph:
    """The MTP head of a model of spec `s` (module docstring). MissingTensor / SignatureError
    when the artifact's `mtp.*` tensors do not make one. Without `logits` (--lm-head-draft:
    the drafter applies a reduced head to the output hidden) the only output is the hidden.
    A rope with `mrope_axes` builds the head of a vision plan (module docstring)."""
    if s.architecture not in _ATTENTION:
        raise SignatureError(f"no MTP head layout for architecture {s.architecture!r}")
    qk_norm, gated, zc, qkv_bias = _ATTENTION[s.architecture]
    b = GraphBuilder(f"{s.architecture}-mtp", tensors, dtype)
    vision = "mrope_axes" in s.rope
    tokens = b.input("tokens", TensorType("i32", ("T",)))
    b.input("positions", TensorType("i32", (3, "T") if vision else ("T",)))
    hidden = b.input("hidden", TensorType(dtype, ("T", s.hidden)))
    rows = b.input("logit_rows", TensorType("i32", ("R",))) if logits else ""
    nattr = {"eps": s.eps, "zero_centered": zc}
    embedding = b.sized("model.embed_tokens.weight", s.vocab, "vocab_size")
    e = b.op1("embed", [tokens, embedding], {"dtype": dtype}, "mtp.embed")
    if vision:  # the target's vision embeddings over the rows whose next token is a placeholder
        media = b.input("media_embeds", TensorType(dtype, ("M", s.hidden)))
        media_rows = b.input("media_rows", TensorType("i32", ("M",)))
        e = b.op1("media_merge", [e, media, media_rows], None, "mtp.embed_media")
    e = b.op1("rmsnorm", [e, b.weight("mtp.pre_fc_norm_embedding.weight")], nattr, "mtp.e_norm")
    h = b.op1("rmsnorm", [hidden, b.weight("mtp.pre_fc_norm_hidden.weight")], nattr, "mtp.h_norm")
    fe = b.op1("linear", [e, _fc_half(b, s, 0)], {"group": "mtp.fc_e", "proj": "fc"}, "mtp.fc_e")
    fh = b.op1("linear", [h, _fc_half(b, s, 1)], {"group": "mtp.fc_h", "proj": "fc"}, "mtp.fc_h")
    x = b.op1("add", [fe, fh], None, "mtp.fc")
    p = f"{PREFIX}.0"
    one = dataclasses.replace(
        s, layers=1, layer_types=("full_attention",), sparse_layers=(bool(s.experts),)
    )
    hn = b.op1("rmsnorm", [x, b.weight(f"{p}.input_layernorm.weight")], nattr, "L0.h")
    attn = blocks.attention(
        b, one, 0, hn, qk_norm=qk_norm, gated=gated, zero_centered=zc, qkv_bias=qkv_bias,
        prefix=PREFIX,
    )  # fmt: skip
    x = b.op1("add", [x, attn], None, "L0.x_mid")
    hn = b.op1("rmsnorm", [x, b.weight(f"{p}.post_attention_layernorm.weight")], nattr, "L0.h_post")
    if s.experts:
        ffn = blocks.moe(b, one, 0, hn, shared=s.shared_inter > 0, prefix=PREFIX)
    else:
        ffn = blocks.mlp(b, one, f"{p}.mlp", "L0", hn, s.mlp_bias, intermediate_size=s.inter)
    x = b.op1("add", [x, ffn], None, "L0.x_out")
    out = b.op1("rmsnorm", [x, b.weight("mtp.norm.weight")], nattr, "hidden.final")
    outputs = [out]
    if logits:
        last = b.op1("select_rows", [out, rows], None, "h_final")
        outputs.insert(0, b.op1("logits", [last, b.weight(lm_head(s, b.has))], None, "logits"))
    g = b.finish(
        outputs,
        architecture=s.architecture,
        hybrid=False,
        vocab=s.vocab,
        hidden=s.hidden,
        layer_types=["full_attention"],
        max_position=s.max_position,
        declared={},
    )
    g.meta["capture"] = {"final": out}
    g.meta["stage"] = "mtp"
    if vision:
        g.meta["media"] = "the target's vision embeddings at next-token placeholders, mrope=3-axis"
    return g


def lm_head(s: ModelSpec, has: Callable[[str], bool]) -> str:
    """The tensor the logits read: the embedding when tied or no head is stored."""
    if s.tie_embeddings or not has("lm_head.weight"):
        return "model.embed_tokens.weight"
    return "lm_head.weight"
