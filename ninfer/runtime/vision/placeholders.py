"""Whether a request's media can be served: checked at submission, so that a mismatch is the
caller's RequestError (HTTP 400) and never a failed step.

No torch import.
"""

from __future__ import annotations

from collections.abc import Sequence

from ninfer.ir.plan_sections import VisionLayout
from ninfer.runtime.media_span import MediaSpan
from ninfer.runtime.request import RequestError


def check_media(
    ids: Sequence[int], media: Sequence[MediaSpan], vision: VisionLayout | None
) -> None:
    """RequestError unless the engine runs a vision tower (`vision`, the plan's section) and
    every placeholder of every span in prompt `ids` is its modality's pad token."""
    if not media:
        return
    if vision is None:
        raise RequestError(
            "the request has image or video input but the engine runs no vision tower "
            "(start it with --vision / vision=True)"
        )
    for span in media:
        want = vision.image_token_id if span.modality == "image" else vision.video_token_id
        for start, n in span.runs:
            bad = next((i for i in range(start, start + n) if ids[i] != want), None)
            if bad is not None:
                raise RequestError(
                    f"the {span.modality} at prompt offset {span.offset} covers token "
                    f"{ids[bad]} at {bad}, not its placeholder {want}"
                )
