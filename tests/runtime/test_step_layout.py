"""The CUDA executor's host metadata: the short fills (decode rows, and a drafter's chain of
decode steps at once) write what the general fill writes for the same steps. Pure numpy: runs
on CPU."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ninfer.runtime.executors.cuda.step_layout import (
    StepLayout,
    _fill_chunks,
    _fill_rows,
    fill_chain,
    fill_step,
)
from ninfer.runtime.step import SeqChunk

PS, WIDTH, SCRATCH = 16, 12, 99


def decode_rows(rng: random.Random, n: int, ahead: int = 0) -> tuple[SeqChunk, ...]:
    """`n` one-token rows at random positions, each block table covering `ahead` positions
    past its own (distinct random pages), some with a state slot."""
    rows = []
    for i in range(n):
        pos = rng.randrange(0, PS * (WIDTH - 2))
        pages = rng.sample(range(1000), (pos + ahead) // PS + 1)
        slot = rng.choice([None, rng.randrange(8)])
        rows.append(SeqChunk(i, (rng.randrange(50000),), pos, tuple(pages), slot))
    return tuple(rows)


@pytest.mark.parametrize("seed", range(20))
def test_decode_rows_fill_as_the_general_fill(seed):
    rng = random.Random(seed)
    chunks = decode_rows(rng, rng.randint(1, 8))
    n = len(chunks)
    lay = StepLayout(n, n, n, WIDTH)
    order = rng.sample(range(n), n)
    fast, general = np.full(lay.size, -7, np.int32), np.full(lay.size, -7, np.int32)
    _fill_rows(fast, lay, chunks, order, PS, SCRATCH)
    _fill_chunks(general, lay, chunks, order, PS, SCRATCH)
    assert fast.tolist() == general.tolist()
    # and fill_step writes the same through its short path
    via = np.zeros(lay.size, np.int32)
    fill_step(via, lay, chunks, order, PS, SCRATCH)
    assert via.tolist() == general.tolist()


@pytest.mark.parametrize("seed", range(20))
def test_a_chain_fills_as_its_steps_one_by_one(seed):
    """Layout j of a chain is step j's fill (positions + j), except that every step's tables
    hold the pages up to the chain's last position (past a step's own need)."""
    rng = random.Random(seed)
    steps = rng.randint(1, 5)
    chunks = decode_rows(rng, rng.randint(1, 8), ahead=steps - 1)
    n = len(chunks)
    lay = StepLayout(n, n, n, WIDTH)
    chain = np.full(steps * lay.size, -7, np.int32)
    fill_chain(chain, lay, steps, chunks, PS, SCRATCH)
    for j in range(steps):
        step = tuple(
            SeqChunk(c.seq_id, c.token_ids, c.start_pos + j, c.block_table, c.state_slot)
            for c in chunks
        )
        want = np.zeros(lay.size, np.int32)
        _fill_chunks(want, lay, step, list(range(n)), PS, SCRATCH)
        got = chain[j * lay.size : (j + 1) * lay.size]
        for name in ("positions", "slots", "seq_lens", "cu", "state", "rows"):
            assert lay.view(got, name).tolist() == lay.view(want, name).tolist(), (j, name)
        if j == 0:
            assert lay.view(got, "tokens").tolist() == lay.view(want, "tokens").tolist()
        tables = lay.view(got, "tables").reshape(n, WIDTH)
        for i, c in enumerate(chunks):
            need = (c.start_pos + steps - 1) // PS + 1
            assert tables[i, :need].tolist() == list(c.block_table[:need])
            assert set(tables[i, need:].tolist()) <= {SCRATCH}


def test_a_table_that_does_not_cover_the_chain_is_refused():
    c = SeqChunk(0, (5,), PS - 1, (3,))  # position 15 on page 3; the chain's step 1 is at 16
    lay = StepLayout(1, 1, 1, WIDTH)
    fill_chain(np.zeros(lay.size, np.int32), lay, 1, (c,), PS, SCRATCH)
    with pytest.raises(ValueError, match="does not cover position 16"):
        fill_chain(np.zeros(2 * lay.size, np.int32), lay, 2, (c,), PS, SCRATCH)
    with pytest.raises(ValueError, match="does not cover position 15"):
        fill_step(np.zeros(lay.size, np.int32), lay, (SeqChunk(0, (5,), PS - 1, ()),), [0], PS, 0)
