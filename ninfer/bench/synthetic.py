"""Random-weight models of real shapes, made directly on the device (`ninfer bench --synthetic`).

Real weights cannot be downloaded where the GPU is, and nothing large can be carried there, so
the benchmark builds the model in place: a transformers model of the named config, randomly
initialised on the device (bf16), wrapped as an artifact-like source whose tensors are those a
`.ninfer` converted from it would hold — same names (ninfer.artifact.convert_hf), same
formats: with `weights` fp8 or nvfp4 the attention / MLP / DeltaNet projections are quantised
on the device by kernels.quant_gemm's quantisers; norms and vectors stay f32; the rest bf16.

`drafters=("mtp", "dflash")` adds random speculative drafters of the real layouts, as an
artifact with those components holds them: an MTP head (`mtp.*`, ir/models/mtp.py: one layer
of the target's shapes) and a DFlash drafter (`dflash.*` and header["dflash"],
artifact/dflash.py: 5 Qwen3 layers of the target's width, block 16, the published default
target layers), so `--spec mtp` / `--spec dflash` engines can be built on the synthetic model.

The transformers model is returned too: it is the `--peer transformers` side of the benchmark,
running the same random weights (unquantised).

    source, hf_model = build_synthetic("qwen3-8b", "bf16", "cuda")
    plan = compile_artifact(source, options); ex = make_executor(plan, source)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ninfer.artifact.convert_hf import (
    LM_HEAD,
    MODEL_TYPES,
    _split_fused_experts,
    check_quantize_lm_head,
    normalise_name,
    quantisable,
    text_config,
    untie,
)
from ninfer.errors import ConfigError

# HF configs (the fields that differ from each config class's defaults)
SYNTHETIC: dict[str, dict[str, Any]] = {
    "qwen3-8b": {
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
    },
    "qwen3-0.6b": {
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
    },
    # transformers' Qwen3_5TextConfig defaults are the 9B hybrid: 32 layers (3 DeltaNet : 1 gated
    # attention), hidden 4096, 16/4 heads of 256, DeltaNet 16 key / 32 value heads of 128
    "qwen3.5-9b-hybrid": {"model_type": "qwen3_5_text"},
    # the same text model with Qwen3.5's vision tower (transformers' Qwen3_5VisionConfig
    # defaults: 27 blocks, hidden 1152, 16 heads, patch 16, merge 2) projecting to its width
    # (`ninfer bench engine --synthetic qwen3.5-9b-hybrid-vl --images N`)
    "qwen3.5-9b-hybrid-vl": {"model_type": "qwen3_5", "vision_config": {"out_hidden_size": 4096}},
    # for tests: a few MB
    "tiny-qwen3": {
        "model_type": "qwen3", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "tie_word_embeddings": False,
    },
    "tiny-qwen3.5-hybrid": {
        "model_type": "qwen3_5_text", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 16, "linear_value_head_dim": 16,
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    },
    "tiny-qwen3.5-hybrid-vl": {
        "model_type": "qwen3_5", "image_token_id": 508, "video_token_id": 509, "vision_start_token_id": 510,
        "vision_end_token_id": 511,
        "text_config": {
            "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
            "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                "mrope_section": [2, 1, 1]},
        },
        "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 8,
                          "out_hidden_size": 64, "num_position_embeddings": 16},
    },
}  # fmt: skip
WEIGHTS = ("bf16", "fp8", "nvfp4")


@dataclass(frozen=True)
class SyntheticTensor:
    name: str
    format: str
    shape: tuple[int, ...]


class SyntheticSource:
    """Artifact-like: `architecture`, `name`, `config`, `header` / `components` (the drafters',
    see build_synthetic), `tensors`, `name in source`, `info(name)`,
    `device_parts(name, device)` (for the CUDA executor) and `dense(name)` (for the reference
    executor on CPU). Holds its parts on the device it was built on."""

    def __init__(
        self,
        name: str,
        architecture: str,
        config: dict[str, Any],
        parts: dict[str, tuple[str, dict[str, torch.Tensor]]],
        header: dict[str, Any] | None = None,
    ):
        self.name = name
        self.path = name  # what error messages name
        self.architecture = architecture
        self.config = config
        self._parts = parts
        # what the drafters read of an Artifact: components and their configs; no tokenizer
        self.header = dict(header or {})
        self.components = self.header.setdefault("components", ["text"])
        self.tokenizer_json = ""
        self.special_tokens: dict[str, Any] = {}
        self.tensors = {
            n: SyntheticTensor(n, fmt, _logical_shape(fmt, p)) for n, (fmt, p) in parts.items()
        }

    def __contains__(self, name: object) -> bool:
        return name in self._parts

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)

    def info(self, name: str) -> SyntheticTensor:
        return self.tensors[name]

    def device_parts(self, name: str, device: torch.device) -> dict[str, torch.Tensor]:
        return {k: v.to(device) for k, v in self._parts[name][1].items()}

    def dense(self, name: str) -> np.ndarray:
        from ninfer.runtime.executors.cuda.weights import dense_from_parts

        fmt, parts = self._parts[name]
        return dense_from_parts(fmt, parts).cpu().numpy()

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size() for _, p in self._parts.values() for t in p.values()
        )


def _logical_shape(fmt: str, parts: dict[str, torch.Tensor]) -> tuple[int, ...]:
    data = parts["data"]
    if fmt == "nvfp4":
        return (data.shape[0], data.shape[1] * 2)
    return tuple(data.shape)


def hf_config(name: str, overrides: dict[str, Any] | None = None):
    """The transformers config object of synthetic model `name`, with `overrides` (config
    fields, e.g. fewer layers for a drafter of the same width) applied."""
    import transformers

    if name not in SYNTHETIC:
        raise ConfigError(f"--synthetic {name}: unknown model (choose from {', '.join(SYNTHETIC)})")
    kw = dict(SYNTHETIC[name]) | dict(overrides or {})
    model_type = kw.pop("model_type")
    return transformers.AutoConfig.for_model(model_type, **kw)


def _hf_class(model_type: str):
    import transformers as tf

    classes = {"qwen3": tf.Qwen3ForCausalLM, "qwen3_5_text": tf.Qwen3_5ForCausalLM, "llama": tf.LlamaForCausalLM,
               "qwen3_moe": tf.Qwen3MoeForCausalLM, "qwen3_5_moe_text": tf.Qwen3_5MoeForCausalLM,
               "qwen3_5": tf.Qwen3_5ForConditionalGeneration}  # fmt: skip
    return classes[model_type]


def _store(
    name: str, t: torch.Tensor, weights: str, head: bool = False
) -> tuple[str, dict[str, torch.Tensor]]:
    """The storage `convert_hf --weights` (and ``quantize_lm_head=head``) would choose for
    tensor `name`, made on t's device."""
    from kernels.quant_gemm import quantize_weight_fp8, quantize_weight_nvfp4

    if weights in ("fp8", "nvfp4") and t.dim() == 2 and quantisable(name, head):
        if weights == "fp8":
            data, scale = quantize_weight_fp8(t)
            return "fp8", {"data": data, "scale": scale}
        if t.shape[1] % 16 == 0:
            data, scale, gs = quantize_weight_nvfp4(t)
            return "nvfp4", {
                "data": data,
                "scale": scale,
                "global_scale": torch.tensor([gs], device=t.device),
            }
    if t.dim() == 2:
        return "bf16", {"data": t.to(torch.bfloat16).contiguous()}
    return "f32", {"data": t.float().contiguous()}


@torch.no_grad()
def build_synthetic(
    name: str,
    weights: str,
    device: str | torch.device,
    seed: int = 0,
    quantize_lm_head: bool = False,
    overrides: dict[str, Any] | None = None,
    drafters: tuple[str, ...] = (),
) -> tuple[SyntheticSource, Any]:
    """(source, transformers model in bf16 on `device`) of synthetic model `name` (with config
    `overrides`, see hf_config); `quantize_lm_head` as convert_hf's; `drafters` (module
    docstring) are not part of the transformers model."""
    if weights not in WEIGHTS:
        raise ConfigError(f"--weights {weights}: unknown (choose from {', '.join(WEIGHTS)})")
    check_quantize_lm_head(weights, quantize_lm_head)
    cfg = hf_config(name, overrides)
    torch.manual_seed(seed)
    with torch.device(device):
        model = _hf_class(cfg.model_type)(cfg).to(torch.bfloat16).eval()
    config = text_config(cfg.to_dict())
    tied = bool(config.get("tie_word_embeddings"))
    own_head = untie(config, weights, quantize_lm_head)
    parts: dict[str, tuple[str, dict[str, torch.Tensor]]] = {}
    for hf_name, t in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue
        for n, a in _split_fused_experts(normalise_name(hf_name), t):
            parts[n] = _store(n, a, weights, quantize_lm_head)
    if own_head:
        parts[LM_HEAD] = _store(LM_HEAD, model.get_input_embeddings().weight, weights, True)
    arch = MODEL_TYPES[cfg.model_type]
    head = "-qhead" if quantize_lm_head else ""
    label = re.sub(r"[^A-Za-z0-9_.-]", "-", f"synthetic-{name}-{weights}{head}")
    header = _add_drafters(drafters, config, parts, weights, torch.device(device))
    return SyntheticSource(label, arch, config, parts, header), model


def _random(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Random weights: norms near 1, projections N(0, 0.02) (bf16, as checkpoints hold them)."""
    if len(shape) == 1:
        return 1.0 + 0.1 * torch.randn(shape, device=device)
    return (0.02 * torch.randn(shape, device=device)).to(torch.bfloat16)


def _add_drafters(
    drafters: tuple[str, ...],
    config: dict[str, Any],
    parts: dict[str, tuple[str, dict[str, torch.Tensor]]],
    weights: str,
    device: torch.device,
) -> dict[str, Any]:
    """Add the `drafters`' tensors to `parts`; the header (components, drafter configs)."""
    from ninfer.artifact.dflash import DFlashConfig, default_target_layer_ids, layer_tensors

    unknown = [d for d in drafters if d not in ("mtp", "dflash")]
    if unknown:
        raise ConfigError(f"synthetic drafters: unknown {unknown[0]!r} (choose mtp, dflash)")
    header: dict[str, Any] = {"components": ["text", *drafters]}
    hidden, n = int(config["hidden_size"]), int(config["num_hidden_layers"])
    if "mtp" in drafters:  # the converter's names: mtp.*, the layer as the target's first
        types = config.get("layer_types") or ["full_attention"]  # full-attention layer
        p = f"model.layers.{types.index('full_attention')}."
        layer0 = {k.removeprefix(p): v for k, v in parts.items() if k.startswith(p)}
        mtp = {f"mtp.layers.0.{k}": _logical_shape(*v) for k, v in layer0.items()}
        mtp["mtp.fc.weight"] = (hidden, 2 * hidden)
        for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            mtp[f"mtp.{norm}.weight"] = (hidden,)
        for k, shape in mtp.items():  # stored as convert_hf --weights stores them
            parts[k] = _store(k, _random(shape, device).float(), weights)
    if "dflash" in drafters:  # the published config.json of a 5-layer drafter, block 16
        ids = default_target_layer_ids(n, 5)
        if not all(0 <= i < n for i in ids):  # a target too shallow for the default
            ids = list(range(n))
        raw = {
            k: config[k]
            for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                      "num_key_value_heads", "head_dim", "rms_norm_eps", "vocab_size")
            if k in config
        }  # fmt: skip
        raw |= {
            "model_type": "qwen3", "num_hidden_layers": 5, "block_size": 16,
            "num_target_layers": n, "layer_types": ["full_attention"] * 5,
            "rope_theta": (config.get("rope_parameters") or {}).get("rope_theta", 1e6),
            "dflash_config": {"mask_token_id": int(config["vocab_size"]) - 1,
                              "target_layer_ids": ids},
        }  # fmt: skip
        cfg = DFlashConfig.from_config(raw, n, hidden)
        for k, shape in layer_tensors(cfg).items():  # stored as attach_dflash stores them
            parts[f"dflash.{k}"] = _store(f"dflash.{k}", _random(shape, device), "bf16")
        header["dflash"] = raw
    return header
