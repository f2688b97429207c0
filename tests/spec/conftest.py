"""Fixtures of the speculative-decoding tests (engine helpers: spec_engine.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", autouse=True)
def _single_threaded(one_thread):
    """Every module here runs with one intra-op thread (tests/conftest.py, one_thread)."""


@pytest.fixture(scope="session")
def mtp_artifacts(fixture_root):
    """arch -> the tiny random fixture of `arch` (a text fixture, or a vision one: qwen3_5_vl,
    qwen3_5_moe_vl) with a seeded random MTP head, converted from its Hugging Face directory
    plus `mtp.safetensors` (artifacts/mtp_head.py)."""
    from artifacts.mtp_head import build_mtp_fixture

    return lambda arch: build_mtp_fixture(arch, fixture_root)


@pytest.fixture(scope="session")
def mtp_hf_dirs(fixture_root):
    """arch -> the Hugging Face directory `mtp_artifacts(arch)` is converted from (the
    fixture's, plus the head as `mtp.safetensors`)."""
    from artifacts.mtp_head import build_mtp_hf_dir

    return lambda arch: build_mtp_hf_dir(arch, fixture_root)


@pytest.fixture(scope="session")
def tiny_agent_mtp(fixture_root):
    """The trained tiny-agent fixture with its trained MTP head attached (artifacts/train_mtp.py:
    the committed head, or a fresh one when tiny-agent.ninfer changed since)."""
    from artifacts.train_mtp import tiny_agent_mtp

    return tiny_agent_mtp(fixture_root)
