"""The CUDA executor's host metadata: the short fills (decode rows, and a drafter's chain of
decode steps at once, wide first step or not) write what the general fill writes for the same
steps. Pure numpy: runs on CPU."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from ninfer.runtime.executors.cuda.chain_layout import ChainLayout
from ninfer.runtime.executors.cuda.step_layout import (
    StepLayout,
    _fill_chunks,
    _fill_rows,
    fill_step,
    verify_rows,
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


@pytest.mark.parametrize("seed", range(6))
def test_a_kept_buffer_rewrites_only_changed_tables_and_holds_what_a_fresh_fill_writes(seed):
    """A decode graph's buffer keeps its contents between steps, and `written` the tables its
    rows hold: after each step (rows that grow a position, move to a new page, are replaced by
    a shorter or an unrelated sequence, or stay) it is what a fresh fill writes."""
    rng = random.Random(seed)
    n = rng.randint(1, 6)
    lay = StepLayout(n, n, n, WIDTH)
    kept, written = np.full(lay.size, -7, np.int32), []
    rows = list(decode_rows(rng, n))
    for _ in range(40):
        for i, c in enumerate(rows):
            if rng.random() < 0.15:  # another sequence takes the row
                rows[i] = decode_rows(rng, 1)[0]
            elif c.start_pos + 1 < PS * (WIDTH - 1):  # the next position, a page more at a boundary
                pages = c.block_table + (
                    (rng.randrange(1000),) if (c.start_pos + 1) % PS == 0 else ()
                )
                rows[i] = replace(c, start_pos=c.start_pos + 1, block_table=pages)
        order = rng.sample(range(n), n)
        fill_step(kept, lay, tuple(rows), order, PS, SCRATCH, written)
        fresh = np.zeros(lay.size, np.int32)
        fill_step(fresh, lay, tuple(rows), order, PS, SCRATCH)
        assert kept.tolist() == fresh.tolist()
        assert written == [c.block_table[: c.start_pos // PS + 1] for c in rows]


def chunks_of(rng: random.Random, n: int, ahead: int, wide: bool) -> tuple[SeqChunk, ...]:
    """`n` chunks (1..4 positions each when `wide`, else one), each block table covering
    `ahead` positions past its last."""
    out = []
    for c in decode_rows(rng, n, ahead=ahead + 3):
        k = rng.randint(1, 4) if wide else 1
        toks = tuple(rng.randrange(50000) for _ in range(k))
        out.append(SeqChunk(c.seq_id, toks, c.start_pos, c.block_table, num_logits=k))
    return tuple(out)


def general_fill(lay: StepLayout, chunks: tuple[SeqChunk, ...]) -> np.ndarray:
    want = np.zeros(lay.size, np.int32)
    _fill_chunks(want, lay, chunks, list(range(lay.R)), PS, SCRATCH)
    return want


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_a_chain_fills_as_its_steps_one_by_one(seed, wide):
    check_chain(seed, wide, pad=0)


@pytest.mark.parametrize("seed", range(6))
def test_a_wide_first_step_padded_to_its_graph_rows_puts_the_rest_on_the_scratch_page(seed):
    check_chain(seed, True, pad=random.Random(seed).randint(1, 5))


def check_chain(seed: int, wide: bool, pad: int) -> None:
    """Step 0 of a chain is the general fill of every chunk position as a one-token row
    (verify_rows), step j > 0 that of one row per chunk at its last position + j, the tips
    the rows of each chunk's last position; every table holds the pages up to the chain's
    last position. Filled twice (other chunks, then the first again: tables only rewritten
    when pages change)."""
    rng = random.Random(seed)
    steps = rng.randint(1, 4)
    chunks = chunks_of(rng, rng.randint(1, 4), steps, wide)
    first = sum(len(c.token_ids) for c in chunks)
    layout = ChainLayout(first + pad, len(chunks), steps, WIDTH, PS, SCRATCH)
    other = chunks_of(random.Random(seed + 100), len(chunks), steps, False)
    other = tuple(replace(o, token_ids=c.token_ids, num_logits=c.num_logits)
                  for o, c in zip(other, chunks))  # fmt: skip
    for batch in (chunks, other, chunks):
        layout.fill(batch)
        h = layout.host.numpy()
        for j in range(steps):
            if j == 0:
                rows = verify_rows(batch, 64)
            else:
                rows = tuple(
                    SeqChunk(c.seq_id, c.token_ids[-1:], c.start_pos + len(c.token_ids) - 1 + j,
                             c.block_table)
                    for c in batch
                )  # fmt: skip
            lay, got = layout.step(j, h)
            if j == 0 and pad:  # the padding rows: one position each on the scratch page
                rows += tuple(SeqChunk(-1, (0,), 0, (SCRATCH,)) for _ in range(pad))
            want = general_fill(lay, rows)
            names = ("positions", "slots", "seq_lens", "cu", "state", "rows")
            for name in names + (("tokens",) if j == 0 else ()):
                assert lay.view(got, name).tolist() == lay.view(want, name).tolist(), (j, name)
            tables = lay.view(got, "tables").reshape(lay.N, WIDTH)
            r = 0
            for c in batch:
                need = (c.start_pos + len(c.token_ids) + steps - 2) // PS + 1
                for _ in range(len(c.token_ids) if j == 0 else 1):
                    assert tables[r, :need].tolist() == list(c.block_table[:need])
                    assert set(tables[r, need:].tolist()) <= {SCRATCH}
                    r += 1
            assert set(tables[r:].reshape(-1).tolist()) <= {SCRATCH}  # padding rows
        if wide and first > len(chunks):
            ends = np.cumsum([len(c.token_ids) for c in batch]) - 1
            assert layout.tips(layout.host).tolist() == ends.tolist()


def test_before_any_fill_every_row_is_on_the_scratch_page():
    layout = ChainLayout(3, 1, 2, WIDTH, PS, SCRATCH)
    for j in range(2):
        lay, part = layout.step(j, layout.host.numpy())
        assert set(lay.view(part, "tables").tolist()) == {SCRATCH}
        assert set(lay.view(part, "slots").tolist()) == {SCRATCH * PS}
        assert lay.view(part, "cu").tolist() == list(range(lay.N + 1))


def test_a_table_that_does_not_cover_the_chain_is_refused():
    c = SeqChunk(0, (5,), PS - 1, (3,))  # position 15 on page 3; the chain's step 1 is at 16
    ChainLayout(1, 1, 1, WIDTH, PS, SCRATCH).fill((c,))
    with pytest.raises(ValueError, match="does not cover position 16"):
        ChainLayout(1, 1, 2, WIDTH, PS, SCRATCH).fill((c,))
    wide = SeqChunk(0, (5, 6), PS - 2, (3,), num_logits=2)  # positions 14, 15; then 16
    with pytest.raises(ValueError, match="does not cover position 16"):
        ChainLayout(2, 1, 2, WIDTH, PS, SCRATCH).fill((wide,))
    with pytest.raises(ValueError, match="does not cover position 15"):
        fill_step(np.zeros(StepLayout(1, 1, 1, WIDTH).size, np.int32), StepLayout(1, 1, 1, WIDTH),
                  (SeqChunk(0, (5,), PS - 1, ()),), [0], PS, 0)  # fmt: skip


def test_a_shorter_first_step_on_the_same_pages_clears_the_rows_it_no_longer_uses():
    layout = ChainLayout(4, 1, 2, WIDTH, PS, SCRATCH)
    table = (7, 8, 9)
    layout.fill((SeqChunk(0, (1, 2, 3), 20, table, num_logits=3),))
    layout.fill((SeqChunk(0, (1, 2), 21, table, num_logits=2),))
    lay, part = layout.step(0, layout.host.numpy())
    tables = lay.view(part, "tables").reshape(4, WIDTH)
    assert tables[:2, :3].tolist() == [[7, 8, SCRATCH]] * 2  # the chain ends at position 23
    assert set(tables[2:].reshape(-1).tolist()) == {SCRATCH}
    assert lay.view(part, "seq_lens").tolist() == [22, 23, 1, 1]
    assert layout.tips(layout.host).tolist() == [1]
