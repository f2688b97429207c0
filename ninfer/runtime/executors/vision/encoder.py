"""The executor's media path: encode each image / video once with the plan's vision stage and
hand every step the embeddings of the placeholder rows it computes.

    MediaEncoder.for_plan(plan, run_stage, dtype, device)   # None: the plan runs no vision
    enc.step_inputs(rows)   # rows: (first step row, chunk) per chunk of the step
      -> media_embeds [M, hidden], media_rows i32[M]   (the text stage's media_merge inputs)

An item is encoded whole the first time a chunk needs any of its placeholders (a prefill chunk
may start or end inside it, and replay after a pause needs it again), then kept in an LRU keyed
by (modality, grid, digest) within `cache_bytes`, so later chunks and requests slice it.

`encoded_items` / `encoded_tokens` count vision stage runs and their merged tokens;
`encode_seconds()` is the time they took (on CUDA device time between events, recorded only
while `timing` is set: `ninfer bench engine --images` sets it).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ninfer.ir.plan import Plan
from ninfer.ir.plan_sections import VisionLayout
from ninfer.runtime.executors.vision.geometry import vision_inputs
from ninfer.runtime.executors.vision.ops import VisionContext
from ninfer.runtime.media_span import MediaSpan
from ninfer.runtime.step import SeqChunk

DEFAULT_CACHE_BYTES = 256 << 20

# run_stage(ctx, env) -> env after the plan's vision calls (the executor's interpreter)
StageRunner = Callable[[VisionContext, dict[str, Any]], dict[str, Any]]


class MediaEncoder:
    def __init__(
        self,
        run_stage: StageRunner,
        layout: VisionLayout,
        dtype: torch.dtype,
        device: torch.device,
        output: str,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        self.layout = layout
        self.dtype = dtype
        self.device = device
        self._run_stage = run_stage
        self._output = output
        self._cache: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self._cache_bytes = cache_bytes
        self.encoded_items = 0  # vision stage runs since construction (tests read deltas)
        self.encoded_tokens = 0  # their merged tokens
        self.timing = False  # CUDA: record events around each run (encode_seconds)
        self._seconds = 0.0
        self._events: list[tuple[Any, Any]] = []

    @classmethod
    def for_plan(
        cls, plan: Plan, run_stage: StageRunner, dtype: torch.dtype, device: torch.device
    ) -> MediaEncoder | None:
        """The encoder of `plan`'s vision stage (its embeddings are the plan's second output);
        None when the plan runs no vision stage."""
        if plan.vision is None:
            return None
        return cls(run_stage, plan.vision, dtype, device, plan.outputs[1])

    def _key(self, span: MediaSpan) -> tuple:
        if not span.digest:  # the key that tells two items apart
            raise ValueError(f"media at prompt offset {span.offset} has no digest")
        return (span.modality, span.grid_thw, span.digest)

    def embeddings(self, span: MediaSpan) -> torch.Tensor:
        """The item's merged embeddings [tokens, hidden] (encoded now, or from the cache)."""
        key = self._key(span)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        out = self.encode(span)
        self._cache[key] = out
        used = sum(t.numel() * t.element_size() for t in self._cache.values())
        while used > self._cache_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            used -= old.numel() * old.element_size()
        return out

    def encode(self, span: MediaSpan) -> torch.Tensor:
        """Run the vision stage on the span's prepared patch rows."""
        lay = self.layout
        pixels = getattr(span.prepared, "pixel_values", None)
        k = lay.in_channels * lay.temporal_patch_size * lay.patch_size**2
        t, h, w = span.grid_thw
        if not isinstance(pixels, torch.Tensor) or tuple(pixels.shape) != (t * h * w, k):
            shape = None if pixels is None else tuple(getattr(pixels, "shape", ()))
            raise ValueError(
                f"media at prompt offset {span.offset}: prepared pixel rows {shape} are not "
                f"[{t * h * w}, {k}] (grid {span.grid_thw} of this model's vision tower)"
            )
        if span.merge_size != lay.merge_size:
            raise ValueError(
                f"media at prompt offset {span.offset}: {span.tokens} tokens for grid "
                f"{span.grid_thw} imply merge {span.merge_size}, the tower merges {lay.merge_size}"
            )
        geo = vision_inputs(span.grid_thw, lay.merge_size, lay.grid_side)
        env = {
            "pixel_rows": pixels.to(self.device, self.dtype),
            "vision_pos_index": geo.pos_index.to(self.device),
            "vision_pos_weight": geo.pos_weight.to(self.device),
            "vision_rope_pos": geo.rope_pos.to(self.device),
        }
        cuda = self.timing and self.device.type == "cuda"
        t0 = time.perf_counter()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        out = self._run_stage(VisionContext(geo.segments), env)[self._output]
        if cuda:
            end.record()
            self._events.append((start, end))
        elif self.device.type != "cuda":  # the CPU ran the stage synchronously
            self._seconds += time.perf_counter() - t0
        self.encoded_items += 1
        self.encoded_tokens += int(out.shape[0])
        return out

    def encode_seconds(self) -> float:
        """Seconds the vision stage ran since construction (CUDA: of the runs while `timing`
        was set; waits for them to finish)."""
        for start, end in self._events:
            end.synchronize()
            self._seconds += start.elapsed_time(end) / 1e3
        self._events.clear()
        return self._seconds

    def step_inputs(
        self, chunks: Sequence[tuple[int, SeqChunk]], hidden: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(media_embeds [M, hidden], media_rows i32[M]) of a step whose chunk i starts at step
        row chunks[i][0]: every placeholder row of the chunk's media it computes."""
        embeds: list[torch.Tensor] = []
        rows: list[int] = []
        for begin, c in chunks:
            lo_c, hi_c = c.start_pos, c.start_pos + len(c.token_ids)
            for span in c.media:
                emb = None
                first = 0  # the item's embedding row of this run's first placeholder
                for start, n in span.runs:
                    lo, hi = max(start, lo_c), min(start + n, hi_c)
                    if lo < hi:
                        emb = self.embeddings(span) if emb is None else emb
                        self._check_ids(span, c, lo - lo_c, hi - lo_c)
                        embeds.append(emb[first + lo - start : first + hi - start])
                        rows.extend(range(begin + lo - lo_c, begin + hi - lo_c))
                    first += n
        if not embeds:
            empty = torch.empty(0, hidden, dtype=self.dtype, device=self.device)
            return empty, torch.empty(0, dtype=torch.int32, device=self.device)
        return (
            torch.cat(embeds),
            torch.tensor(rows, dtype=torch.int32, device=self.device),
        )

    def _check_ids(self, span: MediaSpan, c: SeqChunk, lo: int, hi: int) -> None:
        want = (
            self.layout.image_token_id if span.modality == "image" else self.layout.video_token_id
        )
        bad = [t for t in c.token_ids[lo:hi] if t != want]
        if bad:
            raise ValueError(
                f"the {span.modality} at prompt offset {span.offset} covers token {bad[0]}, not "
                f"its placeholder {want}"
            )
