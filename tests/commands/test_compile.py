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
@pytest.mark.parametrize("verbose", [False, True], ids=["summary", "verbose"])
def test_compile_plan_snapshot(arch, device, verbose, fixture_artifacts, capsys, snapshot) -> None:
    """The summary by default; --verbose adds the weights and calls, identical layers folded."""
    argv = [str(fixture_artifacts(arch)), "--device", device, "--max-concurrency", "4"]
    rc, out, err = compile_out(capsys, *argv, *(["--verbose"] if verbose else []))
    assert rc == 0, err
    assert out == snapshot
    assert "fused: fuse_qkv=" in out and "ledger:" in out
    assert ("cuda graph buckets: 1 2 3 4" in out) == (device == "cuda")
    assert f"cuda_graphs={device == 'cuda'}" in out  # a cpu plan has none
    assert ("calls:" in out) == verbose


def test_kv_dtype_is_one_vocabulary_for_compile_and_serve(fixture_artifacts, capsys) -> None:
    """`--kv-dtype` takes the same values in `ninfer compile` and `ninfer serve`."""
    import argparse

    from ninfer.commands.serve import add_arguments as serve_arguments
    from ninfer.ir.kv_formats import KV_DTYPES

    serve = argparse.ArgumentParser()
    serve_arguments(serve)
    kv_action = next(a for a in serve._actions if a.dest == "kv_dtype")
    assert tuple(kv_action.choices) == KV_DTYPES
    for kv in KV_DTYPES:
        rc, out, err = compile_out(capsys, str(fixture_artifacts("llama")), "--kv-dtype", kv)
        assert rc == 0 and f"kv: dtype={kv} " in out, err


def test_compile_json_round_trips(fixture_artifacts, capsys) -> None:
    path = str(fixture_artifacts("qwen3_5"))
    rc, out, _ = compile_out(capsys, path, "--json", "--kv-dtype", "fp8", "--kv-capacity", "2048")
    assert rc == 0
    plan = Plan.from_json(out)
    assert plan.kv.dtype == "fp8" and plan.kv.capacity_tokens == 2048
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


BLOCK_IMPORTS = """
import sys
class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "triton", "kernels"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _Absent())
from ninfer.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("weights", ["bf16", "nvfp4"])
def test_a_cuda_plan_compiles_without_torch_or_triton(weights, fixture_hf_dir, tmp_path) -> None:
    """The README's promise: a GPU plan compiles on any machine (it was refused with
    ModuleNotFoundError: triton, from the nvfp4 copies' size in plan_memory)."""
    import subprocess
    import sys

    from ninfer.artifact.convert_hf import convert_hf

    path = convert_hf(fixture_hf_dir("qwen3"), tmp_path / f"q-{weights}.ninfer", weights=weights)
    argv = ["compile", str(path), "--device", "cuda", "--verbose"]
    p = subprocess.run(
        [sys.executable, "-c", BLOCK_IMPORTS, *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "triton.gemm_nvfp4" in p.stdout if weights == "nvfp4" else "cublas.gemm" in p.stdout
    assert ("nvfp4_copies" in p.stdout) == (weights == "nvfp4")


def test_verbose_folds_identical_layers(fixture_hf_dir, tmp_path, capsys) -> None:
    """A 5-layer llama: layer 0 (no residual before it) and layer 4 (the last residual add)
    differ, layers 1-3 run the same rows and are printed once."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from ninfer.artifact.convert_hf import convert_hf

    src = tmp_path / "llama5"
    shutil.copytree(fixture_hf_dir("llama"), src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 5}))
    (shard,) = src.glob("*.safetensors")
    tensors = load_file(shard)
    for name, t in list(tensors.items()):
        if ".layers.1." in name:
            for i in (2, 3, 4):
                tensors[name.replace(".layers.1.", f".layers.{i}.")] = t.copy()
    save_file(tensors, shard, metadata={"format": "pt"})
    path = convert_hf(src, tmp_path / "llama5.ninfer")
    rc, out, err = compile_out(capsys, str(path), "--device", "cuda", "--verbose")
    assert rc == 0, err
    heads = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("layer")]
    assert heads == ["layers 0-4 (x5):", "layer 0:", "layers 1-3 (x3):", "layer 4:"]
    assert "kv: dtype=bf16" in out and "layers=0-4 " in out


def test_cpu_weights_keeps_gguf_blocks_packed_or_expands_them(fixture_root, capsys) -> None:
    """`--cpu-weights` (compile and serve) decides whether a CPU plan reads GGUF blocks packed
    through cpu.* kernels or as float32 expanded at load; the plan says which per weight."""
    import argparse

    from artifacts.fixture_gguf import build_gguf
    from ninfer.artifact.convert_gguf import convert_gguf
    from ninfer.commands.serve import add_arguments as serve_arguments
    from ninfer.commands.serve import config_from_args

    out = fixture_root / "qwen2-gguf.ninfer"
    if not out.exists():
        convert_gguf(build_gguf(fixture_root), out)
    rc, packed, err = compile_out(capsys, str(out), "--verbose")
    assert rc == 0, err
    assert "(packed)" in packed and "cpu.q" in packed
    rc, expanded, err = compile_out(capsys, str(out), "--verbose", "--cpu-weights", "float32")
    assert rc == 0, err
    assert "(packed)" not in expanded and "cpu.q" not in expanded
    assert "(dequantised at load)" in expanded

    serve = argparse.ArgumentParser()
    serve_arguments(serve)
    args = serve.parse_args([str(out), "--device", "cpu", "--cpu-weights", "float32"])
    assert config_from_args(args, cuda_available=False).engine.compile.cpu_weights == "float32"
    args = serve.parse_args([str(out), "--device", "cpu"])
    assert config_from_args(args, cuda_available=False).engine.compile.cpu_weights == "packed"

    # asking for float32 compute asks for float32 GEMMs too, unless packed is named
    rc, asked, err = compile_out(capsys, str(out), "--verbose", "--dtype", "float32")
    assert rc == 0, err
    assert "(packed)" not in asked and "(dequantised at load)" in asked
    for argv, want in [
        (["--dtype", "float32"], "float32"),
        (["--dtype", "bfloat16"], "packed"),
        (["--dtype", "float32", "--cpu-weights", "packed"], "packed"),
    ]:
        args = serve.parse_args([str(out), "--device", "cpu", *argv])
        assert config_from_args(args, cuda_available=False).engine.compile.cpu_weights == want


def test_cpu_weights_follow_the_dtype_asked_for() -> None:
    from ninfer.passes.options import CompileOptions

    assert CompileOptions().cpu_weights == "packed"
    assert CompileOptions(dtype="float32").cpu_weights == "float32"
    assert CompileOptions(dtype="bfloat16").cpu_weights == "packed"
    assert CompileOptions(dtype="float32", cpu_weights="packed").cpu_weights == "packed"
    assert CompileOptions(cpu_weights="float32").cpu_weights == "float32"
