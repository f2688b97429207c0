"""Fixtures shared by the runtime tests (helpers for real-executor tests: real_engine.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: intra-op threads only contend on the shared 2-core CI machine. Modules
    opt in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
