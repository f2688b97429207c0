"""Fixtures of the vision tests: the tiny vision-language models (artifacts/fixture_vision.py),
their transformers reference, and prompt builders (media_prompts.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest
from media_prompts import PromptBuilder

from artifacts.fixture_vision import build_vision_fixture, build_vision_hf_dir


@pytest.fixture(scope="module", autouse=True)
def _single_threaded(one_thread):
    """Every module here runs with one intra-op thread (tests/conftest.py, one_thread)."""


@pytest.fixture(scope="session")
def vision_artifact(fixture_root: Path) -> Callable[[str], Path]:
    """arch (qwen3_5_vl | qwen3_5_moe_vl) -> its tiny `.ninfer` with the vision component."""
    return lambda arch: build_vision_fixture(arch, fixture_root)


@pytest.fixture(scope="session")
def reference_model(fixture_root: Path) -> Callable[[str], object]:
    """arch -> the transformers conditional-generation model the artifact was converted from."""

    @functools.cache
    def load(arch: str):
        import transformers as tf

        cls = {
            "qwen3_5_vl": tf.Qwen3_5ForConditionalGeneration,
            "qwen3_5_moe_vl": tf.Qwen3_5MoeForConditionalGeneration,
        }[arch]
        return cls.from_pretrained(build_vision_hf_dir(arch, fixture_root)).float().eval()

    return load


@pytest.fixture(scope="session")
def prompt_builder(vision_artifact) -> Callable[[str], PromptBuilder]:
    return lambda arch: PromptBuilder(vision_artifact(arch))
