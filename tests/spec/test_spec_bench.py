"""`ninfer bench engine --spec draft` on the trained fixture drafting for itself: the report has
tau, the per-position acceptance, the step cost ratios and both engines' tok/s, and the greedy
outputs of the plain and the speculative engine are the same."""

from __future__ import annotations

import argparse
import json

import pytest

from ninfer.commands import bench


def test_spec_bench_reports_acceptance_and_costs(tiny_agent, tmp_path, capsys):
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    out = tmp_path / "spec.json"
    args = p.parse_args([
        "engine", str(tiny_agent), "--spec", "draft", "--draft-model", str(tiny_agent),
        "--draft-tokens", "3", "--batch-sizes", "1,2", "--input-len", "16", "--output-len", "12",
        "--device", "cpu", "--reps", "2", "--json", str(out),
    ])  # fmt: skip
    assert bench.run(args) == 0
    assert "tau" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert [r["batch"] for r in report["results"]] == [1, 2]
    for r in report["results"]:
        assert r["identical"] and r["draft_tokens"] == 3
        assert r["rounds"] > 0 and r["drafted"] >= r["accepted"] > 0
        assert 1.0 < r["tau"] <= 4.0 and len(r["accept_rate_per_position"]) == 3
        assert r["tau"] == pytest.approx(1.0 + sum(r["accept_rate_per_position"]))
        assert r["verify_ratio"] > 0 and r["draft_ratio"] > 0 and r["plain_tok_per_s"] > 0


def test_verify_cost_bench(tiny_agent, capsys):
    """`--spec verify`: the verify/decode step cost ratio per k + 1 (what the GPU run measures
    with --synthetic qwen3-8b), here on the trained fixture on CPU."""
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args([
        "engine", str(tiny_agent), "--spec", "verify", "--draft-tokens", "2",
        "--batch-sizes", "2", "--input-len", "32", "--device", "cpu", "--dtype", "float32",
        "--reps", "1",
    ])  # fmt: skip
    assert bench.run(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["batch", "k+1", "decode", "ms", "verify", "ms", "verify/decode"]
    rows = [line.split() for line in lines[2:]]
    assert [(r[0], r[1]) for r in rows] == [("2", "2"), ("2", "3")]
    assert all(float(r[4]) > 0 for r in rows)
