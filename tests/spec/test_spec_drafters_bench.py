"""bench/spec_drafters.py on the tiny synthetic model on CPU: the report it writes has the
decode step and every drafter round (MTP k 1..3 and k 3 after 2 accepted drafts, DFlash k 7
and 15, each with and without --lm-head-draft), each a positive finite time and ratio, MTP's
per drafted token the ratio / k.
(The figures themselves are the GPU run's business; a round that drafts fewer tokens than
asked, e.g. a drafter never fed the prompt's hidden rows, fails the bench.)"""

from __future__ import annotations

import math

import pytest

from bench.spec_drafters import main

EXPECTED = [
    ("decode step", "1"),
    ("mtp", "1"), ("mtp", "2"), ("mtp", "3"), ("mtp", "3, a=2"),
    ("mtp --lm-head-draft", "1"), ("mtp --lm-head-draft", "2"), ("mtp --lm-head-draft", "3"),
    ("mtp --lm-head-draft", "3, a=2"),
    ("dflash", "7"), ("dflash", "15"),
    ("dflash --lm-head-draft", "7"), ("dflash --lm-head-draft", "15"),
]  # fmt: skip


def test_drafter_bench_reports_every_round(tmp_path, capsys):
    out = tmp_path / "drafters.md"
    argv = ["--synthetic", "tiny-qwen3", "--device", "cpu", "--context", "48", "--repeats", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    report = out.read_text()
    assert report in capsys.readouterr().out
    lines = report.splitlines()
    header = lines.index(
        "| drafter | k | ms per round | of a decode step | per drafted token | target |"
    )
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[header + 2 :]]
    assert [(r[0], r[1]) for r in rows if r[0]] == EXPECTED
    for drafter, k, ms, ratio, per, target in rows:
        assert math.isfinite(float(ms)) and float(ms) > 0
        assert math.isfinite(float(ratio)) and float(ratio) > 0
        if drafter.startswith("mtp"):
            drafted = int(k.split(",")[0])
            assert float(per) == pytest.approx(float(ratio) / drafted, abs=2e-3)
            assert target.startswith("<= 0.12" if drafter == "mtp" else "<= 0.06")
        elif drafter.startswith("dflash"):
            assert per == "-" and target.startswith("<= 0.25" if drafter == "dflash" else "<= 0.15")
        else:
            assert float(ratio) == 1.0


def test_drafter_bench_refuses_a_bad_flag(capsys):
    with pytest.raises(SystemExit):
        main(["--synthetic", "tiny-qwen3", "--device", "cpu", "--repeats", "0"])
    assert "--repeats" in capsys.readouterr().err


def test_drafter_bench_times_one_head_when_asked(tmp_path):
    out = tmp_path / "draft.md"
    argv = ["--synthetic", "tiny-qwen3", "--device", "cpu", "--context", "48", "--repeats", "1"]
    assert main([*argv, "--drafters", "dflash", "--heads", "draft", "--out", str(out)]) == 0
    named = [line.split("|")[1].strip() for line in out.read_text().splitlines()[7:]]
    assert named == ["decode step", "dflash --lm-head-draft", "dflash --lm-head-draft"]
    with pytest.raises(SystemExit):
        main([*argv, "--heads", "bf16"])
