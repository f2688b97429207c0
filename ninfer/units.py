"""Quantities as people read them, for logs and command output."""

from __future__ import annotations


def nbytes(n: float) -> str:
    """`n` bytes in binary units: "512 B", "1.5 KiB", "12.0 MiB", "3.2 GiB" (GiB at most)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover
