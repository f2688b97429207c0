"""The `ninfer bench` report: the terminal table, the Markdown table and the files written.

One row per batch size (or concurrency) with TTFT / TPOT / ITL percentiles, throughput, the
ratios to the limits measured in the same run and, in engine mode, the host time per step and
the peer's figures; a header with the configuration and the limits; notes under the table for
what the figures cannot show (ratios above the limit, failed requests, token counts).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from typing import Any


def command_line() -> str:
    """The `ninfer bench ...` command this process runs, quoted for a shell (report headers)."""
    args = sys.argv[2:]
    return "ninfer bench " + " ".join(shlex.quote(a) for a in args) if args else "ninfer bench"


def write_report(
    report: dict[str, Any],
    args: argparse.Namespace,
    markdown: Callable[[dict[str, Any]], str] | None = None,
) -> None:
    """Write `report` to --json PATH and, with a `markdown` formatter, to --md PATH."""
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    if markdown is not None and getattr(args, "md", None):
        with open(args.md, "w", encoding="utf-8") as f:
            f.write(markdown(report))


def _f(v: Any, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _rate(value: float, unit: str) -> str:
    """`value` per second with an SI prefix that keeps 3 significant digits (a CPU's 90
    GFLOP/s is not "0 TFLOP/s")."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _pct(d: dict[str, Any] | None) -> str:
    if not d:
        return "-"
    return "/".join(_f(d.get(k), "{:.1f}") for k in ("p50", "p90", "p99"))


COLUMNS = ("batch", "TTFT ms p50/90/99", "TPOT ms p50/90/99", "ITL ms p50/90/99", "out tok/s", "decode tok/s",
           "limit tok/s", "decode/limit", "steady tok/s", "steady/limit", "prefill/matmul", "host ms/step",
           "peer tok/s", "vs peer")  # fmt: skip


def _cells(r: dict[str, Any]) -> list[str]:
    peer = r.get("peer") or {}
    host = (r.get("host_ms_per_decode_step") or {}).get("p50")
    return [
        str(r["batch"]), _pct(r.get("ttft_ms")), _pct(r.get("tpot_ms")), _pct(r.get("itl_ms")),
        _f(r.get("output_tok_per_s"), "{:.1f}"), _f(r.get("decode_tok_per_s"), "{:.1f}"),
        _f(r.get("decode_limit_tok_per_s"), "{:.1f}"), _f(r.get("decode_ratio"), "{:.1%}"),
        _f(r.get("steady_decode_tok_per_s"), "{:.1f}"), _f(r.get("steady_decode_ratio"), "{:.1%}"),
        _f(r.get("prefill_ratio"), "{:.1%}"), _f(host, "{:.3f}"), _f(peer.get("output_tok_per_s"), "{:.1f}"),
        _f(r.get("vs_peer_output_tok_per_s"), "{:.2f}x"),
    ]  # fmt: skip


def _header(report: dict[str, Any]) -> list[str]:
    keys = (
        "mode",
        "model",
        "weights",
        "dtype",
        "kv_dtype",
        "cuda_graphs",
        "overlap",
        "device",
        "input_len",
        "output_len",
    )
    lines = [" ".join(f"{k}={report[k]}" for k in keys if k in report)]
    if report.get("fusions"):
        lines.append("fusions: " + " ".join(f"{k}={v}" for k, v in report["fusions"].items()))
    if "copy_gb_per_s" in report:
        dtype = report.get("matmul_dtype", "bfloat16")
        lines.append(f"limits measured here: copy {_rate(report['copy_gb_per_s'] * 1e9, 'B/s')} "
                     f"(read+write), {dtype} matmul {_rate(report['matmul_tflops'] * 1e12, 'FLOP/s')}")  # fmt: skip
    if "limit" in report:
        lines.append(report["limit"])
    return lines


def _notes(report: dict[str, Any]) -> list[str]:
    """Lines under the table: ratios the limit cannot explain, and why requests failed."""
    out = []
    ratios = ("decode_ratio", "steady_decode_ratio", "prefill_ratio")
    if any((r.get(k) or 0) > 1.0 for r in report["results"] for k in ratios):
        out.append("note: a ratio above 100% means the run beat the limit measured here, so that "
                   "measurement was disturbed (a busy machine); rerun on an idle one")  # fmt: skip
    for r in report["results"]:
        b, prompt = r["batch"], r.get("prompt_tokens")
        if prompt and prompt["min"] == prompt["max"] == report.get("input_len"):
            out.append(f"batch {b}: every prompt was {prompt['min']} tokens as the server counted")
        elif prompt:
            out.append(f"batch {b}: the server counted {prompt['min']}..{prompt['max']} prompt "
                       f"tokens (asked for {report.get('input_len')})")  # fmt: skip
        if r.get("estimated_timings"):
            out.append(f"batch {b}: {r['estimated_timings']} requests streamed no text (tokens that "
                       "decode to none); their token times are spread over the server's decode time")  # fmt: skip
        for reason, count in (r.get("errors") or {}).items():
            out.append(f"failed at batch {b}: {count} x {reason}")
    return out


def format_report(report: dict[str, Any]) -> str:
    rows = [list(COLUMNS)] + [_cells(r) for r in report["results"]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    out = _header(report)
    out += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(out + _notes(report))


def format_markdown(report: dict[str, Any]) -> str:
    out = (
        [f"`{report.get('command', 'ninfer bench')}`", ""]
        + [f"{line}  " for line in _header(report)]
        + [""]
    )
    out.append("| " + " | ".join(COLUMNS) + " |")
    out.append("|" + "---|" * len(COLUMNS))
    out += ["| " + " | ".join(_cells(r)) + " |" for r in report["results"]]
    notes = _notes(report)
    return "\n".join(out + ([""] + [f"{n}  " for n in notes] if notes else [])) + "\n"
