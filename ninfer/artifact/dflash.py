"""The DFlash drafter component of an artifact: its config, its tensors, and attaching it.

    ninfer convert TARGET -o OUT.ninfer --dflash DRAFTER_DIR
    ninfer convert TARGET.ninfer -o OUT.ninfer --dflash DRAFTER_DIR     (an existing artifact)

DRAFTER_DIR is the published Hugging Face directory of a DFlash drafter (e.g.
z-lab/Qwen3-8B-DFlash-b16): config.json (model_type qwen3, block_size, num_target_layers,
dflash_config.target_layer_ids / mask_token_id) and safetensors holding `fc`, `hidden_norm`,
`layers.N.*` (Qwen3 layers) and `norm`. Its tensors are stored as `dflash.<name>` (a leading
`model.` dropped), its config as header["dflash"], and "dflash" joins the components. The
drafter must fit the target: its hidden size is the target's (it reads the target's token
embedding and LM head), fc's input is len(target_layer_ids) x the target's hidden size, and the
target layers exist. The math is ninfer/spec/dflash_model.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from ninfer.artifact.format import Artifact, ArtifactWriter, StoredTensor
from ninfer.artifact.model_spec import ModelSpec, model_spec
from ninfer.errors import ArtifactError, ConvertError

PREFIX = "dflash."
COMPONENT = "dflash"


@dataclass(frozen=True)
class DFlashConfig:
    """The drafter's shape, read from its config.json (as stored in header["dflash"])."""

    spec: ModelSpec  # the drafter's Qwen3 layers (hidden, heads, head_dim, rope, eps, ...)
    block_size: int  # tokens per drafted block: the last committed token + block_size - 1 masks
    mask_token_id: int
    target_layer_ids: tuple[int, ...]  # the target layers whose outputs are fused
    target_hidden: int  # the target's hidden size (fc's input is len(ids) * this)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], target_layers: int, target_hidden: int) -> Self:
        """Validate a drafter config.json against the target it drafts for; ArtifactError
        naming the field otherwise."""
        spec = model_spec("qwen3", dict(cfg))
        dcfg = cfg.get("dflash_config") or {}
        block = cfg.get("block_size")
        if not isinstance(block, int) or block < 2:
            raise ArtifactError(f"dflash config: block_size must be an integer >= 2, got {block!r}")
        mask = dcfg.get("mask_token_id")
        if not isinstance(mask, int) or mask < 0:
            raise ArtifactError(
                f"dflash config: dflash_config.mask_token_id must be a token id, got {mask!r}"
            )
        trained_for = cfg.get("num_target_layers", target_layers)
        if trained_for != target_layers:  # a drafter of another model
            raise ArtifactError(
                f"dflash config: num_target_layers {trained_for!r}: the drafter was trained for a"
                f" model of that many layers, this one has {target_layers}"
            )
        ids = dcfg.get("target_layer_ids")
        if ids is None:  # the published default: spread over layers 1 .. L-3
            ids = default_target_layer_ids(target_layers, spec.layers)
        if not ids or not all(isinstance(i, int) and 0 <= i < target_layers for i in ids):
            raise ArtifactError(
                f"dflash config: dflash_config.target_layer_ids {ids!r} must name layers of the"
                f" target (0..{target_layers - 1})"
            )
        if spec.is_hybrid or spec.experts:
            raise ArtifactError("dflash config: the drafter's layers must be dense attention")
        return cls(spec, block, mask, tuple(ids), target_hidden)

    @property
    def capture(self) -> tuple[str, ...]:
        """The target hidden states the drafter consumes, as capture names ("L{i}")."""
        return tuple(f"L{i}" for i in self.target_layer_ids)


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The published choice when a config names none: one layer mid-way for a 1-layer drafter,
    else `num_draft_layers` layers spread evenly over 1 .. num_target_layers - 3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [
        round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)
    ]


def layer_tensors(cfg: DFlashConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the published layout (without the prefix) and its shape."""
    s = cfg.spec
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    out: dict[str, tuple[int, ...]] = {
        "fc.weight": (s.hidden, len(cfg.target_layer_ids) * cfg.target_hidden),
        "hidden_norm.weight": (s.hidden,),
        "norm.weight": (s.hidden,),
    }
    for i in range(s.layers):
        p = f"layers.{i}"
        out.update({
            f"{p}.input_layernorm.weight": (s.hidden,),
            f"{p}.post_attention_layernorm.weight": (s.hidden,),
            f"{p}.self_attn.q_proj.weight": (q, s.hidden),
            f"{p}.self_attn.k_proj.weight": (kv, s.hidden),
            f"{p}.self_attn.v_proj.weight": (kv, s.hidden),
            f"{p}.self_attn.o_proj.weight": (s.hidden, q),
            f"{p}.self_attn.q_norm.weight": (s.head_dim,),
            f"{p}.self_attn.k_norm.weight": (s.head_dim,),
            f"{p}.mlp.gate_proj.weight": (s.inter, s.hidden),
            f"{p}.mlp.up_proj.weight": (s.inter, s.hidden),
            f"{p}.mlp.down_proj.weight": (s.hidden, s.inter),
        })  # fmt: skip
    return out


def dflash_config(artifact: Artifact) -> DFlashConfig:
    """The drafter config of an artifact with the dflash component (ArtifactError without)."""
    cfg = artifact.header.get(COMPONENT)
    if COMPONENT not in artifact.components or not isinstance(cfg, dict):
        raise ArtifactError(f"{artifact.path}: no {COMPONENT} component")
    target = model_spec(artifact.architecture, artifact.config)
    return DFlashConfig.from_config(cfg, target.layers, target.hidden)


def _weights(src: Path) -> dict[str, tuple[Any, str]]:
    """The drafter's tensors by published name: (array, source format)."""
    from ninfer.artifact.convert_hf import _iter_tensors, _safetensor_files

    try:
        files = _safetensor_files(src)
    except ArtifactError as e:
        raise ConvertError(f"--dflash {src}: {e}") from None
    out = {}
    for name, arr, fmt in _iter_tensors(files):
        out[name.removeprefix("model.")] = (arr, fmt)
    return out


def attach_dflash(target: str | Path, src: str | Path, out: str | Path) -> Path:
    """Write `out`: the artifact `target` plus the DFlash drafter of the Hugging Face
    directory `src` (module docstring). ConvertError naming what does not fit."""
    src = Path(src)
    base = Artifact(target)
    try:
        raw = json.loads((src / "config.json").read_text(encoding="utf-8"))
    except OSError as e:
        raise ConvertError(f"--dflash {src}: cannot read config.json ({e.strerror})") from None
    except ValueError as e:
        raise ConvertError(f"--dflash {src}: config.json is not JSON ({e})") from None
    spec = model_spec(base.architecture, base.config)
    try:
        cfg = DFlashConfig.from_config(raw, spec.layers, spec.hidden)
    except ArtifactError as e:
        raise ConvertError(f"--dflash {src}: {e}") from None
    if cfg.spec.hidden != spec.hidden:
        raise ConvertError(
            f"--dflash {src}: hidden_size {cfg.spec.hidden} differs from the target's"
            f" {spec.hidden} (the drafter reads the target's embedding and LM head)"
        )
    if cfg.mask_token_id >= spec.vocab:
        raise ConvertError(
            f"--dflash {src}: mask_token_id {cfg.mask_token_id} is outside the target's"
            f" vocabulary ({spec.vocab})"
        )
    weights = _weights(src)
    want = layer_tensors(cfg)
    for name, shape in want.items():
        if name not in weights:
            raise ConvertError(f"--dflash {src}: missing tensor {name!r}")
        if tuple(weights[name][0].shape) != shape:
            raise ConvertError(
                f"--dflash {src}: tensor {name!r} is {list(weights[name][0].shape)},"
                f" the config implies {list(shape)}"
            )
    extra = sorted(set(weights) - set(want))
    if extra:
        raise ConvertError(f"--dflash {src}: unexpected tensor {extra[0]!r} for a DFlash drafter")
    header = {k: v for k, v in base.header.items() if k not in ("tensors", "format_version")}
    header[COMPONENT] = raw
    header["components"] = [c for c in base.components if c != COMPONENT] + [COMPONENT]
    with ArtifactWriter(out, header) as writer:
        for name in base:
            if not name.startswith(PREFIX):  # a drafter attached before is replaced
                writer.add(name, base.stored(name))
        for name in want:
            arr, fmt = weights[name]
            writer.add(PREFIX + name, StoredTensor(fmt, tuple(arr.shape), {"data": arr}))
    return Path(out)


def describe(cfg: DFlashConfig) -> dict[str, Any]:
    """What `ninfer compile --spec dflash` prints about the drafter."""
    s = cfg.spec
    return {
        "layers": s.layers,
        "block_size": cfg.block_size,
        "drafts_per_round": f"min(--draft-tokens, {cfg.block_size - 1})",
        "target_layers": list(cfg.target_layer_ids),
        "captures": list(cfg.capture),
        "mask_token_id": cfg.mask_token_id,
        "attention": f"{s.heads} heads / {s.kv_heads} kv, head_dim {s.head_dim}",
        "parameters": sum(math.prod(shape) for shape in layer_tensors(cfg).values()),
        "shared": "the target's token embedding and LM head",
    }


def drafter_tensors(artifact: Artifact) -> Mapping[str, str]:
    """published name -> artifact tensor name of the drafter's weights."""
    return {n.removeprefix(PREFIX): n for n in artifact if n.startswith(PREFIX)}
