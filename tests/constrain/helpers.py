"""Helpers of the constraint tests: a real tokenizer (`Vocab`) and a driver that decodes random
tokens under a constraint: each step draws random logits, masks them with the batched bitmask
path the sampler uses (`BatchMasks.fill` + `apply_bitmask`) and takes the argmax, i.e. a uniformly
random allowed token per row."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer

from ninfer.artifact.format import Artifact
from ninfer.constrain import BatchMasks, Constraint, Matcher, TokenizerInfo, apply_bitmask

TINY_AGENT = Path(__file__).resolve().parents[2] / "artifacts" / "fixtures" / "tiny-agent.ninfer"


class Vocab:
    """One real tokenizer: the engine's info and the `tokenizers` object to decode with."""

    def __init__(self, path: Path) -> None:
        artifact = Artifact(path)
        self.info = TokenizerInfo.from_artifact(artifact)
        self.tokenizer = Tokenizer.from_str(artifact.tokenizer_json)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids


def decode_random(
    constraint: Constraint,
    seeds: Sequence[int],
    *,
    max_tokens: int = 800,
    thinking: bool = False,
    prefix: Sequence[int] = (),
) -> list[tuple[list[int], Matcher]]:
    """One sequence per seed, decoded together as a batch until each matcher terminates (or
    `max_tokens`). `prefix` tokens are committed first (forced, as a thinking suffix would be).
    Returns each sequence's tokens (without the final EOS) and its matcher."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors: a thread pool only contends with llguidance's
    try:
        return _decode(constraint, seeds, max_tokens, thinking, prefix)
    finally:
        torch.set_num_threads(threads)


def _decode(
    constraint: Constraint,
    seeds: Sequence[int],
    max_tokens: int,
    thinking: bool,
    prefix: Sequence[int],
) -> list[tuple[list[int], Matcher]]:
    info = constraint.info
    matchers = [constraint.matcher(thinking=thinking) for _ in seeds]
    outs: list[list[int]] = [[] for _ in seeds]
    for m, out in zip(matchers, outs, strict=True):
        for t in prefix:
            assert m.advance(t), m.error
            out.append(t)
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    masks = BatchMasks(info, len(seeds))
    for _ in range(max_tokens):
        live = [None if m.is_terminated() else m for m in matchers]
        if all(m is None for m in live):
            break
        rows = masks.fill(live)
        logits = torch.stack([torch.randn(info.vocab_size, generator=g) for g in gens])
        apply_bitmask(logits, masks.bitmask, rows)
        for i in rows:
            t = int(torch.argmax(logits[i]))
            assert matchers[i].advance(t), matchers[i].error
            if t not in info.eos_token_ids:
                outs[i].append(t)
    return list(zip(outs, matchers, strict=True))
