"""The batched mask path the sampler uses: rows filled for constrained sequences only, and
logits masked to -inf exactly where a reference mask built from allowed token ids says."""

from __future__ import annotations

import pytest
import torch

from ninfer.constrain import BatchMasks, JsonSchema, Regex, apply_bitmask, compile_constraint
from tests.constrain.helpers import Vocab


def reference(allowed: list[set[int]], vocab: int) -> torch.Tensor:
    ref = torch.zeros(len(allowed), vocab, dtype=torch.bool)
    for r, ids in enumerate(allowed):
        ref[r, sorted(ids)] = True
    return ref


def test_apply_bitmask_equals_a_reference_mask() -> None:
    g = torch.Generator().manual_seed(0)
    vocab = 1000  # not a multiple of 32: the last word is partly unused
    allowed = [set(torch.randint(0, vocab, (n,), generator=g).tolist()) for n in (1, 7, 300, 999)]
    bitmask = torch.zeros(4, (vocab + 31) // 32, dtype=torch.int32)
    words = bitmask.numpy().view("uint32")
    for r, ids in enumerate(allowed):
        for t in ids:
            words[r, t // 32] |= 1 << (t % 32)
    logits = torch.randn(4, vocab, generator=g)
    expect = logits.masked_fill(~reference(allowed, vocab), float("-inf"))
    apply_bitmask(logits, bitmask)
    assert torch.equal(logits, expect)


def test_apply_bitmask_to_some_rows_and_wider_logits() -> None:
    bitmask = torch.full((3, 1), -1, dtype=torch.int32)  # 32 tokens allowed per row
    bitmask[1, 0] = 0b101
    logits = torch.zeros(3, 40)  # 8 columns beyond the mask: masked in masked rows
    apply_bitmask(logits, bitmask, rows=[1])
    assert torch.isinf(logits[1]).sum() == 38 and logits[1, 0] == 0 and logits[1, 2] == 0
    assert torch.equal(logits[[0, 2]], torch.zeros(2, 40))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_apply_bitmask_on_cuda_matches_cpu() -> None:
    g = torch.Generator().manual_seed(1)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (5, 40), generator=g, dtype=torch.int32)
    logits = torch.randn(5, 1270, generator=g)
    on_gpu = logits.cuda()
    apply_bitmask(logits, bitmask, rows=[0, 3, 4])
    apply_bitmask(on_gpu, bitmask, rows=[0, 3, 4])
    assert torch.equal(on_gpu.cpu(), logits)


def test_batch_fill_matches_each_matchers_allowed_ids(vocab: Vocab) -> None:
    info = vocab.info
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    a = compile_constraint(JsonSchema(schema), info).matcher()
    b = compile_constraint(Regex("[0-9]+ apples"), info).matcher()
    for t in vocab.encode("12"):
        assert b.advance(t)
    masks = BatchMasks(info, max_batch=4)
    before = masks.bitmask.clone()
    rows = masks.fill([a, None, b])
    assert rows == [0, 2]
    assert torch.equal(masks.bitmask[1], before[1])  # an unconstrained row is left alone
    logits = torch.zeros(3, info.vocab_size)
    apply_bitmask(logits, masks.bitmask, rows)
    expect = reference([set(a.allowed_token_ids()), set(b.allowed_token_ids())], info.vocab_size)
    assert torch.equal(torch.isfinite(logits[[0, 2]]), expect)
    assert torch.isfinite(logits[1]).all()
    assert set(vocab.encode(" apples")) & set(b.allowed_token_ids())
