"""`ninfer demo-artifact`: print the path of the demo model artifact, converting it on first use."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="directory for the converted artifact (default: $NINFER_CACHE, else the user's cache dir)",
    )


def run(args: argparse.Namespace) -> int:
    from ninfer.artifact.demo import demo_artifact_path

    cache = Path(args.cache_dir) if args.cache_dir else None
    print(demo_artifact_path(cache, progress=True))
    return 0
