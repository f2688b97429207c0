"""`--cache-dir DIR`, the option of the commands that keep files in ninfer's cache
(`ninfer demo-artifact`, `ninfer models`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_cache_dir(p: argparse.ArgumentParser, what: str) -> None:
    """Adds --cache-dir; `what` names what the directory holds, for the help text."""
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        help=f"{what} (default: $NINFER_CACHE, else the user's cache dir)",
    )


def cache_dir(args: argparse.Namespace) -> Path | None:
    """The directory --cache-dir named; None leaves the choice to ninfer.artifact.cache."""
    return Path(args.cache_dir) if args.cache_dir else None
