"""Fixtures of the speculative-decoding tests (engine helpers: spec_engine.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", autouse=True)
def _single_threaded(one_thread):
    """Every module here runs with one intra-op thread (tests/conftest.py, one_thread)."""
