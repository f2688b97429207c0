"""ninfer: a compiler-style LLM inference runtime.

`LLM` and `SamplingParams` are imported lazily so that `import ninfer` (and the CLI's light
subcommands) do not pay for torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from ninfer.llm import LLM

        return LLM
    if name == "SamplingParams":
        from ninfer.runtime.request import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'ninfer' has no attribute {name!r}")
