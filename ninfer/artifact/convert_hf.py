"""Hugging Face model directory -> .ninfer.

Reads config.json, safetensors (one file or shards with an index), tokenizer.json,
tokenizer_config.json or chat_template.jinja, generation_config.json, and a vision model's
preprocessor_config.json / video_preprocessor_config.json. Tensor names are
normalised as docs/artifact.md describes; values keep their source dtype unless `weights`
asks for a storage format.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ninfer.artifact.format import ArtifactWriter, StoredTensor
from ninfer.artifact.model_spec import model_spec
from ninfer.artifact.progress import Progress
from ninfer.artifact.quant import WEIGHT_FORMATS, bf16_encode, plain, quantize
from ninfer.errors import ArtifactError, ConvertError

log = logging.getLogger("ninfer.convert")

MODEL_TYPES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3_moe",
    "qwen3_5": "qwen3_5",
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe": "qwen3_5_moe",
    "qwen3_5_moe_text": "qwen3_5_moe",
}

# 2-D weights that `--weights fp8|nvfp4` may quantise: the projections of attention, MLP,
# experts and DeltaNet. Embeddings, routers, norms and small gates stay high precision, and so
# does the head unless `quantize_lm_head` asks for it (as llama.cpp quantises output.weight;
# ModelOpt's nvfp4 checkpoints keep it bf16, hence the default).
_QUANTISABLE = re.compile(
    r"\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|in_proj_qkvz|in_proj_qkv|in_proj_z|out_proj)\.weight$"
)
LM_HEAD = "lm_head.weight"
EMBEDDING = "model.embed_tokens.weight"


def quantisable(name: str, quantize_lm_head: bool = False) -> bool:
    """Whether `--weights fp8|nvfp4` quantises the 2-D weight `name` (an artifact name)."""
    return _QUANTISABLE.search(name) is not None or (quantize_lm_head and name == LM_HEAD)


def untie(config: dict[str, Any], weights: str | None, quantize_lm_head: bool) -> bool:
    """Whether the artifact gets a head of its own, a quantised copy of the tied embedding
    (the embedding itself stays bf16: it is gathered, not multiplied); marks `config` untied."""
    if not (quantize_lm_head and weights in ("fp8", "nvfp4") and config.get("tie_word_embeddings")):
        return False
    config["tie_word_embeddings"] = False
    return True


def check_quantize_lm_head(weights: str | None, quantize_lm_head: bool) -> None:
    if quantize_lm_head and weights not in ("fp8", "nvfp4"):
        raise ConvertError(
            f"--quantize-lm-head needs --weights fp8 or nvfp4 (got {weights or 'none'})"
        )


def _refuse_prequantised(src: Path, config: dict[str, Any]) -> None:
    """A checkpoint whose weights are already quantised (FP8 blocks, AWQ, GPTQ, ModelOpt, ...)
    would convert into a wrong model: its scales are not applied anywhere."""
    qc = config.get("quantization_config")
    if qc:
        method = qc.get("quant_method", "?") if isinstance(qc, dict) else "?"
        raise ConvertError(
            f"{src}: pre-quantised checkpoint (quantization_config, quant_method {method!r}) is "
            "not supported; convert the unquantised checkpoint (--weights fp8 or nvfp4 quantises "
            "it)"
        )


def _head_differs(files: list[Path]) -> bool:
    """A checkpoint marked tied that stores an lm_head different from its embedding."""
    found: dict[str, Any] = {}
    for path in files:
        with _safe_open(path) as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                if normalise_name(name) in (EMBEDDING, LM_HEAD):
                    found[normalise_name(name)] = f.get_tensor(name)
    if len(found) < 2:
        return False
    emb, head = found[EMBEDDING], found[LM_HEAD]
    return emb.shape != head.shape or not bool((emb == head).all())


ModelCheck = Callable[[str, dict[str, Any], dict[str, tuple[str, tuple[int, ...]]]], None]


def check_fits(
    src: Path | str,
    arch: str,
    config: dict[str, Any],
    tensors: dict[str, Any],
    check_model: ModelCheck | None,
) -> None:
    """The written tensors must build the model the config describes, as loading will build
    it: a ConvertError (and no artifact) instead of a file that fails only when served.
    `check_model(arch, config, {name: (format, shape)})` raises ArtifactError when they do not;
    the caller supplies it (ninfer.ir.models.check_tensors: the artifact layer does not import
    the IR builders); None checks nothing beyond what the converter itself reads."""
    if check_model is None:
        return
    table = {n: (t["format"], tuple(t["shape"])) for n, t in tensors.items()}
    try:
        check_model(arch, config, table)
    except ArtifactError as e:
        raise ConvertError(f"{src}: {e}") from None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConvertError(f"{path}: missing") from None
    except ValueError as e:
        raise ConvertError(f"{path}: not valid JSON ({e})") from None


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's config, with a nested `text_config` lifted to the top level."""
    if "text_config" not in config:
        return dict(config)
    out = {k: v for k, v in config.items() if k not in ("text_config",)}
    out.update(config["text_config"])
    out["model_type"] = config.get("model_type", out.get("model_type"))
    for key in ("tie_word_embeddings",):
        if key in config:
            out[key] = config[key]
    return out


def _normalise_keys(config: dict[str, Any]) -> dict[str, Any]:
    """One spelling per concept: transformers 5 writes Qwen3-MoE's expert count as
    `num_local_experts`, Hub checkpoints as `num_experts`."""
    if "num_experts" not in config and "num_local_experts" in config:
        config = dict(config, num_experts=config["num_local_experts"])
    return config


def normalise_name(name: str) -> str:
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model.") :]
    if name.startswith("model.visual."):
        return "visual." + name[len("model.visual.") :]
    return name


def _safetensor_files(src: Path) -> list[Path]:
    index = src / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(_read_json(index).get("weight_map", {}).values()))
        paths = [src / f for f in files]
        for p in paths:
            if not p.exists():
                raise ConvertError(f"{p}: shard named by model.safetensors.index.json is missing")
        return paths
    paths = sorted(src.glob("*.safetensors"))
    if not paths:
        raise ConvertError(f"{src}: no *.safetensors weights found")
    return paths


def _safe_open(path: Path) -> Any:
    """safetensors' reader of `path`; a ConvertError naming the file when it cannot be read
    (truncated, not safetensors)."""
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError) as e:
        raise ConvertError(f"{path}: not a readable safetensors file ({e})") from None


def _iter_tensors(files: list[Path]) -> Iterator[tuple[str, np.ndarray, str]]:
    """Yield (name, float32-or-native array, source dtype) one tensor at a time."""
    for path in files:
        with _safe_open(path) as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                t = f.get_tensor(name)
                dtype = str(t.dtype).removeprefix("torch.")
                if dtype == "bfloat16":
                    # keep the exact bit pattern
                    import torch

                    yield name, t.contiguous().view(torch.int16).numpy().view(np.uint16), "bf16"
                elif dtype in ("float32", "float16"):
                    yield name, t.numpy(), {"float32": "f32", "float16": "f16"}[dtype]
                elif dtype.startswith(("float8", "float4")):
                    raise ConvertError(
                        f"{path}: tensor {name!r} is stored as {dtype}: pre-quantised checkpoints"
                        " are not supported; convert the unquantised checkpoint (--weights fp8 or"
                        " nvfp4 quantises it)"
                    )
                else:
                    yield name, t.float().numpy(), "f32"


def _split_fused_experts(name: str, arr: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """experts.gate_up_proj [E, 2I, H] and experts.down_proj [E, H, I] -> per-expert 2-D weights."""
    m = re.match(r"(.*\.experts)\.(gate_up_proj|down_proj)$", name)
    if not m:
        return [(name, arr)]
    prefix, kind = m.groups()
    out = []
    for e in range(arr.shape[0]):
        if kind == "gate_up_proj":
            inter = arr.shape[1] // 2
            out.append((f"{prefix}.{e}.gate_proj.weight", arr[e, :inter]))
            out.append((f"{prefix}.{e}.up_proj.weight", arr[e, inter:]))
        else:
            out.append((f"{prefix}.{e}.down_proj.weight", arr[e]))
    return out


def _store(
    name: str, arr: np.ndarray, src_fmt: str, weights: str | None, head: bool = False
) -> StoredTensor:
    if weights is None:
        return StoredTensor(src_fmt, tuple(arr.shape), {"data": np.ascontiguousarray(arr)})
    dense = arr if src_fmt != "bf16" else (arr.astype(np.uint32) << 16).view(np.float32)
    dense = np.asarray(dense, dtype=np.float32)
    quantised = weights in ("fp8", "nvfp4") and dense.ndim == 2 and quantisable(name, head)
    if quantised and (weights == "fp8" or dense.shape[1] % 16 == 0):  # nvfp4 needs K % 16 == 0
        return quantize(dense, weights)
    if weights == "bf16" or dense.ndim == 2:
        return StoredTensor("bf16", tuple(dense.shape), {"data": bf16_encode(dense)})
    return plain(dense, "f32")  # norms and other vectors stay exact


# the vision processor's settings, kept with the model they belong to (Artifact.preprocessor)
_PREPROCESSOR_FILES = {
    "image": "preprocessor_config.json",
    "video": "video_preprocessor_config.json",
}


def _preprocessor(src: Path) -> dict[str, Any]:
    return {k: _read_json(src / f) for k, f in _PREPROCESSOR_FILES.items() if (src / f).exists()}


def load_tokenizer(src: Path) -> tuple[str, dict[str, Any], str | None]:
    """(tokenizer.json text, tokenizer_config dict, chat template or None)."""
    tok_path = src / "tokenizer.json"
    if not tok_path.exists():
        raise ConvertError(f"{tok_path}: missing (ninfer needs a `tokenizers` tokenizer.json)")
    tok_json = tok_path.read_text(encoding="utf-8")
    tok_cfg = (
        _read_json(src / "tokenizer_config.json")
        if (src / "tokenizer_config.json").exists()
        else {}
    )
    template = None
    if (src / "chat_template.jinja").exists():
        template = (src / "chat_template.jinja").read_text(encoding="utf-8")
    elif isinstance(tok_cfg.get("chat_template"), str):
        template = tok_cfg["chat_template"]
    return tok_json, tok_cfg, template


def special_tokens(
    tok_json: str, tok_cfg: dict[str, Any], config: dict[str, Any], gen: dict[str, Any]
) -> dict[str, Any]:
    vocab: dict[str, int] = {}
    data = json.loads(tok_json)
    for added in data.get("added_tokens", []):
        vocab[added["content"]] = added["id"]

    def token_text(v: Any) -> str | None:
        if isinstance(v, dict):
            return v.get("content")
        return v

    def tid(text: str | None) -> int | None:
        if text is None:
            return None
        if text in vocab:
            return vocab[text]
        return (
            data.get("model", {}).get("vocab", {}).get(text)
            if isinstance(data.get("model", {}).get("vocab"), dict)
            else None
        )

    eos_ids: list[int] = []
    model_eos = gen.get("eos_token_id")  # as transformers: config.json's only without it
    for source in (
        config.get("eos_token_id") if model_eos is None else model_eos,
        tid(token_text(tok_cfg.get("eos_token"))),  # and the tokenizer's (as vLLM)
    ):
        for v in source if isinstance(source, list) else [source]:
            if isinstance(v, int) and v not in eos_ids:
                eos_ids.append(v)
    bos = token_text(tok_cfg.get("bos_token"))
    return {
        "bos_token": bos,
        "bos_token_id": tid(bos) if bos else config.get("bos_token_id"),
        "eos_token": token_text(tok_cfg.get("eos_token")),
        "eos_token_ids": eos_ids,
        "pad_token_id": tid(token_text(tok_cfg.get("pad_token"))),
        "add_bos": bool(tok_cfg.get("add_bos_token", False)),
    }


def convert_hf(
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
    """`quantize_lm_head`: the head takes `weights` too (a tied one becomes a quantised copy of
    the embedding, and the artifact's config untied). generation_config.json is recorded as the
    generation defaults, with the fields of `generation` (ninfer/artifact/generation.py) set over
    it. `check_model`: see check_fits."""
    src = Path(src)
    if not src.is_dir():
        raise ConvertError(f"{src}: not a directory or .gguf file")
    if weights is not None and weights not in WEIGHT_FORMATS:
        raise ConvertError(
            f"--weights {weights}: unknown format (choose from {', '.join(WEIGHT_FORMATS)})"
        )
    check_quantize_lm_head(weights, quantize_lm_head)
    raw_config = _read_json(src / "config.json")
    config = _normalise_keys(text_config(raw_config))
    _refuse_prequantised(src, config)
    own_head = untie(config, weights, quantize_lm_head)
    model_type = raw_config.get("model_type") or config.get("model_type")
    arch = MODEL_TYPES.get(model_type)
    if arch is None:
        raise ConvertError(
            f"{src}: unsupported architecture {model_type!r} (supported: {', '.join(sorted(set(MODEL_TYPES)))})"
        )
    try:  # the config must read as a supported model, as loading will read it
        model_spec(arch, config)
    except ArtifactError as e:
        raise ConvertError(f"{src}: {e}") from None
    gen = (
        _read_json(src / "generation_config.json")
        if (src / "generation_config.json").exists()
        else {}
    )
    tok_json, tok_cfg, template = load_tokenizer(src)
    if chat_template is not None:
        template = chat_template
    files = _safetensor_files(src)
    header = {
        "metadata": {
            "name": name or raw_config.get("_name_or_path") or src.name,
            "source": "huggingface",
        },
        "architecture": arch,
        "config": config,
        "tokenizer": tok_json,
        "chat_template": template,
        "special_tokens": special_tokens(tok_json, tok_cfg, config, gen),
        "generation": {
            **{
                k: v
                for k, v in gen.items()
                if not k.startswith("_") and k != "transformers_version"
            },
            **(generation or {}),
        },
        "components": ["text"],
    }
    if preprocessor := _preprocessor(src):
        header["preprocessor"] = preprocessor
    if not isinstance(header["metadata"]["name"], str) or "/" in header["metadata"]["name"]:
        header["metadata"]["name"] = name or src.name
    components = {"text"}
    if not own_head and config.get("tie_word_embeddings") and _head_differs(files):
        config["tie_word_embeddings"] = False  # as transformers: a distinct stored head is used
    total = sum(len(_safe_open(p).keys()) for p in files)
    kept = 0  # projections --weights could not quantise (nvfp4 needs K % 16 == 0)
    bar = Progress("converting", total, enabled=progress)
    with ArtifactWriter(out, header) as writer:
        for src_name, arr, src_fmt in _iter_tensors(files):
            bar.advance()
            tname = normalise_name(src_name)
            if tname.startswith("mtp."):
                components.add("mtp")
            elif tname.startswith("visual."):
                components.add("vision")
            if own_head and tname in (EMBEDDING, LM_HEAD):  # a tied checkpoint may hold both
                if LM_HEAD not in writer.tensors:
                    writer.add(LM_HEAD, _store(LM_HEAD, arr, src_fmt, weights, True))
                if tname == LM_HEAD:
                    continue
            for n, a in _split_fused_experts(tname, arr):
                if n in writer.tensors:
                    raise ConvertError(f"{src}: tensor {n!r} appears more than once")
                stored = _store(n, a, src_fmt, weights, quantize_lm_head)
                if weights in ("fp8", "nvfp4") and a.ndim == 2 and stored.format == "bf16":
                    kept += quantisable(n, quantize_lm_head)
                writer.add(n, stored)
        writer.header["components"] = sorted(components, key=["text", "mtp", "vision"].index)
        check_fits(src, arch, config, writer.tensors, check_model)
    bar.done()
    if kept:
        log.warning(
            "%d projection(s) stay bf16: --weights %s needs an input size that is a multiple of 16",
            kept,
            weights,
        )
    return Path(out)
