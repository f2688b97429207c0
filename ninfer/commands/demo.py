"""`ninfer demo-artifact`: print the path of the demo model artifact, converting it on first use."""

from __future__ import annotations

import argparse

from ninfer.commands.cache_dir import add_cache_dir, cache_dir


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_cache_dir(p, "directory for the converted artifact")


def run(args: argparse.Namespace) -> int:
    from ninfer.artifact.demo import demo_artifact_path

    print(demo_artifact_path(cache_dir(args), progress=True))
    return 0
