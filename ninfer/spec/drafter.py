"""The drafter interface: what the engine's speculator needs from any proposal method.

A drafter sees only plain data (the tokens a request has committed) and returns plain tokens;
it keeps whatever state it needs (its own KV pages, a catch-up frontier) keyed by sequence id
and re-synchronises from the tokens it is given, so pauses, replays, thinking suffixes and
truncated rounds need no extra hook. `forget` is called when a request finishes. A drafter
that reads the target's hidden states (MTP) also has `observe(batch, hidden)`, which the
speculator calls after every target step with the rows the plan captured
(CompileOptions.capture; Speculator.observe).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import torch

from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.request import SamplingParams


class DraftRow(NamedTuple):
    """One request to draft for: its committed tokens (prompt + output; the last one is the
    token the target computes next), how many drafts at most, and its sampling."""

    seq_id: int
    tokens: Sequence[int]
    num_prompt: int
    k: int
    params: SamplingParams


class Draft(NamedTuple):
    """Up to `row.k` proposed tokens. `probs` [len(tokens), vocab] fp32: the distribution q
    each token was drawn from (after the request's temperature / top-k / top-p / min-p /
    penalties, as the plain sampler computes them), None for a greedy request (q is one-hot)."""

    tokens: tuple[int, ...]
    probs: torch.Tensor | None = None


NO_DRAFT = Draft(())


class Drafter(Protocol):
    """Proposes tokens for rows. `name` is the backend name the counters report."""

    name: str

    def propose(self, rows: Sequence[DraftRow], sampler: Sampler) -> list[Draft]:
        """One `Draft` per row, in order (possibly empty: the row then decodes plainly).
        Sampled rows draw from the request's own generator (`sampler.generator`)."""
        ...

    def forget(self, seq_id: int) -> None:
        """The request finished: drop its state and give back what it holds."""
        ...


def agree(have: list[int], tokens: Sequence[int], offset: int, limit: int, known: int = 0) -> int:
    """How many leading have[i] == tokens[offset + i], for i < limit, given that the first
    `known` of them were found equal before: a request's committed tokens only grow, so a
    drafter that keeps its own copy of them checks only what is new since its last round (the
    whole history every round cost 2 x 0.8 ms at 32k tokens). The last known entry is checked
    again; should it differ, everything is checked."""
    known = min(known, limit)
    if known and have[known - 1] != tokens[offset + known - 1]:
        known = 0
    if have[known:limit] == list(tokens[offset + known : offset + limit]):
        return limit
    i = known
    while i < limit and have[i] == tokens[offset + i]:
        i += 1
    return i


class TimedDrafter:
    """What the drafters share: `propose` runs their `_propose` and adds its wall time to
    `seconds` (bench: the drafter's cost per round)."""

    seconds: float = 0.0

    def propose(self, rows: Sequence[DraftRow], sampler: Sampler) -> list[Draft]:
        t0 = time.perf_counter()
        try:
            return self._propose(rows, sampler)
        finally:
            self.seconds += time.perf_counter() - t0

    def _propose(self, rows: Sequence[DraftRow], sampler: Sampler) -> list[Draft]:
        raise NotImplementedError
