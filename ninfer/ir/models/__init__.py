"""Builders that turn an artifact's architecture + config into a graph."""

from __future__ import annotations

import dataclasses
from typing import Any

from ninfer.artifact.model_spec import ModelSpec, model_spec
from ninfer.errors import ArtifactError, ConfigError
from ninfer.ir.builder import MissingTensor, TensorTable
from ninfer.ir.graph import Graph
from ninfer.ir.models import llama, qwen2, qwen3, qwen3_5, qwen3_5_vision
from ninfer.ir.models.decoder import add_captures
from ninfer.ir.models.mtp import build_mtp, has_mtp
from ninfer.ir.ops import SignatureError

BUILDERS = {
    "llama": llama.build,
    "qwen2": qwen2.build,
    "qwen3": qwen3.build,
    "qwen3_moe": qwen3.build,
    "qwen3_5": qwen3_5.build,
    "qwen3_5_moe": qwen3_5.build,
}


VISION_ARCHITECTURES = ("qwen3_5", "qwen3_5_moe")


def _check_vision(architecture: str, tensors: TensorTable) -> None:
    """ConfigError unless the artifact has a vision tower this build runs (--vision)."""
    if architecture not in VISION_ARCHITECTURES or not any(
        t.startswith("visual.") for t in tensors
    ):
        raise ConfigError(
            f"--vision needs the artifact's vision component, which this {architecture} artifact "
            "lacks; drop --vision or convert a checkpoint with a vision tower"
        )


def build_graph(
    architecture: str,
    config: dict[str, Any],
    tensors: TensorTable,
    dtype: str = "f32",
    vision: bool = False,
    capture: tuple[str, ...] = (),
) -> Graph:
    """The unfused graph of one step. ArtifactError when the config or tensors do not fit;
    ConfigError for `vision` (--vision) on an artifact without a vision tower, or a `capture`
    name (decoder.add_captures: hidden states as extra outputs) the model does not have."""
    if architecture not in BUILDERS:
        raise ArtifactError(
            f"no graph builder for architecture {architecture!r} (have: {', '.join(BUILDERS)})"
        )
    spec = model_spec(architecture, config)
    if vision:
        _check_vision(architecture, tensors)
    try:
        if vision:
            graph = qwen3_5.build(spec, tensors, dtype, config, vision=True)
        else:
            graph = BUILDERS[architecture](spec, tensors, dtype)
    except MissingTensor as e:
        raise ArtifactError(f"{architecture}: missing tensor {e.args[0]!r}") from None
    except SignatureError as e:  # a stored tensor's shape is not the one the config implies
        raise ArtifactError(f"{architecture}: the weights do not fit the config: {e}") from None
    if has_mtp(tensors):  # run by `--spec mtp` as its own plan (build_mtp_graph)
        graph.meta["declared"].setdefault("mtp", "declared, not executed")
    if any(t.startswith("dflash.") for t in tensors):  # a drafter, run by `--spec dflash`
        graph.meta["declared"].setdefault("dflash", "drafter, run by --spec dflash")
    return add_captures(graph, capture)


def build_mtp_graph(
    architecture: str,
    config: dict[str, Any],
    tensors: TensorTable,
    dtype: str = "f32",
    logits: bool = True,
    vision: bool = False,
) -> Graph:
    """The graph of the artifact's MTP head (ir/models/mtp.py). ConfigError when the artifact
    has no `mtp` component; ArtifactError when its `mtp.*` tensors do not make a head.
    `vision`: the head of a vision plan (--vision), on the target's 3-axis positions and
    vision embeddings, as the target's text stage."""
    if not has_mtp(tensors):
        raise ConfigError(
            "--spec mtp needs the artifact's mtp component (mtp.* tensors), which it lacks"
        )
    spec = model_spec(architecture, config)
    if vision:
        _check_vision(architecture, tensors)
        axes = qwen3_5_vision.mrope_axes(config, spec.rotary_dim)
        spec = dataclasses.replace(spec, rope={**spec.rope, "mrope_axes": axes})
    try:
        return build_mtp(spec, tensors, dtype, logits)
    except MissingTensor as e:
        raise ArtifactError(f"{architecture} MTP head: missing tensor {e.args[0]!r}") from None
    except SignatureError as e:
        raise ArtifactError(f"{architecture} MTP head: {e}") from None


def check_tensors(architecture: str, config: dict[str, Any], tensors: TensorTable) -> None:
    """Raise ArtifactError unless `tensors` build the model `config` describes (the check a
    converter runs before it writes an artifact: ninfer.artifact.convert_hf.check_fits)."""
    build_graph(architecture, config, tensors)
    if has_mtp(tensors):  # an attached MTP head fits the model too
        build_mtp_graph(architecture, config, tensors)
    if any(t.startswith("visual.") for t in tensors) and architecture in VISION_ARCHITECTURES:
        build_graph(architecture, config, tensors, vision=True)  # the tower's weights fit too


__all__ = ["BUILDERS", "ModelSpec", "build_graph", "build_mtp_graph", "check_tensors", "model_spec"]
