"""The Qwen3.5 (and Qwen3-VL) vision tower, and the multimodal rotary of the text model.

One run of the vision stage encodes one image or video (`P` patch rows of
C * temporal_patch * patch * patch values, ninfer.media's layout) into `N = P / merge^2`
embeddings of the text model's width::

    x = patch_embed(pixel_rows)                    # Conv3d, stride = kernel: one GEMM  [P, E]
    x = x + pos_embed_interp(index, weight, table) # learned grid resampled bilinearly  [P, E]
    for each block i:                              # pre-norm ViT block, LayerNorm eps 1e-6
        q, k, v = split(linear(layernorm(x)))      # qkv with bias                      [P, E] x3
        q, k = rotary_2d(q, k, rope_pos)           # half the head by row, half by column
        x = x + linear(vision_attention(q, k, v))  # bidirectional, per image / frame
        x = x + fc2(gelu_tanh(fc1(layernorm(x))))
    y = merge_rows(layernorm(x))                   # m*m neighbouring patches -> one row [N, m*m*E]
    vision_embeds = fc2(gelu(fc1(y)))              #                                    [N, H]

Its inputs (pixel_rows, vision_pos_index / vision_pos_weight: the interpolation taps,
vision_rope_pos: (row, column) per patch) are computed on the host from the item's grid
(ninfer/runtime/executors/vision/geometry.py); its ops carry attrs["stage"] = "vision" and run apart from
the step. The text stage then writes those embeddings over the prompt's placeholder rows
(`media_merge`, step inputs media_embeds / media_rows) and rotates q/k by 3-axis positions
[3, T] (temporal, height, width): frequency j of the rotary follows axis `mrope_axes[j]`,
the sections interleaved as transformers' Qwen3.5 text rotary does (T H W T H W ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer.errors import ArtifactError
from ninfer.ir.builder import GraphBuilder
from ninfer.ir.types import TensorType

STAGE = {"stage": "vision"}
VISION_EPS = 1e-6  # every LayerNorm of the tower (hard-coded in the reference)
VISION_OUTPUT = "vision_embeds"
# step inputs of the text stage of a graph with a vision tower
MEDIA_INPUTS = ("media_embeds", "media_rows")


@dataclass(frozen=True)
class VisionSpec:
    """The tower's shape, from the checkpoint's vision_config (units: patches, channels)."""

    depth: int
    hidden: int
    inter: int
    heads: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    in_channels: int
    out_hidden: int
    grid_side: int  # the learned position grid is grid_side x grid_side
    rope_theta: float
    act: str  # the blocks' MLP activation: "tanh" (gelu_pytorch_tanh) or "none" (gelu)
    image_token_id: int
    video_token_id: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def patch_values(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    def layout(self) -> dict[str, Any]:
        """The plan's vision section (ninfer.ir.plan_sections.VisionLayout fields)."""
        return {
            "blocks": self.depth,
            "hidden": self.hidden,
            "heads": self.heads,
            "patch_size": self.patch_size,
            "temporal_patch_size": self.temporal_patch_size,
            "merge_size": self.merge_size,
            "in_channels": self.in_channels,
            "out_hidden": self.out_hidden,
            "grid_side": self.grid_side,
            "image_token_id": self.image_token_id,
            "video_token_id": self.video_token_id,
        }


_ACTS = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}


def vision_spec(config: dict[str, Any], text_hidden: int) -> VisionSpec:
    """The VisionSpec of a (text-lifted) Qwen3.5 config; ArtifactError naming what is missing."""
    vc = config.get("vision_config")
    if not isinstance(vc, dict):
        raise ArtifactError("the config has no vision_config: the artifact has no vision tower")
    try:
        side = int(int(vc.get("num_position_embeddings", 2304)) ** 0.5)
        act = _ACTS.get(vc.get("hidden_act", "gelu_pytorch_tanh"))
        if act is None:
            raise ArtifactError(f"vision_config.hidden_act {vc['hidden_act']!r} is not supported")
        spec = VisionSpec(
            depth=int(vc.get("depth", 27)),
            hidden=int(vc.get("hidden_size", 1152)),
            inter=int(vc.get("intermediate_size", 4304)),
            heads=int(vc.get("num_heads", 16)),
            patch_size=int(vc.get("patch_size", 16)),
            temporal_patch_size=int(vc.get("temporal_patch_size", 2)),
            merge_size=int(vc.get("spatial_merge_size", 2)),
            in_channels=int(vc.get("in_channels", 3)),
            out_hidden=int(vc.get("out_hidden_size", text_hidden)),
            grid_side=side,
            rope_theta=float((vc.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
            act=act,
            image_token_id=int(config["image_token_id"]),
            video_token_id=int(config["video_token_id"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"vision_config: cannot read {e}") from None
    if spec.out_hidden != text_hidden:
        raise ArtifactError(
            f"vision_config.out_hidden_size {spec.out_hidden} is not the text hidden size "
            f"{text_hidden}"
        )
    if spec.hidden % spec.heads or spec.head_dim % 4:
        raise ArtifactError(f"vision hidden {spec.hidden} / {spec.heads} heads: bad head size")
    return spec


def mrope_axes(config: dict[str, Any], rotary_dim: int) -> list[int]:
    """The position axis (0 temporal, 1 height, 2 width) of each rotary frequency: transformers'
    interleaved layout, frequency j reads height when j % 3 == 1 and j < 3 * section[1], width
    when j % 3 == 2 and j < 3 * section[2], else the temporal axis."""
    params = config.get("rope_parameters") or {}
    section = [int(s) for s in params.get("mrope_section", [11, 11, 10])]
    if len(section) != 3:
        raise ArtifactError(f"rope_parameters.mrope_section {section} must have three entries")
    axes = []
    for j in range(rotary_dim // 2):
        if j % 3 == 1 and j < 3 * section[1]:
            axes.append(1)
        elif j % 3 == 2 and j < 3 * section[2]:
            axes.append(2)
        else:
            axes.append(0)
    return axes


def _linear(b: GraphBuilder, x: str, prefix: str, out: str) -> str:
    w, bias = b.weight(f"{prefix}.weight"), b.weight(f"{prefix}.bias")
    return b.op1("linear", [x, w, bias], {**STAGE, "group": out, "proj": "vision"}, out)


def _layernorm(b: GraphBuilder, x: str, prefix: str, out: str) -> str:
    w, bias = b.weight(f"{prefix}.weight"), b.weight(f"{prefix}.bias")
    return b.op1("layernorm", [x, w, bias], {**STAGE, "eps": VISION_EPS}, out)


def build_vision(b: GraphBuilder, v: VisionSpec) -> str:
    """Add the vision stage's inputs and ops to `b`; returns its output value name."""
    dt = b.dtype
    rows = b.input("pixel_rows", TensorType(dt, ("P", v.patch_values)))
    index = b.input("vision_pos_index", TensorType("i64", ("P", 4)))
    weight = b.input("vision_pos_weight", TensorType("f32", ("P", 4)))
    rope_pos = b.input("vision_rope_pos", TensorType("i32", ("P", 2)))
    p = "visual"
    ins = [rows, b.weight(f"{p}.patch_embed.proj.weight"), b.weight(f"{p}.patch_embed.proj.bias")]
    x = b.op1("patch_embed", ins, STAGE, "V.patches")
    table = b.sized(f"{p}.pos_embed.weight", v.grid_side**2, "num_position_embeddings")
    pos = b.op1("pos_embed_interp", [index, weight, table], STAGE, "V.pos")
    x = b.op1("add", [x, pos], STAGE, "V.x")
    hd = v.head_dim
    for i in range(v.depth):
        bp, n = f"{p}.blocks.{i}", f"V{i}"
        h = _layernorm(b, x, f"{bp}.norm1", f"{n}.h")
        qkv = _linear(b, h, f"{bp}.attn.qkv", f"{n}.qkv")
        sizes = [v.hidden] * 3
        q, k, val = b.op("split", [qkv], {**STAGE, "sizes": sizes}, [f"{n}.q", f"{n}.k", f"{n}.v"])
        rattr = {**STAGE, "head_dim": hd, "theta": v.rope_theta}
        q, k = b.op("rotary_2d", [q, k, rope_pos], rattr, [f"{n}.q_rot", f"{n}.k_rot"])
        aattr = {**STAGE, "heads": v.heads, "head_dim": hd, "scale": hd**-0.5}
        o = b.op1("vision_attention", [q, k, val], aattr, f"{n}.attn")
        o = _linear(b, o, f"{bp}.attn.proj", f"{n}.attn_out")
        x = b.op1("add", [x, o], STAGE, f"{n}.x_mid")
        h = _layernorm(b, x, f"{bp}.norm2", f"{n}.h_post")
        h = _linear(b, h, f"{bp}.mlp.linear_fc1", f"{n}.fc1")
        h = b.op1("gelu", [h], {**STAGE, "approximate": v.act}, f"{n}.act")
        h = _linear(b, h, f"{bp}.mlp.linear_fc2", f"{n}.fc2")
        x = b.op1("add", [x, h], STAGE, f"{n}.x_out")
    m = f"{p}.merger"
    h = _layernorm(b, x, f"{m}.norm", "V.merge_norm")
    h = b.op1(
        "merge_rows", [h], {**STAGE, "rows_per_token": v.merge_size**2, "rows": "N"}, "V.merged"
    )
    h = _linear(b, h, f"{m}.linear_fc1", "V.merge_fc1")
    h = b.op1("gelu", [h], {**STAGE, "approximate": "none"}, "V.merge_act")
    return _linear(b, h, f"{m}.linear_fc2", VISION_OUTPUT)
