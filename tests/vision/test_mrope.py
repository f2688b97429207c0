"""3-axis positions (ninfer.runtime.vision.mrope) against transformers' Qwen3.5
`get_rope_index`, and the MediaSpan rules they rely on."""

from __future__ import annotations

import random

import pytest
import torch

from ninfer.runtime.media_span import MediaSpan
from ninfer.runtime.vision.mrope import MRope

MERGE = 2


def _reference(token_types: list[int], images: list, videos: list):
    """transformers' get_rope_index on one sequence (it reads only the grids and token types)."""
    import transformers as tf

    cfg = tf.Qwen3_5Config(vision_config={"spatial_merge_size": MERGE})
    model = tf.Qwen3_5Model.__new__(tf.Qwen3_5Model)  # the method needs only config
    torch.nn.Module.__init__(model)
    model.config = cfg
    ids = torch.zeros(1, len(token_types), dtype=torch.long)
    pos, delta = tf.Qwen3_5Model.get_rope_index(
        model,
        ids,
        mm_token_type_ids=torch.tensor([token_types]),
        image_grid_thw=torch.tensor(images) if images else None,
        video_grid_thw=torch.tensor(videos) if videos else None,
    )
    return pos[:, 0].tolist(), int(delta)


def _layout(rng: random.Random):
    """A random prompt: text runs, images and frame-by-frame videos, as spans and token types."""
    types: list[int] = []
    spans, images, videos = [], [], []
    for _ in range(rng.randint(1, 4)):
        types += [0] * rng.randint(1, 5)
        h, w = MERGE * rng.randint(1, 4), MERGE * rng.randint(1, 4)
        per = h * w // MERGE**2
        if rng.random() < 0.5:
            spans.append(MediaSpan(len(types), per, (1, h, w), b"i", "image", None))
            types += [1] * per
            images.append([1, h, w])
        else:
            t, offs = rng.randint(1, 3), []
            for k in range(t):
                types += [0] * rng.randint(1, 3)  # "<t seconds><|vision_start|>"
                offs.append(len(types))
                types += [2] * per
            spans.append(
                MediaSpan(offs[0], t * per, (t, h, w), b"v", "video", None, (), tuple(offs))
            )
            videos.append([t, h, w])
    types += [0] * rng.randint(0, 4)
    return types, spans, images, videos


@pytest.mark.parametrize("seed", range(12))
def test_positions_and_delta_match_get_rope_index(seed):
    types, spans, images, videos = _layout(random.Random(seed))
    ref, delta = _reference(types, images, videos)
    m = MRope.of(spans)
    assert m is not None and m.delta == delta
    assert [list(a) for a in m.positions(0, len(types))] == ref
    # any window gives the same positions; decode indices continue at index + delta
    a, b = sorted(random.Random(seed).sample(range(len(types) + 1), 2))
    assert [list(x) for x in m.positions(a, b - a)] == [r[a:b] for r in ref]
    n = len(types)
    assert m.positions(n + 3, 2) == ([n + 3 + delta, n + 4 + delta],) * 3


def test_text_only_has_no_layout():
    assert MRope.of(()) is None


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 5, (1, 4, 4)), "does not fit"),  # 16 patches are not 5 tokens
        ((0, 4, (1, 4, 6)), "does not fit"),  # merge^2 = 6: not a square
        ((3, 8, (2, 4, 4), (3,)), "one entry per temporal patch"),
        ((3, 8, (2, 4, 4), (4, 9)), "first at the offset"),
        ((3, 8, (2, 4, 4), (3, 5)), "overlap"),
    ],
)
def test_bad_spans_are_refused(args, match):
    offset, tokens, grid, *frames = args
    with pytest.raises(ValueError, match=match):
        MediaSpan(offset, tokens, grid, b"d", "video", None, (), *frames)


def test_a_frame_by_frame_video_spans_its_runs():
    span = MediaSpan(3, 8, (2, 4, 4), b"d", "video", None, (0.5, 1.5), (3, 12))
    assert span.runs == ((3, 4), (12, 4)) and span.end == 16 and span.merge_size == 2


def test_a_contiguous_video_is_its_frames_back_to_back():
    """Without frame_offsets each temporal patch's lh x lw tokens still restart the temporal
    position (as if its timestamp text were empty), so the width grid never runs on."""
    span = MediaSpan(1, 8, (2, 4, 4), b"d", "video", None)  # 2 frames of 2 x 2 tokens
    m = MRope.of([span])
    assert m.positions(0, 10) == (
        [0, 1, 1, 1, 1, 3, 3, 3, 3, 5],
        [0, 1, 1, 2, 2, 3, 3, 4, 4, 5],
        [0, 1, 2, 1, 2, 3, 4, 3, 4, 5],
    )
    assert m.delta == 5 - 9
