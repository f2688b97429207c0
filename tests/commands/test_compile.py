"""`ninfer compile`: the printed plan of every fixture on cpu and cuda is pinned by snapshots;
impossible configurations are refused with one line."""

from __future__ import annotations

import json

import pytest

from ninfer.cli import main
from ninfer.ir.plan import Plan

ARCHS = ("llama", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe")


def compile_out(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["compile", *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_compile_plan_snapshot(arch, device, fixture_artifacts, capsys, snapshot) -> None:
    rc, out, err = compile_out(
        capsys, str(fixture_artifacts(arch)), "--device", device, "--max-concurrency", "4"
    )
    assert rc == 0, err
    assert out == snapshot
    assert "fused: fuse_qkv=" in out and "ledger:" in out
    assert ("cuda graph buckets: 1 2 3 4" in out) == (device == "cuda")


def test_compile_json_round_trips(fixture_artifacts, capsys) -> None:
    path = str(fixture_artifacts("qwen3_5"))
    rc, out, _ = compile_out(capsys, path, "--json", "--kv-dtype", "fp8", "--kv-capacity", "2048")
    assert rc == 0
    plan = Plan.from_json(out)
    assert plan.kv["dtype"] == "fp8" and plan.kv["capacity_tokens"] == 2048
    assert json.loads(plan.to_json()) == json.loads(out)
    rc, text, _ = compile_out(capsys, path, "--kv-dtype", "fp8", "--kv-capacity", "2048")
    assert text == plan.to_text()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-concurrency", "0"], "--max-concurrency must be in 1..8, got 0"),
        (["--max-concurrency", "9"], "--max-concurrency must be in 1..8, got 9"),
        (["--kv-dtype", "q3"], "--kv-dtype q3: unknown KV dtype"),
        (["--device", "tpu"], "--device tpu: unknown device"),
        (["--kv-capacity", "lots"], "--kv-capacity lots: expected a number of tokens or 'auto'"),
        (
            ["--device", "cuda", "--kv-capacity", "100000000000"],
            "--kv-capacity 100000000000: KV needs",
        ),
        (
            ["--memory-gib", "0.5", "--kv-capacity", "auto"],
            "--kv-capacity auto: no memory left for KV",
        ),
        (
            ["--max-context", "4000000", "--prefill-chunk", "4000000", "--memory-gib", "1"],
            "before any KV (weights 0.00 GiB, workspace",
        ),
    ],
)
def test_impossible_configurations_are_refused(argv, message, fixture_artifacts, capsys) -> None:
    rc, out, err = compile_out(capsys, str(fixture_artifacts("llama")), *argv)
    assert rc == 2 and out == ""
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_prefill_chunk_beyond_the_context_sizes_the_workspace_by_the_context(
    fixture_artifacts, capsys
) -> None:
    """A chunk never holds more than one sequence's context: a huge --prefill-chunk is the
    context (it was sized as asked, and refused naming --max-context)."""
    path = str(fixture_artifacts("llama"))
    rc, capped, _ = compile_out(capsys, path, "--max-context", "2048", "--prefill-chunk", "9999999")
    rc2, exact, _ = compile_out(capsys, path, "--max-context", "2048", "--prefill-chunk", "2048")
    assert rc == rc2 == 0
    assert [ln for ln in capped.splitlines() if "workspace" in ln] == [
        ln for ln in exact.splitlines() if "workspace" in ln
    ]


def test_auto_capacity_on_cuda_takes_what_the_lanes_can_use(fixture_artifacts, capsys) -> None:
    """--kv-capacity auto on cuda: the budget left, capped at max_concurrency x max_context (a
    small model on a large budget planned more tokens than the engine accepts)."""
    argv = [str(fixture_artifacts("llama")), "--device", "cuda", "--kv-capacity", "auto"]
    rc, out, _ = compile_out(capsys, *argv, "--memory-gib", "2", "--max-concurrency", "3")
    assert rc == 0
    assert "kv: dtype=bf16 page_size=16 pages=1536 capacity=24576 tokens" in out  # 3 x 8192
    # a budget that holds less than the lanes' tokens keeps to the budget
    rc, out, _ = compile_out(capsys, *argv, "--memory-gib", "1.0015", "--max-concurrency", "3")
    assert rc == 0
    pages = int(out.split(" pages=", 1)[1].split()[0])
    assert 0 < pages < 1536


@pytest.mark.parametrize("gib", ["0", "-1", "nan"])
def test_memory_budget_must_be_positive(gib, fixture_artifacts, capsys) -> None:
    rc, _, err = compile_out(capsys, str(fixture_artifacts("llama")), "--memory-gib", gib)
    assert rc == 2 and err.strip().endswith(
        f"--memory-gib must be a positive number of GiB, got {gib}"
    )


def test_a_closed_pipe_is_not_an_error(fixture_artifacts) -> None:
    """`ninfer inspect A --tensors | head -1`: the reader leaves early; no traceback, status 0."""
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-m",
        "ninfer.cli",
        "inspect",
        str(fixture_artifacts("llama")),
        "--tensors",
    ]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline()
    p.stdout.close()  # as head does after its line
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0 and "Traceback" not in err, err
