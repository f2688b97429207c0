"""Searches over long strings in bounded GIL holds.

One `re` search or `str.find` is one C call: over the 8M characters of a maximal prompt (32 MB
once one character needs four bytes) it holds the GIL for 3-30 ms (the template's restore scan:
20-30 ms), and a request makes several, each a stall of the event loop (/health included) in
the server's other thread. These do the same searches window by window (`WINDOW` characters:
under 1 ms for a find, ~2 ms for that scan's alternation), so the thread gives the GIL back
between two windows when another thread asks for it (sys.getswitchinterval).

Same results as the one-call forms for the patterns they are given: a pattern whose matches are
never empty and at most `longest` characters long, without lookaround or anchors (a window's
end is then never mistaken for the text's end).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import AnyStr

WINDOW = 1 << 16  # characters (or bytes) one call searches


def finditer(
    pattern: re.Pattern[AnyStr],
    text: AnyStr,
    longest: int,
    start: int = 0,
    window: int = WINDOW,
) -> Iterator[re.Match[AnyStr]]:
    """The matches of `pattern.finditer(text, start)`, found window by window. A match may
    start in a window and end up to `longest` - 1 characters after it: each search reaches that
    far, and keeps only the matches that start inside its window (a later one is found again by
    the next window, whose search starts after the last match kept)."""
    if longest < 1 or window < 1:
        raise ValueError("longest and window must be positive")
    pos, n = start, len(text)
    while pos < n:
        stop = min(n, pos + window)
        for m in pattern.finditer(text, pos, min(n, stop + longest - 1)):
            if m.start() >= stop:
                break
            if m.end() == m.start():
                raise ValueError(f"{pattern.pattern!r} matched the empty string")
            yield m
            pos = m.end()
        pos = max(pos, stop)


def search(
    pattern: re.Pattern[AnyStr], text: AnyStr, longest: int, start: int = 0, window: int = WINDOW
) -> re.Match[AnyStr] | None:
    """`pattern.search(text, start)`, window by window (see `finditer`)."""
    return next(finditer(pattern, text, longest, start, window), None)


def find(text: AnyStr, sub: AnyStr, window: int = WINDOW) -> int:
    """`text.find(sub)`, window by window; -1 when absent."""
    if not sub:
        return 0
    n, reach = len(text), len(sub) - 1
    for pos in range(0, n, window):
        i = text.find(sub, pos, min(n, pos + window + reach))
        if i >= 0:
            return i
    return -1
