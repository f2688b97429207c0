"""GGUF file -> .ninfer.

Reads a llama.cpp GGUF with the `gguf` package and writes the v3 artifact:

- tensor names mapped to the Hugging Face names of docs/artifact.md
  (`blk.N.attn_q.weight` -> `model.layers.N.self_attn.q_proj.weight`, ...);
- GGUF dims are stored innermost first: a weight GGUF calls [K, N] is the [N, K] matrix of
  Hugging Face, and the reader's numpy view already has the [N, ...] row order;
- qwen3moe stores each layer's experts fused: `ffn_{gate,up,down}_exps` [E, I, H] / [E, H, I]
  (outermost first). They are split into the per-expert tensors convert_hf writes
  (`model.layers.N.mlp.experts.E.gate_proj.weight`, ...), and the router `ffn_gate_inp` becomes
  `mlp.gate`. GGML blocks run along the innermost (row) dim, so expert E's rows are whole blocks
  and quantised experts split exactly, without dequantising;
- llama GGUF stores attn_q / attn_k rows permuted for interleaved rotary
  (per head: rows [0, 2, 4, ..., 1, 3, 5, ...] of the rotate-half layout); they are permuted back.
  Quantised rows are whole GGML blocks, so raw block rows permute exactly;
- without `weights`, F32/F16/BF16 keep their values and gguf_blocks.BLOCK_TYPES keep their
  blocks (format `gguf:<TYPE>`, data uint8 [N, row bytes], dequantised by quant.dequantize);
  with `weights`, tensors are dequantised and stored as convert_hf stores them.

Any other quant type or architecture, or a missing or unreadable file, is a one-line ConvertError;
the output is written to a temporary name and renamed at the end, so it never exists half-written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ninfer.artifact.convert_hf import (
    EMBEDDING,
    LM_HEAD,
    ModelCheck,
    check_fits,
    check_quantize_lm_head,
    quantisable,
    untie,
)
from ninfer.artifact.format import ArtifactWriter, StoredTensor
from ninfer.artifact.generation import from_gguf
from ninfer.artifact.gguf_blocks import BLOCK_TYPES
from ninfer.artifact.gguf_rope import ROPE_FREQS, freq_factors, rope_scaling, unpermute_rotary
from ninfer.artifact.gguf_tokenizer import gguf_tokenizer
from ninfer.artifact.progress import Progress
from ninfer.artifact.quant import (
    WEIGHT_FORMATS,
    bf16_decode,
    bf16_encode,
    dequantize,
    plain,
    quantize,
)
from ninfer.errors import ConvertError

# GGUF general.architecture -> (artifact architecture, HF model_type, HF class)
ARCHITECTURES: dict[str, tuple[str, str, str]] = {
    "llama": ("llama", "llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "qwen3", "Qwen3ForCausalLM"),
    "qwen3moe": ("qwen3_moe", "qwen3_moe", "Qwen3MoeForCausalLM"),
}
PLAIN_TYPES = ("F32", "F16", "BF16")

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    # fused experts [E, ...]: named like the IR's stacked weight, split per expert when written
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
_FUSED_EXPERTS = re.compile(
    r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_proj|up_proj|down_proj)\.weight$"
)
_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
_BIASES = {"qwen2": ("attn_q", "attn_k", "attn_v")}  # biases by arch; others are refused


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor, or None when it has none."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.match(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    return None


def expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF layer-tensor suffix -> the shape the config implies (rows, cols), layers omitted."""
    h, i = config["hidden_size"], config["intermediate_size"]
    q, kv, d = (
        config["num_attention_heads"] * config["head_dim"],
        config["num_key_value_heads"] * config["head_dim"],
        config["head_dim"],
    )
    shapes: dict[str, tuple[int, ...]] = {}
    if "num_experts" in config:
        e, m = config["num_experts"], config["moe_intermediate_size"]
        shapes = {
            "mlp.gate": (e, h),
            "mlp.experts.gate_proj": (e, m, h),
            "mlp.experts.up_proj": (e, m, h),
            "mlp.experts.down_proj": (e, h, m),
        }
    return shapes | {
        "input_layernorm": (h,),
        "post_attention_layernorm": (h,),
        "self_attn.q_proj": (q, h),
        "self_attn.k_proj": (kv, h),
        "self_attn.v_proj": (kv, h),
        "self_attn.o_proj": (h, q),
        "self_attn.q_norm": (d,),
        "self_attn.k_norm": (d,),
        "mlp.gate_proj": (i, h),
        "mlp.up_proj": (i, h),
        "mlp.down_proj": (h, i),
    }


def _check_shape(target: str, shape: tuple[int, ...], config: dict[str, Any]) -> None:
    layers = config["num_hidden_layers"]
    m = re.match(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$", target)
    if m:
        if int(m.group(1)) >= layers:
            raise ConvertError(
                f"tensor {target} lies past the {layers} layers the GGUF metadata declares"
            )
        shapes = expected_shapes(config)
        biased = {_LAYER_NAMES[t] for t in _BIASES.get(config["model_type"], ())}
        if m.group(2) not in shapes or (m.group(3) == "bias" and m.group(2) not in biased):
            raise ConvertError(f"tensor {target} has no place in a {config['model_type']} model")
        expect = shapes[m.group(2)][:1] if m.group(3) == "bias" else shapes[m.group(2)]
    elif target == "model.norm.weight":
        expect = (config["hidden_size"],)
    else:  # embedding and head
        expect = (config["vocab_size"], config["hidden_size"])
    if tuple(shape) != expect:
        raise ConvertError(
            f"tensor {target} has shape {list(shape)} but the GGUF metadata implies {list(expect)}"
        )


def _required(gguf_arch: str, layers: int) -> set[str]:
    """GGUF names every file of this architecture must have (`output.weight` is optional: tied)."""
    per_layer = ["attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output"]
    if gguf_arch == "qwen3moe":  # llama.cpp's qwen3moe has experts in every layer
        per_layer += ["ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
    else:
        per_layer += ["ffn_gate", "ffn_up", "ffn_down"]
    if gguf_arch in ("qwen3", "qwen3moe"):
        per_layer += ["attn_q_norm", "attn_k_norm"]
    names = {"token_embd.weight", "output_norm.weight"}
    names |= {f"blk.{i}.{t}.bias" for i in range(layers) for t in _BIASES.get(gguf_arch, ())}
    return names | {f"blk.{i}.{t}.weight" for i in range(layers) for t in per_layer}


def _natural(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def read_metadata(reader: Any) -> dict[str, Any]:
    """Every GGUF key -> its Python value (arrays as lists, strings decoded)."""
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            meta[key] = field.contents()
        except (UnicodeDecodeError, ValueError, IndexError):
            meta[key] = None
    return meta


@dataclass(frozen=True)
class _Source:
    """One GGUF tensor as the reader gives it."""

    name: str
    type_name: str
    shape: tuple[int, ...]  # logical, outermost first (the Hugging Face shape)
    data: np.ndarray  # F32/F16: values; BF16: uint16; blocks: uint8 [rows..., row bytes]


NUMBER_KEYS = (
    "embedding_length", "block_count", "context_length", "vocab_size", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.key_length",
    "attention.layer_norm_rms_epsilon", "expert_count", "expert_used_count",
    "expert_feed_forward_length", "rope.dimension_count", "rope.freq_base", "rope.scale_linear",
    "rope.scaling.factor", "rope.scaling.original_context_length",
)  # fmt: skip


def _check_numbers(meta: dict[str, Any], gguf_arch: str) -> None:
    """The architecture keys ninfer reads hold single numbers (a string, or an array such as
    per-layer head counts, is refused by name)."""
    for name in NUMBER_KEYS:
        key = f"{gguf_arch}.{name}"
        value = meta.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConvertError(
                f"the GGUF metadata's {key} is {str(value)[:40]!r}: ninfer reads it as one number"
            )


def _config(meta: dict[str, Any], gguf_arch: str, tie: bool, vocab_size: int) -> dict[str, Any]:
    arch, model_type, cls = ARCHITECTURES[gguf_arch]

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{gguf_arch}.{key}", default)

    needed = ["embedding_length", "block_count", "attention.head_count"]
    if arch == "qwen3_moe":
        needed += ["expert_count", "expert_used_count", "expert_feed_forward_length"]
    else:
        needed += ["feed_forward_length"]
    for key in needed:
        if get(key) is None:
            raise ConvertError(f"the GGUF metadata lacks {gguf_arch}.{key}")
    _check_numbers(meta, gguf_arch)
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = get("attention.key_length") or get("rope.dimension_count") or hidden // heads
    rotary = get("rope.dimension_count")
    if rotary is not None and int(rotary) != int(head_dim):
        raise ConvertError(
            f"{gguf_arch}.rope.dimension_count={rotary} rotates part of a {head_dim}-wide head; "
            f"{arch} rotates the whole head"
        )
    scaling = get("rope.scaling.type")
    if scaling is None and float(get("rope.scale_linear", 1.0)) != 1.0:
        scaling = "linear"  # the key older llama.cpp conversions wrote for linear scaling
    config: dict[str, Any] = {
        "architectures": [cls],
        "model_type": model_type,
        "vocab_size": int(get("vocab_size") or vocab_size),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length") or get("expert_feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv") or heads),
        "head_dim": int(head_dim),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 4096)),
        "tie_word_embeddings": tie,
        "hidden_act": "silu",
        "attention_bias": False,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
    }
    if scaling not in (None, "none"):
        config["rope_scaling"] = rope_scaling(scaling, get)
    if arch == "llama":
        config["mlp_bias"] = False
    if arch == "qwen3_moe":
        config |= _moe_config(gguf_arch, int(get("expert_count")), int(get("expert_used_count")))
        config["moe_intermediate_size"] = int(get("expert_feed_forward_length"))
    return config


def _moe_config(gguf_arch: str, experts: int, used: int) -> dict[str, Any]:
    """The Qwen3-MoE keys convert_hf's artifacts carry. llama.cpp's qwen3moe routes every layer
    through experts and always renormalises the top-k weights (norm_topk_prob)."""
    if not 0 < used <= experts:
        raise ConvertError(
            f"the GGUF metadata routes each token to {gguf_arch}.expert_used_count={used} "
            f"of {gguf_arch}.expert_count={experts} experts"
        )
    return {
        "num_experts": experts,
        "num_experts_per_tok": used,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }


def _sources(reader: Any) -> list[_Source]:
    out = []
    for t in reader.tensors:
        type_name = t.tensor_type.name
        if type_name not in PLAIN_TYPES + BLOCK_TYPES:
            raise ConvertError(
                f"tensor {t.name} has unsupported GGUF type {type_name} "
                f"(supported: {', '.join(PLAIN_TYPES + BLOCK_TYPES)})"
            )
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        data = t.data
        if type_name == "BF16":
            data = data.view(np.uint16).reshape(shape)
        out.append(_Source(t.name, type_name, shape, data))
    return out


def _stored_as_is(src: _Source, data: np.ndarray) -> StoredTensor:
    """The source values, exactly: plain dtypes as they are, GGML blocks as raw rows."""
    if src.type_name == "F32":
        return StoredTensor(
            "f32", src.shape, {"data": data.astype(np.float32, copy=False).reshape(src.shape)}
        )
    if src.type_name == "F16":
        return StoredTensor(
            "f16", src.shape, {"data": data.astype(np.float16, copy=False).reshape(src.shape)}
        )
    if src.type_name == "BF16":
        return StoredTensor("bf16", src.shape, {"data": data.reshape(src.shape)})
    rows = int(np.prod(src.shape[:-1], dtype=np.int64)) if len(src.shape) > 1 else 1
    blocks = data.reshape(rows, -1) if len(src.shape) > 1 else data.reshape(1, -1)
    return StoredTensor(f"gguf:{src.type_name}", src.shape, {"data": blocks})


def split_experts(stored: StoredTensor) -> list[StoredTensor]:
    """A fused expert tensor [E, N, K] -> E tensors [N, K] in the same storage format.

    Plain formats slice the values; `gguf:<TYPE>` data is uint8 [E*N, row bytes] and every
    expert owns N whole rows of blocks, so each slice is exact, still-quantised data.
    """
    if len(stored.shape) != 3:
        raise ConvertError(f"fused experts need 3 dims [E, N, K], got shape {list(stored.shape)}")
    experts, rows, cols = stored.shape
    data = stored.parts["data"]
    if stored.format.startswith("gguf:"):
        data = data.reshape(experts, rows, -1)  # [E, N, row bytes]
    return [
        StoredTensor(stored.format, (rows, cols), {"data": np.ascontiguousarray(data[e])})
        for e in range(experts)
    ]


def _split_experts(target: str, stored: StoredTensor) -> list[tuple[str, StoredTensor]]:
    """(artifact name, tensor) pairs: per-expert tensors for a fused expert weight, else itself."""
    m = _FUSED_EXPERTS.match(target)
    if not m:
        return [(target, stored)]
    prefix, proj = m.groups()
    return [(f"{prefix}.{e}.{proj}.weight", part) for e, part in enumerate(split_experts(stored))]


def _requantised(name: str, exact: StoredTensor, weights: str, head: bool) -> StoredTensor:
    """convert_hf's policy: fp8 / nvfp4 for what `quantisable` names (the projections, and the
    head with `head`), other matrices bf16, vectors f32."""
    dense = (
        dequantize(exact)
        if exact.format != "bf16"
        else bf16_decode(exact.parts["data"]).reshape(exact.shape)
    )
    quantised = dense.ndim == 2 and quantisable(name, head)
    if quantised and (weights == "fp8" or (weights == "nvfp4" and dense.shape[1] % 16 == 0)):
        return quantize(dense, weights)
    if weights == "bf16" or dense.ndim == 2:
        return StoredTensor("bf16", tuple(dense.shape), {"data": bf16_encode(dense)})
    return plain(dense, "f32")


def _open(src: Path) -> Any:
    if not src.is_file():
        raise ConvertError(f"{src}: no such file")
    from gguf import GGUFReader

    try:
        return GGUFReader(src, "r")
    except Exception as e:  # noqa: BLE001 -- the reader raises ValueError, struct.error, ... on a bad file
        raise ConvertError(
            f"{src}: not a readable GGUF file ({type(e).__name__}: {e})".splitlines()[0]
        ) from None


def convert_gguf(
    src: str | Path,
    out: str | Path,
    *,
    weights: str | None = None,
    name: str | None = None,
    chat_template: str | None = None,
    progress: bool = False,
    quantize_lm_head: bool = False,
    generation: Mapping[str, float | int] | None = None,
    check_model: ModelCheck | None = None,
) -> Path:
    """Convert the GGUF file `src` to the artifact `out` and return `out`.

    `weights` (bf16 | fp8 | nvfp4) quantises on the way; without it values are exact. `name`
    overrides metadata.name (default: the GGUF general.name, else the file stem);
    `chat_template` (template text) overrides the file's `tokenizer.chat_template`. A progress
    bar goes to stderr when `progress` is set and stderr is a terminal. `quantize_lm_head`: the
    head takes `weights` too (convert_hf's option). `check_model`: see convert_hf.check_fits.
    The generation defaults recorded are the file's `general.sampling.*` keys overlaid by
    `generation` (ninfer/artifact/generation.py).
    """
    src, out = Path(src), Path(out)
    if weights is not None and weights not in WEIGHT_FORMATS:
        raise ConvertError(
            f"--weights {weights}: unknown format (choose from {', '.join(WEIGHT_FORMATS)})"
        )
    check_quantize_lm_head(weights, quantize_lm_head)
    reader = _open(src)
    meta = read_metadata(reader)
    gguf_arch = meta.get("general.architecture")
    if gguf_arch not in ARCHITECTURES:
        raise ConvertError(
            f"{src}: unsupported GGUF architecture {gguf_arch!r} (supported: {', '.join(ARCHITECTURES)})"
        )
    sources = _sources(reader)
    freqs = [s for s in sources if s.name == ROPE_FREQS]
    sources = [s for s in sources if s.name != ROPE_FREQS]
    for s in sources:
        if hf_name(s.name) is None:
            raise ConvertError(f"{src}: unsupported tensor {s.name} for architecture {gguf_arch}")
    tok = gguf_tokenizer(meta)
    names = {s.name for s in sources}
    config = _config(meta, gguf_arch, tie="output.weight" not in names, vocab_size=tok.vocab_size)
    if freqs:
        config["rope_freq_factors"] = freq_factors(freqs[0], config["head_dim"])
    own_head = untie(config, weights, quantize_lm_head)
    # llama.cpp permutes q/k rows (llama only); its qwen converters keep the HF order, biases too
    permute: dict[str, int] = {}
    if gguf_arch == "llama":
        permute = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    for s in sources:
        _check_shape(hf_name(s.name) or s.name, s.shape, config)
    missing = sorted(_required(gguf_arch, config["num_hidden_layers"]) - names, key=_natural)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ConvertError(f"{src}: missing tensor {missing[0]}{more}")
    arch = ARCHITECTURES[gguf_arch][0]
    header = {
        "metadata": {
            "name": name or meta.get("general.name") or src.stem,
            "source": "gguf",
            "source_file": src.name,
            "converter": _converter_version(),
        },
        "architecture": arch,
        "config": config,
        "tokenizer": tok.tokenizer_json,
        "chat_template": chat_template if chat_template is not None else tok.chat_template,
        "special_tokens": tok.special_tokens,
        "generation": {**from_gguf(meta), **(generation or {})},
        "components": ["text"],
    }
    bar = Progress("converting", len(sources), enabled=progress)
    try:
        with ArtifactWriter(out, header) as writer:
            for s in sources:
                target = hf_name(s.name)
                assert target is not None
                data = s.data
                kind = _LAYER_RE.match(s.name)
                if kind and kind.group(2) in permute:
                    data = unpermute_rotary(np.asarray(data), permute[kind.group(2)])
                for part_name, stored in _split_experts(target, _stored_as_is(s, data)):
                    if own_head and part_name == EMBEDDING:
                        writer.add(LM_HEAD, _requantised(LM_HEAD, stored, weights, True))
                    if weights is not None:
                        stored = _requantised(part_name, stored, weights, quantize_lm_head)
                    writer.add(part_name, stored)
                bar.advance()
            check_fits(src, arch, config, writer.tensors, check_model)
    finally:
        bar.done()
    return out


def _converter_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return f"ninfer {version('ninfer')}"
    except PackageNotFoundError:
        return "ninfer"
