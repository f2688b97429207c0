"""DFlash drafters for the tiny fixtures, in the published checkpoint layout.

    dflash_config(target_config, ...)     a drafter config.json (model_type qwen3, block_size,
                                          num_target_layers, dflash_config.target_layer_ids /
                                          mask_token_id) sized for a target config
    random_state(config, seed)            seeded random weights under the published names (fc,
                                          hidden_norm, layers.N.*, norm), norms moved off 1
    save_hf(out, config, state)           config.json + model.safetensors
    build_dflash_fixture(target, root)    root/<stem>-dflash.ninfer: the target artifact with a
                                          random drafter attached by `attach_dflash` (the path
                                          `ninfer convert --dflash` takes); built once, reused

The mask token is the tokenizer's pad token (never a real output of the fixtures).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from artifacts.tokenizer import PAD_TOKEN, build_tokenizer, token_id


def dflash_config(
    target: dict[str, Any],
    *,
    layers: int = 1,
    block_size: int = 8,
    target_layer_ids: list[int] | None = None,
    intermediate_size: int | None = None,
) -> dict[str, Any]:
    """A drafter config.json for the target whose (flattened HF) config is `target`."""
    n = int(target["num_hidden_layers"])
    ids = target_layer_ids if target_layer_ids is not None else list(range(n))
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": target["hidden_size"],
        "intermediate_size": intermediate_size or target["intermediate_size"],
        "num_hidden_layers": layers,
        "num_attention_heads": target["num_attention_heads"],
        "num_key_value_heads": target["num_key_value_heads"],
        "head_dim": target.get("head_dim")
        or target["hidden_size"] // target["num_attention_heads"],
        "hidden_act": "silu",
        "rms_norm_eps": target.get("rms_norm_eps", 1e-6),
        "rope_theta": (target.get("rope_parameters") or {}).get("rope_theta")
        or target.get("rope_theta", 1_000_000.0),
        "rope_scaling": None,
        "max_position_embeddings": target.get("max_position_embeddings", 4096),
        "attention_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": target["vocab_size"],
        "layer_types": ["full_attention"] * layers,
        "block_size": block_size,
        "num_target_layers": n,
        "dflash_config": {
            "mask_token_id": token_id(build_tokenizer(), PAD_TOKEN),
            "target_layer_ids": ids,
        },
    }


def state_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Published tensor name -> shape for `config`."""
    from ninfer.artifact.dflash import DFlashConfig, layer_tensors

    ids = config["dflash_config"]["target_layer_ids"]
    cfg = DFlashConfig.from_config(config, config["num_target_layers"], config["hidden_size"])
    assert len(cfg.target_layer_ids) == len(ids)
    return layer_tensors(cfg)


def random_state(config: dict[str, Any], seed: int, std: float = 0.08) -> dict[str, Any]:
    """Seeded random weights: projections N(0, std), norm weights 1 + N(0, 0.1)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in state_shapes(config).items():
        if len(shape) == 1:
            out[name] = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:
            out[name] = std * torch.randn(shape, generator=gen)
    return out


def save_hf(
    out: Path, config: dict[str, Any], state: dict[str, Any], dtype: str = "float32"
) -> Path:
    """Write a drafter directory in the published layout (weights in `dtype`: float32 or
    bfloat16, as the published checkpoints)."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tensors = {k: v.detach().to(getattr(torch, dtype)).contiguous() for k, v in state.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def build_dflash_fixture(
    target: str | os.PathLike[str], root: str | os.PathLike[str], seed: int = 7, **shape: Any
) -> Path:
    """root/<target stem>-dflash.ninfer: `target` with a random drafter attached (once)."""
    from ninfer.artifact.dflash import attach_dflash
    from ninfer.artifact.format import Artifact

    root, target = Path(root), Path(target)
    out = root / f"{target.stem}-dflash.ninfer"
    if out.exists():
        return out
    config = dflash_config(Artifact(target).config, **shape)
    hf = save_hf(
        root / f".{target.stem}-dflash-hf.{os.getpid()}", config, random_state(config, seed)
    )
    tmp = root / f".{out.name}.{os.getpid()}.tmp"
    attach_dflash(target, hf, tmp)
    os.replace(tmp, out)
    shutil.rmtree(hf, ignore_errors=True)
    return out
