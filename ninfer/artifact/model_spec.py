"""ModelSpec: the few numbers a builder needs, read once from a Hugging Face text config.

The artifact stores the HF config flattened (docs/artifact.md); this file is the one place
that knows its key names and defaults (rope_parameters vs the older rope_theta/rope_scaling,
num_experts vs num_local_experts, layer_types vs full_attention_interval).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ninfer.errors import ArtifactError

ROPE_TYPES = ("default", "linear", "llama3", "yarn")
MLP_ACTIVATIONS = ("silu", "swish")  # every builder's MLP is SwiGLU

# What transformers' config classes put in place of a key the config.json leaves out, where
# that differs between architectures (None: derived, hidden // heads or heads). A checkpoint
# saved by those classes always holds the keys; one written by hand may not.
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"head_dim": None, "num_key_value_heads": None, "max_position_embeddings": 2048},
    "qwen2": {"head_dim": None, "num_key_value_heads": 32},
    "qwen3": {"head_dim": 128, "num_key_value_heads": 32},
    "qwen3_moe": {"head_dim": None, "num_key_value_heads": 4, "norm_topk_prob": False},
    "qwen3_5": {"head_dim": 256, "num_key_value_heads": 4, "partial_rotary_factor": 0.25},
    "qwen3_5_moe": {"head_dim": 256, "num_key_value_heads": 2, "partial_rotary_factor": 0.25},
}


@dataclass(frozen=True)
class ModelSpec:
    architecture: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    eps: float
    tie_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    rope: dict[str, Any]  # {"type", "theta", ...scaling fields}; JSON-able for op attrs
    rotary_dim: int
    layer_types: tuple[str, ...]  # "full_attention" | "linear_attention" per layer
    max_position: int
    # MoE
    experts: int = 0
    top_k: int = 0
    moe_inter: int = 0
    norm_topk: bool = True
    sparse_layers: tuple[bool, ...] = ()
    shared_inter: int = 0
    # Gated DeltaNet
    lin_k_heads: int = 0
    lin_v_heads: int = 0
    lin_k_dim: int = 0
    lin_v_dim: int = 0
    conv_kernel: int = 0

    @property
    def is_hybrid(self) -> bool:
        return "linear_attention" in self.layer_types


def _get(cfg: dict[str, Any], key: str, *alts: str, default: Any = None) -> Any:
    for k in (key, *alts):
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    if default is None:
        raise ArtifactError(f"model config lacks {key!r}")
    return default


def _rope(cfg: dict[str, Any]) -> dict[str, Any]:
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    rtype = params.get("rope_type", params.get("type", "default")) or "default"
    if rtype not in ROPE_TYPES:
        raise ArtifactError(
            f"rope type {rtype!r} is not supported (supported: {', '.join(ROPE_TYPES)})"
        )
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or not theta > 0:
        raise ArtifactError(f"rope_theta must be a positive number, got {theta!r}")
    rope: dict[str, Any] = {"type": rtype, "theta": float(theta)}
    if rtype == "linear":
        rope["factor"] = float(params["factor"])
    if rtype == "llama3":
        for k in (
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        ):
            rope[k] = params[k]
    if rtype == "yarn":
        rope.update(_yarn(cfg, params))
    factors = cfg.get("rope_freq_factors")
    if factors is not None:  # a GGUF's rope_freqs tensor (convert_gguf): per-frequency divisors
        if not isinstance(factors, list) or not all(
            isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0 for f in factors
        ):
            raise ArtifactError("rope_freq_factors must be a list of positive numbers")
        rope["freq_factors"] = [float(f) for f in factors]
    return rope


def _mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(cfg: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """YaRN fields, defaults resolved as transformers' `_compute_yarn_parameters` resolves them:
    factor (None -> max_position / original), beta_fast 32, beta_slow 1, truncate True, and
    attention_factor (the cos/sin multiplier) from factor, mscale and mscale_all_dim."""
    orig = cfg.get("original_max_position_embeddings") or params.get(
        "original_max_position_embeddings"
    )
    orig = int(orig or _get(cfg, "max_position_embeddings"))
    if orig <= 0:
        raise ArtifactError(f"yarn original_max_position_embeddings must be positive, got {orig}")
    factor = params.get("factor")
    if factor is None:
        factor = float(_get(cfg, "max_position_embeddings")) / orig
    factor = float(factor)
    if factor <= 0:
        raise ArtifactError(f"yarn rope factor must be positive, got {factor}")
    attn = params.get("attention_factor")
    if attn is None:
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all:
            attn = _mscale(factor, float(mscale)) / _mscale(factor, float(mscale_all))
        else:
            attn = _mscale(factor)
    return {
        "factor": factor,
        "original_max_position_embeddings": orig,
        "beta_fast": float(params.get("beta_fast") or 32),
        "beta_slow": float(params.get("beta_slow") or 1),
        "truncate": bool(params.get("truncate", True)),
        "attention_factor": float(attn),
    }


def _layer_types(architecture: str, cfg: dict[str, Any], layers: int) -> tuple[str, ...]:
    """Each layer's attention kind, as transformers derives it: hybrid models from layer_types or
    full_attention_interval; Llama full attention; Qwen2/Qwen3 from layer_types, or a sliding
    window when the config asks for one (use_sliding_window: Qwen2/Qwen3 from max_window_layers on,
    Qwen3-MoE every layer), which no kernel here implements."""
    hybrid = architecture in ("qwen3_5", "qwen3_5_moe")
    types = cfg.get("layer_types") if architecture != "llama" else None
    if hybrid and not types:
        interval = int(cfg.get("full_attention_interval", 4))
        types = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(layers)
        ]
    elif not types:
        window = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window") else None
        if architecture not in ("qwen2", "qwen3", "qwen3_moe"):
            window = None
        first = int(cfg.get("max_window_layers", 28)) if architecture != "qwen3_moe" else 0
        types = [
            "sliding_attention" if window is not None and i >= first else "full_attention"
            for i in range(layers)
        ]
    if len(types) < layers:
        raise ArtifactError(f"layer_types has {len(types)} entries for {layers} layers")
    types = tuple(types[:layers])
    allowed = ("full_attention", "linear_attention") if hybrid else ("full_attention",)
    for i, kind in enumerate(types):
        if kind not in allowed:
            window = cfg.get("sliding_window")
            detail = f" (sliding_window {window})" if kind == "sliding_attention" else ""
            raise ArtifactError(
                f"layer {i} is {kind!r}{detail}: {architecture} supports "
                f"{' and '.join(allowed)} layers only"
            )
    return types


def model_spec(architecture: str, cfg: dict[str, Any]) -> ModelSpec:
    """Read a ModelSpec; raises ArtifactError naming a missing or unsupported config field."""
    hidden = int(_get(cfg, "hidden_size"))
    layers = int(_get(cfg, "num_hidden_layers"))
    heads = int(_get(cfg, "num_attention_heads"))
    defaults = DEFAULTS.get(architecture, {})
    kv_default = defaults.get("num_key_value_heads") or heads
    kv_heads = int(_get(cfg, "num_key_value_heads", default=kv_default))
    head_dim = int(cfg.get("head_dim") or defaults.get("head_dim") or hidden // heads)
    act = cfg.get("hidden_act") or "silu"
    if act not in MLP_ACTIVATIONS:
        raise ArtifactError(f"hidden_act {act!r} is not supported (the MLP is SwiGLU: silu)")
    rope = _rope(cfg)
    params = cfg.get("rope_parameters") or {}
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    partial = float(defaults.get("partial_rotary_factor", 1.0) if partial is None else partial)
    types = _layer_types(architecture, cfg, layers)
    rotary_dim = int(head_dim * partial) // 2 * 2
    if len(rope.get("freq_factors", ())) not in (0, rotary_dim // 2):
        raise ArtifactError(
            f"rope_freq_factors has {len(rope['freq_factors'])} entries, the rotary dimension "
            f"{rotary_dim} needs {rotary_dim // 2}"
        )
    hybrid = architecture in ("qwen3_5", "qwen3_5_moe")
    moe: dict[str, Any] = {}
    if architecture in ("qwen3_moe", "qwen3_5_moe"):
        experts = int(_get(cfg, "num_experts", "num_local_experts"))
        step = int(cfg.get("decoder_sparse_step", 1) or 1)
        mlp_only = set(cfg.get("mlp_only_layers") or [])
        sparse = tuple(
            architecture == "qwen3_5_moe"
            or (i not in mlp_only and experts > 0 and (i + 1) % step == 0)
            for i in range(layers)
        )
        moe = {
            "experts": experts,
            "top_k": int(_get(cfg, "num_experts_per_tok")),
            "moe_inter": int(_get(cfg, "moe_intermediate_size")),
            "norm_topk": bool(cfg.get("norm_topk_prob", defaults.get("norm_topk_prob", True)))
            if architecture == "qwen3_moe"
            else True,
            "sparse_layers": sparse,
            "shared_inter": int(cfg.get("shared_expert_intermediate_size") or 0)
            if architecture == "qwen3_5_moe"
            else 0,
        }
    lin: dict[str, Any] = {}
    if hybrid:
        lin = {
            "lin_k_heads": int(_get(cfg, "linear_num_key_heads")),
            "lin_v_heads": int(_get(cfg, "linear_num_value_heads")),
            "lin_k_dim": int(_get(cfg, "linear_key_head_dim")),
            "lin_v_dim": int(_get(cfg, "linear_value_head_dim")),
            "conv_kernel": int(_get(cfg, "linear_conv_kernel_dim", default=4)),
        }
    return ModelSpec(
        architecture=architecture,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        inter=int(cfg.get("intermediate_size") or 0),
        vocab=int(_get(cfg, "vocab_size")),
        eps=float(_get(cfg, "rms_norm_eps", default=1e-6)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        rope=rope,
        rotary_dim=rotary_dim,
        layer_types=types,
        max_position=int(
            cfg.get("max_position_embeddings") or defaults.get("max_position_embeddings", 32768)
        ),
        **moe,
        **lin,
    )
