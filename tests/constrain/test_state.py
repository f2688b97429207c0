"""ConstraintState, the engine's per-step side of constrained decoding, on a real tokenizer:
masks of mixed batches, feeding committed tokens, completion, and a grammar that cannot go on."""

from __future__ import annotations

import torch

from ninfer.constrain import Regex, compile_constraint
from ninfer.constrain.state import ConstraintState


def _allowed(mask, n: int, vocab: int) -> list[set[int]]:
    x = torch.zeros(n, vocab)
    y = mask.apply(x)
    assert not torch.isinf(x).any(), "apply must not modify its input"
    return [set(torch.nonzero(torch.isfinite(row)).flatten().tolist()) for row in y]


def test_mixed_batch_masks_only_constrained_rows(tiny):
    info = tiny.info
    digits = compile_constraint(Regex("[0-9]{2}"), info)
    state = ConstraintState(4)
    assert state.step_mask([(0, None), (1, None)]) is None
    mask = state.step_mask([(0, None), (1, digits), (2, None)])
    free, constrained, free2 = _allowed(mask, 3, info.vocab_size)
    assert free == free2 == set(range(info.vocab_size))
    assert constrained and all(tiny.decode([t]).isdigit() for t in constrained)
    assert mask.dead == {}


def test_advance_feeds_new_tokens_and_stops_when_complete(tiny):
    info = tiny.info
    c = compile_constraint(Regex("[0-9]{2}"), info)
    state = ConstraintState(2)
    state.step_mask([(5, c)])
    one, two = tiny.encode("4")[0], tiny.encode("2")[0]
    assert state.advance(5, [one]) == (False, None)
    assert state.advance(5, [one, two]).stop  # only the new token is fed
    assert list(state.advance_all([(5, [one, two]), (6, [one])])) == [(5, (True, None))]
    # a terminated matcher's row is free again (its request is finishing)
    assert state.step_mask([(5, c)]) is None
    state.forget(5)
    assert len(state) == 0


def test_refused_token_is_an_error_verdict(tiny):
    c = compile_constraint(Regex("[0-9]+"), tiny.info)
    state = ConstraintState(1)
    state.step_mask([(0, c)])
    verdict = state.advance(0, tiny.encode("a"))
    assert not verdict.stop and "output token 0 refused" in verdict.error


def test_a_grammar_in_error_is_a_dead_row_not_a_free_one(tiny):
    """A matcher the grammar engine put in an error state allows nothing: the row is reported
    dead (the engine fails its request) and masked to all-allowed, so no NaN reaches sampling."""
    c = compile_constraint(Regex("[0-9]+"), tiny.info)
    state = ConstraintState(2)
    state.step_mask([(0, c), (1, c)])
    # drive the real engine into its error state (the Matcher wrapper would refuse the token)
    state._entries[0].matcher.engine.consume_token(tiny.encode("a")[0])
    mask = state.step_mask([(0, c), (1, c)])
    assert list(mask.dead) == [0] and "allows no next token" in mask.dead[0]
    dead_row, ok_row = _allowed(mask, 2, tiny.info.vocab_size)
    assert dead_row == set(range(tiny.info.vocab_size)) and len(ok_row) < 20
    assert state.advance(0, []).error is not None


def test_both_bit_unpackings_agree():
    """The CPU path (numpy) and the device path (torch shifts) read the same tokens."""
    from ninfer.constrain.state import unpack_bits_numpy, unpack_bits_torch

    g = torch.Generator().manual_seed(0)
    words = torch.randint(-(2**31), 2**31 - 1, (3, 5), dtype=torch.int32, generator=g)
    words[0, 0] = 0b1011  # tokens 0, 1 and 3
    numpy_bits, torch_bits = unpack_bits_numpy(words), unpack_bits_torch(words)
    assert torch.equal(numpy_bits, torch_bits)
    assert numpy_bits[0, :4].tolist() == [True, True, False, True]
