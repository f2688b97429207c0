"""A minimal progress bar for long conversions: stderr only, and only on a terminal."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, total: int, *, enabled: bool = True):
        self.label, self.total, self.n = label, max(total, 1), 0
        self.enabled = enabled and sys.stderr.isatty()
        self._last = 0.0

    def advance(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.1 or self.n >= self.total):
            self._last = now
            width = 30
            filled = int(width * self.n / self.total)
            sys.stderr.write(
                f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.n}/{self.total}"
            )
            sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()
