"""Conversion progress: a bar on a terminal, plain periodic lines anywhere else (a log file, a
pipe), so a conversion under `./run serve` or a supervisor is never silent."""

from __future__ import annotations

import io
import os
import select

from ninfer.artifact.progress import Progress


def _logged(total: int, steps: int) -> str:
    """What a converter of `total` items that advanced `steps` times, then finished, writes to
    a stream that is not a terminal (no time-based lines)."""
    out = io.StringIO()
    bar = Progress("converting", total, stream=out, interval_s=3600)
    for _ in range(steps):
        bar.advance()
    bar.done()
    return out.getvalue()


def test_plain_lines_every_tenth_when_not_a_terminal():
    text = _logged(272, 272)
    lines = text.splitlines()
    assert "\r" not in text and "\x1b" not in text
    assert [line.split()[1] for line in lines] == [f"{p}%" for p in range(10, 101, 10)]
    assert lines[-1].startswith("converting: 100% (272/272) ")


def test_plain_line_after_the_interval_even_without_a_tenth():
    out = io.StringIO()
    bar = Progress("converting", 1000, stream=out, interval_s=0.0)
    bar.advance()
    bar.advance()
    lines = out.getvalue().splitlines()
    assert [line.split(" s")[0].rsplit(" ", 1)[0] for line in lines] == [
        "converting: 0% (1/1000)",
        "converting: 0% (2/1000)",
    ]


def test_a_stopped_conversion_says_where_it_stopped():
    last = _logged(10, 3).splitlines()[-1]
    assert last.startswith("converting: 30% (3/10)")
    assert last.endswith("(stopped)")


def test_a_bar_rewritten_in_place_on_a_terminal():
    master, slave = os.openpty()
    try:
        with os.fdopen(slave, "w", closefd=False) as tty:
            bar = Progress("converting", 4, stream=tty)
            for _ in range(4):
                bar.advance()
            bar.done()
        chunks = []  # a pty hands back one write per read
        while select.select([master], [], [], 0.5)[0]:
            chunks.append(os.read(master, 4096))
        text = b"".join(chunks).decode()
    finally:
        os.close(master)
        os.close(slave)
    assert text.startswith("\rconverting [") and "4/4" in text
    assert text.count("\n") == 1  # one line, ended once


def test_disabled_writes_nothing():
    out = io.StringIO()
    bar = Progress("converting", 5, enabled=False, stream=out)
    bar.advance(5)
    bar.done()
    assert out.getvalue() == ""
