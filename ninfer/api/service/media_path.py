"""The server's media path: --vision and the --media-* options wired into one `MediaPath`.

`build_media_path(config, artifact, tokenizer)` is called once at startup when --vision is on.
It resolves the prompt's vision token ids (`VisionTokens`), the preprocessing settings (the
artifact's vision geometry, the engine's dtype) and builds the `MediaPreparer`:

    --media-cache-mib N            LRU-retained prepared payloads (0: none retained)
    --media-live-mib N             every live prepared payload; also sizes the preparation gate
    --media-preprocess-threads N   decode/resize/pack workers (0: min(16, CPU count))
    --media-allow-private          fetch from loopback / private / link-local addresses too
                                   (a local deployment; metadata addresses stay refused)

`MediaPath.prepare(inputs)` runs a request's items through the preparer on the event loop (the
CPU work runs on the pool) and turns a `MediaError` into the HTTP error of the item's field.
Counters here are what /metrics adds to the preparer's own: prompts with media and the merged
vision tokens placed in them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

from ninfer.api.service.media_prompt import (
    MAX_VISION_TOKENS,
    Expansion,
    MediaInput,
    PromptMedia,
    VisionTokens,
    expand_media,
)
from ninfer.api.wire import errors
from ninfer.api.wire.errors import ApiError
from ninfer.media.addresses import FetchPolicy
from ninfer.media.config import VisionPreprocessConfig
from ninfer.media.errors import MediaError
from ninfer.media.fetch import HttpFetcher, Resolver
from ninfer.media.preparer import MediaPreparer, PreparedItem


def media_api_error(e: MediaError, param: str) -> ApiError:
    """The HTTP error of a refused media item found at `param`: 400 invalid_media and
    media_budget_exceeded (the client's), 502 media_fetch_failed, 504 media_fetch_timeout."""
    if e.client_error:
        return ApiError(e.status, f"'{param}': {e.message}", code=e.code, param=param)
    return ApiError(
        e.status, f"'{param}': {e.message}", type=errors.SERVER_ERROR, code=e.code, param=param
    )


def envelope_exceeded(vision_tokens: int, param: str) -> ApiError:
    """A prompt whose media need more merged vision tokens than one prompt may hold."""
    return ApiError(
        400,
        f"the request's images and videos need {vision_tokens} vision tokens, more than the "
        f"{MAX_VISION_TOKENS} one prompt may hold; send fewer or smaller images or shorter videos",
        code="media_budget_exceeded",
        param=param,
    )


@dataclass
class MediaCounters:
    """Process-wide, thread-safe: prompts that carried media and the merged vision tokens
    placed in them (after a successful expansion)."""

    prompts: int = 0
    vision_tokens: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def placed(self, tokens: int) -> None:
        with self.lock:
            self.prompts += 1
            self.vision_tokens += tokens


class MediaPath:
    """The preparer, the prompt's vision token ids and the counters of one server."""

    def __init__(self, preparer: MediaPreparer, tokens: VisionTokens) -> None:
        self.preparer = preparer
        self.tokens = tokens
        self.counters = MediaCounters()

    async def prepare(self, inputs: Sequence[MediaInput], timeout_ms: int) -> list[PreparedItem]:
        """Every item prepared, in order, each holding a cache reference the caller releases
        (`release`). Raises the ApiError of the first refused item, or 503
        request_queue_timeout past `timeout_ms` (--pending-timeout-ms: it covers preparation)."""
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                return await self.preparer.prepare_all([(i.url, i.modality) for i in inputs])
        except MediaError as e:
            index = e.item if e.item is not None and 0 <= e.item < len(inputs) else 0
            raise media_api_error(e, inputs[index].param) from None
        except TimeoutError:
            raise errors.request_queue_timeout(timeout_ms) from None

    def place(
        self,
        ids: list[int],
        media: Sequence[PreparedItem],
        encode_text: Callable[[str], list[int]],
        param: str,
    ) -> Expansion:
        """The encoded prompt `ids` with each prepared item's placeholder run
        (ninfer.api.service.media_prompt.expand_media), within the Vision envelope of
        MAX_VISION_TOKENS merged tokens (else 400 media_budget_exceeded)."""
        items = [PromptMedia(m.media, bytes.fromhex(m.ref.key.digest)) for m in media]
        expansion = expand_media(ids, items, self.tokens, encode_text, param)
        if expansion.vision_tokens > MAX_VISION_TOKENS:
            raise envelope_exceeded(expansion.vision_tokens, param)
        return expansion

    def close(self) -> None:
        self.preparer.close()


def release(items: Sequence[PreparedItem]) -> None:
    for item in items:
        item.ref.release()


def preprocess_config(
    model_config: Mapping[str, Any], dtype: str, processor: Mapping[str, Any] | None = None
) -> VisionPreprocessConfig:
    """Preprocessing settings: the checkpoint's own processor files (`processor`, as
    `Artifact.preprocessor` holds them: {"image": preprocessor_config.json, "video":
    video_preprocessor_config.json}) over Qwen3-VL / Qwen3.5's processor defaults, with the
    patch geometry of the model's ``vision_config`` (patch_size, temporal_patch_size,
    spatial_merge_size) where the files leave it out, and payload rows in float32 for a float32
    engine, else bfloat16."""
    vision = model_config.get("vision_config")
    geometry: dict[str, Any] = {}
    if isinstance(vision, Mapping):
        for ours, theirs in (
            ("patch_size", "patch_size"),
            ("temporal_patch_size", "temporal_patch_size"),
            ("merge_size", "spatial_merge_size"),
        ):
            if isinstance(vision.get(theirs), int):
                geometry[ours] = vision[theirs]
    files = processor or {}
    image = {**geometry, **(files.get("image") or {})}
    video = {**geometry, **(files.get("video") or {})} if files.get("video") else None
    return VisionPreprocessConfig.from_hf(
        image, video, dtype="float32" if dtype == "float32" else "bfloat16"
    )


def build_media_path(
    config: Any, artifact: Any, tokenizer: Tokenizer, resolver: Resolver | None = None
) -> MediaPath:
    """The media path of a --vision server (`config`: ServeConfig). `resolver` replaces DNS
    (tests). Raises ConfigError when the artifact cannot place media in a prompt."""
    tokens = VisionTokens.resolve(tokenizer, artifact.config)
    settings = preprocess_config(artifact.config, config.engine.dtype, artifact.preprocessor)
    policy = FetchPolicy(allow_private=config.media_allow_private)
    preparer = MediaPreparer.create(
        settings,
        cache_mib=config.media_cache_mib,
        live_mib=config.media_live_mib,
        threads=config.media_preprocess_threads,
        policy=policy,
    )
    if resolver is not None:
        preparer.fetcher = HttpFetcher(policy, preparer.fetcher.limits, resolver)
    return MediaPath(preparer, tokens)
