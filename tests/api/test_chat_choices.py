"""The seed stream of each of n choices: choice i of seed s samples with s + i, kept in the
signed 64-bit range the seed field takes; no seed stays no seed (each choice draws its own)."""

from __future__ import annotations

from ninfer.api.chat.choices import choice_request
from ninfer.api.service.generation import GenerationRequest, SamplingOptions


def seeded(seed: int | None) -> GenerationRequest:
    return GenerationRequest(messages=[], sampling=SamplingOptions(temperature=1.0, seed=seed))


def test_choice_seeds() -> None:
    assert [choice_request(seeded(7), i).sampling.seed for i in range(3)] == [7, 8, 9]
    assert choice_request(seeded(7), 0) == seeded(7)
    top = (1 << 63) - 1
    assert choice_request(seeded(top), 1).sampling.seed == -(1 << 63)
    assert choice_request(seeded(-1), 2).sampling.seed == 1
    assert choice_request(seeded(None), 2).sampling.seed is None
    assert choice_request(seeded(7), 2).sampling.temperature == 1.0
