"""Helpers of the `ninfer serve` option tests: the parsed config of a command line, and a
real (tiny) artifact with chosen components."""

from __future__ import annotations

import argparse

import numpy as np

from ninfer.api.server.config import ServeConfig
from ninfer.artifact import ArtifactWriter, StoredTensor
from ninfer.commands import serve


def parse(*argv: str, cuda: bool = False) -> ServeConfig:
    """The ServeConfig of `ninfer serve ARGV` (`cuda`: whether a GPU is seen)."""
    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    return serve.config_from_args(p.parse_args(list(argv)), cuda_available=cuda)


def make_artifact(path, components, name="tiny-serve"):
    """A loadable artifact at `path` declaring `components` (its weights are one dummy tensor)."""
    header = {
        "architecture": "qwen3_5",
        "metadata": {"name": name} if name else {},
        "config": {},
        "tokenizer": "{}",
        "components": components,
    }
    with ArtifactWriter(path, header) as w:
        w.add("x", StoredTensor("f32", (2,), {"data": np.zeros(2, np.float32)}))
    return path
