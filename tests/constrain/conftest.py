"""Real tokenizers for the constraint tests (session-wide: building a token trie costs)."""

from __future__ import annotations

import pytest

from ninfer.artifact.demo import demo_artifact_path
from tests.constrain.helpers import TINY_AGENT, Vocab


@pytest.fixture(scope="session")
def tiny() -> Vocab:
    """The tiny agent fixture's Qwen-style tokenizer (512 ids, <think>, <tool_call> tokens)."""
    return Vocab(TINY_AGENT)


@pytest.fixture(scope="session")
def smol() -> Vocab:
    """The demo model's tokenizer (SmolLM2, 49152 ids; no tool or think tokens)."""
    return Vocab(demo_artifact_path())


@pytest.fixture(scope="session", params=["tiny", "smol"])
def vocab(request: pytest.FixtureRequest) -> Vocab:
    return request.getfixturevalue(request.param)
