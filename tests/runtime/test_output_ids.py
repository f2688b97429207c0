"""`Sequence.outputs`: the output tokens as a view of the token list, read by every step's
sampling, constraint and verification rows instead of a copy of the whole output (which made a
step's host work grow with the output length)."""

from __future__ import annotations

import random

import pytest

from ninfer.runtime.sequence import OutputIds


@pytest.mark.parametrize("seed", range(6))
def test_the_view_reads_as_the_copy(seed):
    rng = random.Random(seed)
    tokens = [rng.randrange(1000) for _ in range(rng.randint(0, 40))]
    start = rng.randint(0, len(tokens))
    view, copy = OutputIds(tokens, start), tokens[start:]
    assert len(view) == len(copy) and list(view) == copy and view == copy
    assert bool(view) == bool(copy)
    for i in range(-len(copy), len(copy)):
        assert view[i] == copy[i]
    for i in (len(copy), -len(copy) - 1):
        with pytest.raises(IndexError):
            view[i]
    for _ in range(30):
        a, b = rng.randint(-50, 50), rng.randint(-50, 50)
        step = rng.choice([None, 1, 2, 3, -1, -2])
        assert view[a:b:step] == copy[a:b:step]
        assert view[a:] == copy[a:]


def test_the_view_follows_the_tokens_committed_after_it():
    """A view, not a copy: the tokens appended after it was taken are in it."""
    tokens = [1, 2, 3, 4]
    view = OutputIds(tokens, 2)
    tokens += [5, 6]
    assert list(view) == [3, 4, 5, 6] and view[-1] == 6 and view[1:] == [4, 5, 6]
