"""Progress of long conversions, on stderr: a bar on a terminal, plain lines otherwise.

A terminal gets one line rewritten in place. Anything else (a log file, a pipe, `./run serve`
under a supervisor) gets a line every 10% of the work or every `interval_s` seconds, whichever
comes first, so the output shows the conversion moving without control characters.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """`advance()` once per unit of work (tensors), `done()` at the end (also after a failure)."""

    def __init__(
        self,
        label: str,
        total: int,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        interval_s: float = 5.0,
    ):
        self.label, self.total, self.n = label, max(total, 1), 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and _isatty(self.stream)
        self.interval_s = interval_s
        self._start = self._last = time.monotonic()
        self._last_tenth = 0  # the last 10% step a plain line reported

    def advance(self, n: int = 1) -> None:
        self.n += n
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty:
            if now - self._last > 0.1 or self.n >= self.total:
                self._last = now
                width = 30
                filled = int(width * min(self.n, self.total) / self.total)
                self._write(
                    f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] "
                    f"{self.n}/{self.total} {now - self._start:.1f} s"
                )
            return
        tenth = min(self.n, self.total) * 10 // self.total
        if tenth > self._last_tenth or now - self._last >= self.interval_s:
            self._last, self._last_tenth = now, tenth
            self._write(self._line(now) + "\n")

    def done(self) -> None:
        if not self.enabled:
            return
        if self.tty:
            self._write("\n")
        elif self.n < self.total:  # stopped early (a failure): say where
            self._write(self._line(time.monotonic()) + " (stopped)\n")

    def _line(self, now: float) -> str:
        pct = 100 * min(self.n, self.total) // self.total
        return f"{self.label}: {pct}% ({self.n}/{self.total}) {now - self._start:.1f} s"

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False
