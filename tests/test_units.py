"""Byte counts as the logs and `ninfer inspect` print them."""

from __future__ import annotations

from ninfer.units import nbytes


def test_nbytes_picks_the_largest_unit_under_1024() -> None:
    assert nbytes(0) == "0 B"
    assert nbytes(1023) == "1023 B"
    assert nbytes(1024) == "1.0 KiB"
    assert nbytes(1536) == "1.5 KiB"
    assert nbytes(12 * 2**20) == "12.0 MiB"
    assert nbytes(3.25 * 2**30) == "3.2 GiB"


def test_nbytes_stops_at_gib() -> None:
    assert nbytes(4096 * 2**30) == "4096.0 GiB"
