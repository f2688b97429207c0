"""The one error type of media acquisition and preparation, with the codes the API reports.

A `MediaError` carries everything an HTTP error response needs except the request field, which
the protocol layer knows and attaches (``MediaError.code`` / ``status`` / ``message``). The codes
are those of docs/serving.md:

- ``invalid_media`` (400): a bad source (scheme, URL, data URI, a refused address) or bytes that
  are not a decodable image / video of an accepted kind. The client's fault.
- ``media_budget_exceeded`` (400): a resource bound refused the item (source bytes, decoded
  pixels, frames, live prepared bytes). The client can send something smaller.
- ``media_fetch_failed`` (502): the remote server could not be reached or answered with an
  error; the request itself was well formed.
- ``media_fetch_timeout`` (504): the remote server was too slow (total deadline or a stalled
  body).

Internal failures (a bug in preparation) are never `MediaError`s; they stay ordinary exceptions.
"""

from __future__ import annotations

from ninfer.errors import NinferError

INVALID_MEDIA = "invalid_media"
MEDIA_BUDGET_EXCEEDED = "media_budget_exceeded"
MEDIA_FETCH_FAILED = "media_fetch_failed"
MEDIA_FETCH_TIMEOUT = "media_fetch_timeout"

_STATUS = {
    INVALID_MEDIA: 400,
    MEDIA_BUDGET_EXCEEDED: 400,
    MEDIA_FETCH_FAILED: 502,
    MEDIA_FETCH_TIMEOUT: 504,
}


class MediaError(NinferError):
    """A media item the server refuses. `code` is one of the four codes above; `status` its HTTP
    status; `message` one line naming the problem (never the media bytes); `item`: the index of
    the refused item among a request's media, when `MediaPreparer.prepare_all` knows it."""

    def __init__(self, code: str, message: str):
        if code not in _STATUS:
            raise ValueError(f"unknown media error code {code!r}")
        super().__init__(message)
        self.code = code
        self.status = _STATUS[code]
        self.message = message
        self.item: int | None = None

    @property
    def client_error(self) -> bool:
        """True for the 400 codes: the request caused it, so it must never surface as a 5xx."""
        return self.status < 500

    def __repr__(self) -> str:
        return f"MediaError({self.code!r}, {self.message!r})"


def invalid_media(message: str) -> MediaError:
    return MediaError(INVALID_MEDIA, message)


def budget_exceeded(message: str) -> MediaError:
    return MediaError(MEDIA_BUDGET_EXCEEDED, message)


def fetch_failed(message: str) -> MediaError:
    return MediaError(MEDIA_FETCH_FAILED, message)


def fetch_timeout(message: str) -> MediaError:
    return MediaError(MEDIA_FETCH_TIMEOUT, message)
