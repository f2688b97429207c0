"""GGUF rope metadata -> the Hugging Face rope config the model specs read, and the q/k row
order of llama.cpp's interleaved rotary undone (convert_gguf)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ninfer.errors import ConvertError

ROPE_FREQS = "rope_freqs.weight"


def freq_factors(src: Any, head_dim: int) -> list[float]:
    """llama.cpp's rope_freqs tensor (Llama 3.1-style rope scaling, precomputed by its
    converter: one divisor per rotary frequency) as the config's `rope_freq_factors`."""
    half = head_dim // 2
    if src.type_name not in ("F32", "F16") or src.shape != (half,):
        raise ConvertError(
            f"{ROPE_FREQS} must be F32 or F16 [{half}] (one factor per rotary frequency), got "
            f"{src.type_name} {list(src.shape)}"
        )
    values = np.asarray(src.data, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(values) & (values > 0)):
        raise ConvertError(f"{ROPE_FREQS} holds a factor that is not a positive number")
    return [float(v) for v in values]


def rope_scaling(scaling: str, get: Callable[..., Any]) -> dict[str, Any]:
    """transformers' rope_scaling for GGUF rope.scaling.* metadata. YaRN maps onto transformers'
    defaults (beta_fast 32, beta_slow 1, attention factor 0.1·ln(factor) + 1), which is what
    llama.cpp computes when the file sets no attention factor of its own; files that do (or a
    yarn_log_multiplier) are refused rather than run with a different attention scale."""
    factor = float(get("rope.scaling.factor") or get("rope.scale_linear") or 1.0)
    if scaling == "linear":
        return {"rope_type": "linear", "factor": factor}
    if scaling == "yarn":
        for key in ("rope.scaling.attn_factor", "rope.scaling.yarn_log_multiplier"):
            if get(key) is not None:
                raise ConvertError(f"unsupported GGUF yarn rope scaling with {key}")
        original = get("rope.scaling.original_context_length") or get("context_length", 4096)
        return {
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": int(original),
        }
    raise ConvertError(f"unsupported GGUF rope scaling {scaling!r} (supported: none, linear, yarn)")


def unpermute_rotary(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved rotary -> rotate-half).

    rows: [n_head * head_dim, ...] in GGUF order. Within each head GGUF row 2i + j holds HF row
    j * head_dim/2 + i; the result puts every row back where Hugging Face has it.
    """
    n = rows.shape[0]
    if n % (2 * n_head):
        raise ConvertError(f"cannot un-permute {n} rotary rows over {n_head} heads")
    half = n // n_head // 2
    return np.ascontiguousarray(
        rows.reshape(n_head, half, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)
    )
