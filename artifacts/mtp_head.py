"""MTP heads for test fixtures (layout: ninfer/ir/models/mtp.py).

`initial_head(artifact, seed)` makes a head for `artifact`'s model: its decoder layer starts as
a copy of the model's last full-attention layer (a layer of the target's kind, as in the
published checkpoints), the norms and `mtp.fc` seeded random (fc scaled so the head's input
keeps the residual stream's size). artifacts/train_mtp.py trains from it; the random one is
enough for greedy-identity tests (drafts only change speed).

`build_mtp_fixture(arch, root)` is the fixture `arch` with such a head, converted by the real
path of a Qwen3.5 checkpoint: the head is written as `mtp.safetensors` next to the fixture's
Hugging Face weights and `ninfer convert` picks it up as the mtp component. `arch` may also be
a vision fixture (artifacts/fixture_vision.py: qwen3_5_vl, qwen3_5_moe_vl): the real Qwen3.5
vision-language checkpoints carry their `mtp.*` weights beside the language model's and the
tower's, so the converted artifact has all three components (text, mtp, vision).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from artifacts.fixture_vision import VISION_ARCHS, build_vision_fixture, build_vision_hf_dir
from artifacts.fixtures import build_fixture, build_hf_dir, convert_once, hf_dir_once
from ninfer.artifact.format import Artifact


def initial_head(art: Artifact, seed: int) -> dict[str, np.ndarray]:
    """`mtp.*` tensors (float32) of a head for `art` (module docstring)."""
    cfg = art.config
    hidden, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types") or ["full_attention"] * layers
    full = max(i for i, t in enumerate(types) if t == "full_attention")
    zero_centered = art.architecture.startswith("qwen3_5")
    g = np.random.default_rng(seed)
    prefix = f"model.layers.{full}."
    head = {
        "mtp.layers.0." + n[len(prefix) :]: np.asarray(art.dense(n), dtype=np.float32)
        for n in art
        if n.startswith(prefix)
    }

    def norm() -> np.ndarray:
        w = 0.1 * g.standard_normal(hidden)
        return (w if zero_centered else 1.0 + w).astype(np.float32)

    head["mtp.pre_fc_norm_embedding.weight"] = norm()
    head["mtp.pre_fc_norm_hidden.weight"] = norm()
    head["mtp.norm.weight"] = norm()
    fc = g.standard_normal((hidden, 2 * hidden)) / np.sqrt(2 * hidden)
    head["mtp.fc.weight"] = fc.astype(np.float32)
    return head


def build_mtp_hf_dir(arch: str, root: str | os.PathLike[str]) -> Path:
    """`root/<arch>-mtp-hf/`: the fixture's Hugging Face directory plus `mtp.safetensors`, a
    seeded random head (module docstring); reused when already there."""
    from safetensors.numpy import save_file

    vision = arch in VISION_ARCHS
    hf_dir, fixture = (
        (build_vision_hf_dir, build_vision_fixture) if vision else (build_hf_dir, build_fixture)
    )

    def write(tmp: Path) -> None:
        shutil.copytree(hf_dir(arch, root), tmp)
        head = initial_head(Artifact(fixture(arch, root)), seed=len(arch))
        save_file(head, str(tmp / "mtp.safetensors"))

    return hf_dir_once(f"{arch}-mtp", root, write)


def build_mtp_fixture(arch: str, root: str | os.PathLike[str]) -> Path:
    """`root/<arch>-mtp.ninfer`: fixture `arch` with a seeded random MTP head, converted from
    `build_mtp_hf_dir(arch, root)`; reused when already there."""
    hf = build_mtp_hf_dir(arch, root)
    return convert_once(f"{arch}-mtp", root, lambda name, root: hf)
