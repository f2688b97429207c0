"""The README's Python examples run as written, on the demo model (converted into a temporary
cache), and print something."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, re.DOTALL | re.MULTILINE)


def test_the_readme_has_a_python_example():
    assert python_blocks()


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_python_example_runs_as_written(index, tmp_path):
    from ninfer.artifact.demo import demo_artifact_path, demo_gguf_path
    from ninfer.errors import ConvertError

    try:
        demo_gguf_path()
    except ConvertError as e:
        pytest.skip(str(e))
    cache = tmp_path / "cache"
    demo_artifact_path(cache)  # what the example's first call does, done here to keep it short
    r = subprocess.run(
        [sys.executable, "-c", python_blocks()[index]],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,  # not the repository: the example must not depend on the checkout's files
        env=dict(os.environ, NINFER_CACHE=str(cache), PYTHONPATH=str(ROOT)),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    if "capital of France" in python_blocks()[index]:
        assert "Paris" in r.stdout
