"""Speculative decoding on the real pair, on CPU: Qwen2.5-Coder-1.5B-Instruct drafted by
Qwen2.5-Coder-0.5B-Instruct (both Q4_K_M GGUF, installed by `ninfer models`), greedy, on the
coding prompts of bench/data/coding_prompts.txt.

    .venv/bin/python bench/spec_coder_pair.py [--tokens 48] [--draft-tokens 4] [--batch-sizes 1]
                                              [--out bench/results/spec-coder-pair-cpu]

It runs `ninfer bench engine TARGET --spec draft --draft-model DRAFT` (ninfer.commands.bench_spec):
the plain and the speculative engine on the same prompts in one process, then the step costs
on the target's executor. Reported: tau (tokens committed per verify round), the acceptance
rate per draft position, the verify/decode and drafter/decode cost ratios, and tok/s of both
engines. The GGUF files are converted once into the ninfer cache. Slow on CPU: keep --tokens
small. The header records the load average (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MODELS = Path(os.path.expanduser("~/.cache/ninfer/models"))
TARGET = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFT = MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def _shown(text: str) -> str:
    """A path as the report records it: in the repository relative, at home under ~."""
    return text.replace(f"{REPO}/", "").replace(os.path.expanduser("~"), "~")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=48, help="output tokens per prompt (at most)")
    p.add_argument("--draft-tokens", default="4")
    p.add_argument("--batch-sizes", default="1")
    p.add_argument("--prompts", default=str(REPO / "bench" / "data" / "coding_prompts.txt"))
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "spec-coder-pair-cpu"))
    args = p.parse_args()
    for f in (TARGET, DRAFT):
        if not f.exists():
            sys.exit(f"{f} is missing: install the pair with `ninfer models` first")
    from ninfer.commands import bench
    from ninfer.commands.bench_spec import format_spec_report, run_spec_bench

    argv = ["engine", str(TARGET), "--spec", "draft", "--draft-model", str(DRAFT),
            "--draft-tokens", args.draft_tokens, "--prompts", args.prompts, "--output-len",
            str(args.tokens), "--batch-sizes", args.batch_sizes, "--device", "cpu", "--reps", "5"]  # fmt: skip
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    report = run_spec_bench(parser.parse_args(argv))
    command = "ninfer bench " + " ".join(shlex.quote(_shown(a)) for a in argv)
    report["command"] = command
    report["prompts"] = _shown(report["prompts"])
    report["load_average"] = os.getloadavg()
    report["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = format_spec_report(report)
    print(text)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    load = ", ".join(f"{x:.1f}" for x in report["load_average"])
    out.with_suffix(".md").write_text(
        f"`{command}`\n\n{report['date']}, load average {load} (shared machine)\n\n```\n{text}\n```\n",
        encoding="utf-8",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
