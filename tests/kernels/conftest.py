"""Kernel tests run on CUDA when present, else on CPU under the Triton interpreter.

TRITON_INTERPRET must be set before any ``@triton.jit`` function is decorated, i.e. before the
``kernels`` modules are imported; pytest loads this file before the test modules beside it.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device() -> str:
    return DEVICE


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if "gpu" in item.keywords and str(item.path).startswith(here):
            item.add_marker(skip)
