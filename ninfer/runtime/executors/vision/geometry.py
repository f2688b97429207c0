"""The vision tower's host inputs for one image or video, from its grid (t, h, w) in patches.

Patch rows come in ninfer.media's order: frame-major, then merge blocks row-major, then the
m x m patches of a block row-major. For each row this computes what transformers'
Qwen3.5 vision model derives from the grid (its vision_utils helpers):

    vision_pos_index  i64[P, 4]  the four taps into the learned grid_side x grid_side position
    vision_pos_weight f32[P, 4]  table, and their bilinear weights (align_corners=True)
    vision_rope_pos   i32[P, 2]  (row, column) of the patch in its frame, for the 2-D rotary
    segments                     (first row, rows) of each frame: attention never crosses them
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class VisionInputs(NamedTuple):
    pos_index: torch.Tensor  # i64 [P, 4]
    pos_weight: torch.Tensor  # f32 [P, 4]
    rope_pos: torch.Tensor  # i32 [P, 2]
    segments: tuple[tuple[int, int], ...]  # (first row, rows) per frame


def _rows_cols(h: int, w: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column of each patch of one frame, in merge-block order (i64 [h*w] each)."""
    rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(-1, -1, w // merge, merge)
    cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, -1, -1)
    # [h/m, m(row), w/m, m(col)] -> [h/m, w/m, m(row), m(col)]
    return rows.permute(0, 2, 1, 3).reshape(-1), cols.permute(0, 2, 1, 3).reshape(-1)


def _taps(index: torch.Tensor, size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear taps (floor, floor + 1, clamped) and weights of `index` on an axis of `size`
    patches resampled from `side` grid points, corners aligned."""
    src = index.to(torch.float32) * (side - 1) / max(size - 1, 1)
    floor = torch.floor(src)
    offsets = torch.arange(0, 2)
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
    weights = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
    return taps, weights


def vision_inputs(grid_thw: tuple[int, int, int], merge: int, grid_side: int) -> VisionInputs:
    t, h, w = grid_thw
    rows, cols = _rows_cols(h, w, merge)
    h_taps, h_weights = _taps(rows, h, grid_side)
    w_taps, w_weights = _taps(cols, w, grid_side)
    index = (h_taps[:, :, None] * grid_side + w_taps[:, None, :]).reshape(-1, 4)
    weight = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 4)
    rope = torch.stack([rows, cols], dim=-1).to(torch.int32)
    frame = h * w
    return VisionInputs(
        index.repeat(t, 1),
        weight.repeat(t, 1),
        rope.repeat(t, 1),
        tuple((k * frame, frame) for k in range(t)),
    )
