"""The README's Python example runs as written, on the demo model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ninfer.errors import ConvertError

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow
def test_the_python_example_runs(capsys) -> None:
    from ninfer.artifact.demo import demo_gguf_path

    try:
        demo_gguf_path()
    except ConvertError as e:
        pytest.skip(str(e))
    block = re.search(
        r"## Python\n\n```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL
    )
    assert block is not None, "README has no Python example"
    scope: dict = {}
    exec(compile(block.group(1), "README.md", "exec"), scope)  # noqa: S102 - our own README
    out = capsys.readouterr().out
    assert "Paris" in out.splitlines()[0]
    scope["llm"].close()
