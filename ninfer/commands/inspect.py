"""`ninfer inspect ARTIFACT [--json]`: what an artifact holds, with every checksum verified."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from typing import Any

from ninfer.artifact import Artifact
from ninfer.units import nbytes


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("artifact", help=".ninfer file")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--tensors", action="store_true", help="also list every tensor")


def summary(a: Artifact) -> dict[str, Any]:
    from tokenizers import Tokenizer

    a.verify()
    by_format: dict[str, dict[str, int]] = defaultdict(lambda: {"tensors": 0, "bytes": 0})
    for info in a.tensors.values():
        by_format[info.format]["tensors"] += 1
        by_format[info.format]["bytes"] += info.nbytes
    tok = Tokenizer.from_str(a.tokenizer_json)
    return {
        "path": str(a.path),
        "format_version": a.header["format_version"],
        "name": a.name,
        "architecture": a.architecture,
        "config": a.config,
        "components": a.components,
        "tokenizer_size": tok.get_vocab_size(with_added_tokens=True),
        "chat_template": a.chat_template is not None,
        "special_tokens": a.special_tokens,
        "generation": a.generation,
        "tensor_count": len(a.tensors),
        "total_bytes": sum(v["bytes"] for v in by_format.values()),
        "formats": dict(sorted(by_format.items())),
        "checksums": "verified",
    }


def run(args: argparse.Namespace) -> int:
    a = Artifact(args.artifact)
    s = summary(a)
    if args.tensors:
        s["tensors"] = {
            n: {"format": i.format, "shape": list(i.shape), "bytes": i.nbytes}
            for n, i in a.tensors.items()
        }
    if args.json:
        print(json.dumps(s, indent=2, ensure_ascii=False))
        return 0
    cfg = s["config"]
    print(f"name            {s['name']}")
    print(f"architecture    {s['architecture']}")
    print(f"format version  {s['format_version']}")
    print(f"components      {', '.join(s['components'])}")
    print(f"tokenizer size  {s['tokenizer_size']}")
    print(f"chat template   {'present' if s['chat_template'] else 'absent'}")
    print(f"eos token ids   {s['special_tokens'].get('eos_token_ids')}")
    print(f"sampling        {_sampling(s['generation'])}")
    print(f"tensors         {s['tensor_count']} ({nbytes(s['total_bytes'])}), checksums verified")
    for fmt, v in s["formats"].items():
        print(f"  {fmt:<12}  {v['tensors']:>5} tensors  {nbytes(v['bytes']):>12}")
    print("config")
    for k in sorted(cfg):
        if isinstance(cfg[k], (dict, list)) and len(json.dumps(cfg[k])) > 80:
            continue
        print(f"  {k} = {json.dumps(cfg[k])}")
    if args.tensors:
        print("tensors")
        for n, t in s["tensors"].items():
            print(f"  {n}  {t['format']}  {t['shape']}")
    return 0


def _sampling(generation: dict) -> str:
    """The generation defaults requests get, as far as they differ from the plain ones."""
    from ninfer.artifact.generation import PLAIN, effective_defaults

    got = effective_defaults(generation)
    differ = [f"{k} {v:g}" for k, v in got.items() if v != PLAIN[k]]
    return ", ".join(differ) + " (recorded)" if differ else "plain defaults (none recorded)"
