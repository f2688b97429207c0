"""Stop-string matching over a streamed text.

A Chat Completions request may name up to four non-empty stop strings (an Anthropic Messages
request any number, as that API sets no limit); they apply to the raw model text (reasoning
and answer alike), so the matcher sits between the detokenizer and the reasoning/tool parsers.

Contract of `StopMatcher`:

- `feed(text)` returns the text that is now certainly output (never part of a stop string) and,
  once a stop string has completed, the `StopMatch`. Only the longest suffix of the pending text
  that is a proper prefix of some stop string is held back.
- The match is the occurrence that *completes first* in the stream (smallest end offset); among
  occurrences ending at the same offset the one starting earliest wins. This is what a token-by-
  token engine observes and, unlike "earliest start", it does not depend on how the text was
  chunked. Text from the matched stop string onwards is never returned.
- `finish()` releases the held-back suffix when the stream ends without a match.

The concatenation of everything returned equals the stream text truncated before the match (or
the whole stream without a match), whatever the chunking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ninfer.api.wire import errors

MAX_STOP_STRINGS = 4


@dataclass(frozen=True)
class StopMatch:
    """A completed stop string: `stop` is the string that matched and `text` the output that
    preceded it in the final `feed` call (already included in that call's returned text)."""

    stop: str
    text: str


@dataclass(frozen=True)
class StopFeed:
    """Result of one `feed`: `text` is safe to emit; `match` is set once a stop string completed."""

    text: str
    match: StopMatch | None = None


def validate_stops(
    stops: str | Sequence[str] | None, param: str = "stop", most: int | None = MAX_STOP_STRINGS
) -> tuple[str, ...]:
    """Normalize a request's stop field to a tuple of at most `most` (None: any number)
    non-empty strings.

    Duplicates are dropped (first occurrence kept); a single string means a one-element list.
    Raises `ApiError` 400 (invalid_type / invalid_value) naming `param`.
    """
    if stops is None:
        return ()
    if isinstance(stops, str):
        stops = [stops]
    if not isinstance(stops, (list, tuple)):
        raise errors.invalid_type(param, "a string or an array of strings", stops)
    out: list[str] = []
    for i, s in enumerate(stops):
        if not isinstance(s, str):
            raise errors.invalid_type(f"{param}[{i}]", "a string", s)
        if s == "":
            raise errors.invalid_value(f"{param}[{i}]", "stop strings must be non-empty")
        if s not in out:
            out.append(s)
    if most is not None and len(out) > most:
        raise errors.invalid_value(
            param, f"at most {most} stop strings are supported, got {len(out)}"
        )
    return tuple(out)


class StopMatcher:
    """Incremental matcher for a fixed set of stop strings (see module docstring)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops: tuple[str, ...] = validate_stops(stops, most=None)  # capped per protocol
        self._held = ""  # pending text: a proper prefix of some stop string
        self.match: StopMatch | None = None

    @property
    def held(self) -> str:
        """Text currently held back as a possible start of a stop string."""
        return self._held

    def feed(self, text: str) -> StopFeed:
        """Consume `text`; after a match every further call returns empty text."""
        if self.match is not None:
            return StopFeed("", self.match)
        if not self.stops:
            return StopFeed(text)
        buf = self._held + text
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self.stops:
            i = buf.find(stop)
            if i >= 0:
                cand = (i + len(stop), i, stop)
                if best is None or cand[:2] < best[:2]:
                    best = cand
        if best is not None:
            _end, start, stop = best
            before = buf[:start]
            self._held = ""
            self.match = StopMatch(stop=stop, text=before)
            return StopFeed(before, self.match)
        keep = self._partial_suffix_len(buf)
        self._held = buf[len(buf) - keep :]
        return StopFeed(buf[: len(buf) - keep])

    def finish(self) -> str:
        """End of stream without a match: return the held-back text."""
        if self.match is not None:
            return ""
        out, self._held = self._held, ""
        return out

    def _partial_suffix_len(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of a stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best
