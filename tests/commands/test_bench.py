"""`ninfer bench` on CPU: argument parsing, the latency and limit arithmetic, and a real
engine-mode run on a tiny fixture (with the transformers peer) that writes its reports."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from ninfer.bench.limits import Ceilings, WorkModel
from ninfer.bench.loadgen import RequestTiming, percentiles, summarise
from ninfer.cli import build_parser
from ninfer.commands import bench, bench_report


def _parse(argv: list[str]) -> argparse.Namespace:
    return build_parser(["bench", *argv]).parse_args(["bench", *argv])


def test_arguments():
    a = _parse(
        [
            "engine",
            "--synthetic",
            "qwen3-8b",
            "--weights",
            "fp8",
            "--batch-sizes",
            "1,8",
            "--peer",
            "transformers",
        ]
    )
    assert (a.mode, a.synthetic, a.weights, a.batch_sizes, a.peer) == (
        "engine",
        "qwen3-8b",
        "fp8",
        [1, 8],
        "transformers",
    )
    s = _parse(["serve", "--url", "http://h:1", "--concurrency", "2,4", "--output-len", "9"])
    assert (s.mode, s.url, s.concurrency, s.output_len) == ("serve", "http://h:1", [2, 4], 9)
    with pytest.raises(SystemExit):
        _parse(["engine", "--batch-sizes", "0"])
    with pytest.raises(SystemExit):
        _parse(["engine", "--peer", "vllm"])


def test_summary_math():
    a = RequestTiming(0.0, [0.1, 0.2, 0.4])  # ttft 100 ms, itls 100/200, tpot 150
    b = RequestTiming(0.05, [0.35, 0.45])  # ttft 300 ms, itl 100, tpot 100
    s = summarise([a, b])
    assert s["output_tokens"] == 5 and s["wall_s"] == pytest.approx(0.45)
    assert s["output_tok_per_s"] == pytest.approx(5 / 0.45)
    assert s["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert s["tpot_ms"]["mean"] == pytest.approx(125.0)
    assert s["itl_ms"]["p50"] == pytest.approx(100.0) and s["itl_ms"]["p99"] == pytest.approx(198.0)
    assert percentiles([])["p90"] is None
    failed = summarise([RequestTiming(0.0, error="HTTP 500")])
    assert failed["failed"] == 1 and failed["output_tok_per_s"] is None


def test_limit_math():
    w = WorkModel(dense_weight_bytes=1000, expert_weight_bytes=0, num_experts=0, top_k=0, embed_row_bytes=10,
                  kv_bytes_per_token=2, state_bytes_per_lane=5, active_params=300, head_params=100,
                  attn_layers=1, heads=2, head_dim=4)  # fmt: skip
    assert w.decode_bytes(2, 100) == 1000 + 2 * 10 + 2 * 100 * 2 + 2 * 2 * 5
    assert w.prefill_flops(10) == 2 * 200 * 10 + 2 * 100 + 4 * 50 * 2 * 4
    moe = WorkModel(0, 800, 8, 2, 0, 0, 0, 0, 0, 0, 0, 0)
    assert moe.decode_bytes(1, 0) == 200  # one token touches 2 of 8 experts
    c = Ceilings(copy_bytes_per_s=1440.0, matmul_flops_per_s=1e6, device="x")
    summary = {"tpot_ms": {"p50": 1000.0}, "ttft_ms": {"p99": 1000.0}}
    fig = bench.limit_figures(summary, w, c, 2, 10, 20)  # context 20: 1000+20+80+20 = 1120 bytes
    assert fig["decode_bytes_per_step"] == 1120
    assert fig["decode_limit_tok_per_s"] == pytest.approx(2 / (1120 / 1440))
    assert fig["decode_ratio"] == pytest.approx(1120 / 1440)  # limit step time / measured step time
    assert fig["prefill_ratio"] == pytest.approx(2 * w.prefill_flops(10) / 1e6)


def test_engine_bench_on_a_fixture(fixture_artifacts, fixture_hf_dir, tmp_path, capsys):
    out = tmp_path / "r.json"
    md = tmp_path / "r.md"
    argv = ["engine", str(fixture_artifacts("qwen3")), "--device", "cpu", "--batch-sizes", "1,2", "--input-len", "12",
            "--output-len", "6", "--peer", "transformers", "--hf-dir", str(fixture_hf_dir("qwen3")),
            "--json", str(out), "--md", str(md)]  # fmt: skip
    assert bench.run(_parse(argv)) == 0
    report = json.loads(out.read_text())
    assert [r["batch"] for r in report["results"]] == [1, 2]
    for r in report["results"]:
        assert r["output_tokens"] == 6 * r["batch"] and r["failed"] == 0
        assert r["ttft_ms"]["p50"] > 0 and r["tpot_ms"]["p50"] > 0 and r["output_tok_per_s"] > 0
        assert 0 < r["decode_ratio"] and 0 < r["prefill_ratio"]
        assert r["peer"]["output_tokens"] == 6 * r["batch"] and r["vs_peer_output_tok_per_s"] > 0
    assert report["copy_gb_per_s"] > 0 and report["matmul_tflops"] > 0
    # the limit is measured for the dtype the plan runs (float32 on cpu), so the prefill ratio
    # is a fraction of it: a bf16 rate on cpu read "0 TFLOP/s" and "prefill/matmul 1256.2%"
    assert report["matmul_dtype"] == "float32" and report["dtype"] == "f32"
    assert all(r["prefill_ratio"] < 1.0 for r in report["results"])
    assert report["fusions"]["fuse_qkv"] == 2 and "fuse_norm_linear" not in report["fusions"]
    assert "| 2 |" in md.read_text()
    printed = capsys.readouterr().out
    assert "decode/limit" in printed and "fusions: fuse_qkv=2" in printed
    limits = re.search(
        r"copy ([\d.]+) ([GMk])B/s \(read\+write\), float32 matmul ([\d.]+) ([TGM])FLOP/s", printed
    )
    assert limits, printed
    assert float(limits.group(1)) > 0 and float(limits.group(3)) > 0  # never "0 TFLOP/s"
    assert "bf16" not in printed and "note: a ratio above 100%" not in printed


def test_synthetic_needs_a_known_name():
    from ninfer.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown model"):
        bench.run(_parse(["engine", "--synthetic", "gpt-9", "--device", "cpu"]))


def test_steady_decode_leaves_out_other_requests_prefill() -> None:
    """Steady decode reads the intervals between a full-batch decode step and the next step;
    prefill steps (and their duration) are left out, unlike batch / TPOT."""
    from types import SimpleNamespace

    from ninfer.commands.bench import _step_stats
    from ninfer.runtime.executors.cuda.step_layout import StepRecord

    def rec(decode: bool, rows: int, t: float) -> StepRecord:
        return StepRecord(decode, decode, rows, rows, 1e-4, None, None, t)

    # two decode steps of 2 rows 5 ms apart, a 40 ms prefill step, two more, one of 1 row
    times = [(True, 2, 1.000), (True, 2, 1.005), (False, 1, 1.010), (True, 2, 1.050),
             (True, 2, 1.055), (True, 1, 1.060), (True, 2, 1.070)]  # fmt: skip
    ex = SimpleNamespace(records=[rec(*t) for t in times])
    out = _step_stats(ex, 2, 800.0)
    assert out["decode_steps"] == 6 and out["steady_decode_steps"] == 4
    assert out["steady_decode_tok_per_s"] == pytest.approx(2 / 0.005)
    assert out["steady_decode_ratio"] == pytest.approx(0.5)


def test_the_report_says_when_a_ratio_beats_the_measured_limit():
    """A ratio above 100% is not a result: the printed report says the limit measurement was
    disturbed instead of leaving a nonsense figure unexplained."""
    row = {"batch": 1, "prefill_ratio": 12.562, "decode_ratio": 0.5, "errors": {}}
    printed = bench_report.format_report({"mode": "engine", "results": [row]})
    assert "1256.2%" in printed and "note: a ratio above 100% means" in printed
