"""The `ninfer` command line: one entry point, one module per subcommand.

Each subcommand lives in `ninfer/commands/<name>.py` and provides
`add_arguments(parser)` and `run(args) -> int`. Modules are imported lazily so that
`ninfer inspect` does not pay for torch or the HTTP stack.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from ninfer.errors import NinferError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "convert": (
        "ninfer.commands.convert",
        "convert a Hugging Face directory or GGUF file to .ninfer",
    ),
    "inspect": ("ninfer.commands.inspect", "show an artifact's name, config, tensors and formats"),
    "compile": ("ninfer.commands.compile", "print the execution plan compiled for a device"),
    "serve": ("ninfer.commands.serve", "serve an artifact over OpenAI and Anthropic HTTP"),
    "bench": ("ninfer.commands.bench", "measure TTFT, TPOT, ITL and throughput against the limit"),
    "demo-artifact": ("ninfer.commands.demo", "print the path of the embedded demo model artifact"),
    "models": ("ninfer.commands.models", "list and fetch the larger models published on PyPI"),
}


class _Parser(argparse.ArgumentParser):
    """No abbreviated flags, here and in every subcommand's parser (they take this class):
    `--api-ke KEY` would work as --api-key yet escape the request log's redaction."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = _Parser(prog="ninfer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # Only the chosen subcommand's module is imported (its flags are needed for --help).
        if name in argv:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "_module", None):
        parser.print_help()
        return 2
    try:
        return int(args._module.run(args) or 0)
    except NinferError as e:
        print(f"ninfer {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `ninfer inspect A | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
