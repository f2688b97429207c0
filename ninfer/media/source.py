"""Acquiring the bytes of one media item from its source string.

A source is either a ``data:`` URI (``data:<media type>;base64,<payload>``) or an http(s) URL,
fetched by `HttpFetcher`. Nothing else: no ``file://``, no bare paths, no other scheme. A data URI
must be base64, name a media type of the item's modality (`IMAGE_TYPES` / `VIDEO_TYPES`) and
decode to at most the fetcher's byte limit; the decoder, not the declared type, has the last word
on whether the bytes are media.
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from dataclasses import dataclass
from typing import Literal

from ninfer.media import errors
from ninfer.media.fetch import HttpFetcher

Modality = Literal["image", "video"]

IMAGE_TYPES = frozenset(
    {"image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif", "image/bmp", "image/tiff"}
)
VIDEO_TYPES = frozenset(
    {
        "video/mp4",
        "video/webm",
        "video/quicktime",
        "video/x-matroska",
        "video/mpeg",
        "video/ogg",
        "video/x-msvideo",
        "video/avi",
    }
)
_TYPES: dict[str, frozenset[str]] = {"image": IMAGE_TYPES, "video": VIDEO_TYPES}
_BASE64 = re.compile(rb"[A-Za-z0-9+/\-_]*={0,2}")


@dataclass(frozen=True)
class Acquired:
    """The bytes of one media item. source: "data" or "http"; seconds: acquisition wall time."""

    data: bytes
    modality: Modality
    source: Literal["data", "http"]
    media_type: str | None
    seconds: float


def decode_data_uri(uri: str, modality: Modality, max_bytes: int) -> tuple[bytes, str]:
    """(payload bytes, media type) of a base64 ``data:`` URI for `modality`, or `MediaError`."""
    header, comma, payload = uri.partition(",")
    if not comma:
        raise errors.invalid_media("the data: URI has no ',' before its payload")
    params = [p.strip().lower() for p in header[len("data:") :].split(";")]
    media_type, options = params[0], params[1:]
    if "base64" not in options:
        raise errors.invalid_media("data: URIs must be base64-encoded (data:<type>;base64,...)")
    allowed = _TYPES[modality]
    if media_type not in allowed:
        raise errors.invalid_media(
            f"the data: URI's media type {media_type or '(none)'!r} is not an accepted {modality} "
            f"type ({', '.join(sorted(allowed))})"
        )
    # Whitespace may wrap a base64 payload; anything else outside the alphabet is an error.
    raw = "".join(payload.split()).encode("ascii", "replace")
    if len(raw) // 4 * 3 > max_bytes + 2:
        raise errors.budget_exceeded(
            f"the data: URI's {modality} is larger than the limit of {max_bytes} bytes"
        )
    if not raw or _BASE64.fullmatch(raw) is None:
        raise errors.invalid_media("the data: URI's payload is not valid base64")
    try:
        if b"-" in raw or b"_" in raw:
            data = base64.urlsafe_b64decode(raw + b"=" * (-len(raw) % 4))
        else:
            data = base64.b64decode(raw + b"=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError) as e:
        raise errors.invalid_media(f"the data: URI's payload is not valid base64: {e}") from e
    if len(data) > max_bytes:
        raise errors.budget_exceeded(
            f"the data: URI's {modality} is {len(data)} bytes, more than the limit of "
            f"{max_bytes} bytes"
        )
    return data, media_type


async def acquire(source: str, modality: Modality, fetcher: HttpFetcher) -> Acquired:
    """The bytes `source` names, for a media item of `modality`.

    Raises `MediaError`: ``invalid_media`` for an unsupported scheme or a bad data URI, and the
    fetcher's codes for http(s) (see `ninfer.media.fetch`).
    """
    start = time.monotonic()
    stripped = source.strip()
    scheme = stripped.split(":", 1)[0].lower() if ":" in stripped else ""
    if scheme == "data":
        data, media_type = decode_data_uri(stripped, modality, fetcher.limits.max_bytes)
        return Acquired(data, modality, "data", media_type, time.monotonic() - start)
    if scheme in ("http", "https"):
        fetched = await fetcher.fetch(stripped)
        return Acquired(
            fetched.data, modality, "http", fetched.content_type, time.monotonic() - start
        )
    raise errors.invalid_media(
        f"a {modality} source must be an http(s) URL or a data: URI, not "
        f"{(scheme + ':') if scheme else 'a bare path or string'}"
    )
