"""The executor runs what the plan says: every call of a prefill step and of a decode step runs
exactly the kernel the plan names for it (its `decode_kernel` in a decode step of the CUDA
executor), traced through the kernel registry. CPU executor on several architectures; the CUDA
executor under the Triton interpreter on CPU, and on a GPU for bf16, fp8 and nvfp4 plans."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before kernels/ is imported

import pytest

from ninfer.artifact import Artifact
from ninfer.passes.options import CompileOptions
from ninfer.passes.pipeline import compile_artifact
from ninfer.runtime.executors.cpu.executor import CPU_KERNELS, Executor
from ninfer.runtime.step import SeqChunk, StepBatch

OPTS = {"max_context": 64, "max_concurrency": 2, "kv_capacity": 256}


def _steps(ex, log: list[str], batch: int = 2) -> tuple[list[str], list[str]]:
    """(kernels a prefill step of `batch` prompts ran, kernels the decode step after ran)."""
    prompts = [[5, 6, 7, 8, 9], [3, 4, 5]][:batch]
    slots = [i if ex.is_hybrid else None for i in range(batch)]
    pages = [(2 * i, 2 * i + 1) for i in range(batch)]
    chunks = [SeqChunk(i, tuple(p), 0, pages[i], slots[i]) for i, p in enumerate(prompts)]
    ex.run(StepBatch(tuple(chunks)))
    ran_prefill = list(log)
    log.clear()
    chunks = [SeqChunk(i, (11,), len(p), pages[i], slots[i]) for i, p in enumerate(prompts)]
    ex.run(StepBatch(tuple(chunks)))
    ran_decode = list(log)
    log.clear()
    return ran_prefill, ran_decode


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe"])
def test_cpu_executor_runs_the_kernels_the_plan_names(arch, fixture_artifacts) -> None:
    a = Artifact(fixture_artifacts(arch))
    plan = compile_artifact(a, CompileOptions(**OPTS))
    log: list[str] = []
    ex = Executor(plan, a, kernels=CPU_KERNELS.traced(log))
    prefill, decode = _steps(ex, log)
    names = [c.kernel for c in plan.calls]
    assert prefill == names and decode == names


def test_a_plan_for_another_device_is_refused_by_name(fixture_artifacts) -> None:
    a = Artifact(fixture_artifacts("qwen3"))
    plan = compile_artifact(a, CompileOptions(device="cuda", dtype="float32", **OPTS))
    with pytest.raises(
        ValueError, match="names kernel torch.embedding for op embed, which the cpu executor"
    ):
        Executor(plan, a)


def _planned(plan, tokens: int, rows: int, decode: bool) -> list[str]:
    """The kernel each call of `plan` names for a step of `tokens` tokens and `rows` logit rows:
    its decode kernel in a decode step, and for a GEMM the launch its rows fall in."""
    return [c.kernel_for(rows if c.op == "logits" else tokens, decode)[0] for c in plan.calls]


def _cuda_traced(path, device: str, dtype: str, disable=(), **kw) -> set[str]:
    """Prefill and decode steps of 2 sequences, then of 1, through the CUDA executor with a
    traced registry; returns the kernels that ran."""
    from ninfer.runtime.executors.cuda.executor import CudaExecutor
    from ninfer.runtime.executors.cuda.ops import CUDA_KERNELS

    a = Artifact(path)
    opts = CompileOptions(device="cuda", dtype=dtype, **{**OPTS, **kw})
    plan = compile_artifact(a, opts, disable=disable)
    log: list[str] = []
    ex = CudaExecutor(plan, a, device, kernels=CUDA_KERNELS.traced(log))
    ran: set[str] = set()
    for batch, tokens in ((2, 8), (1, 5)):
        prefill, decode = _steps(ex, log, batch)
        assert prefill == _planned(plan, tokens, batch, decode=False)
        names = _planned(plan, batch, batch, decode=True)
        # with CUDA Graphs the decode step's kernels ran while it was captured (warm-up + capture)
        assert decode and decode == names * (len(decode) // len(names))
        ran |= set(prefill) | set(decode)
    return ran


@pytest.mark.skipif(torch.cuda.is_available(), reason="the gpu test covers this on a GPU")
@pytest.mark.parametrize(
    "arch, disable",
    [("qwen3", ()), ("qwen3_5_moe", ()), ("llama", ("fuse_attention_prologue",))],
)
def test_interpreted_cuda_executor_runs_the_kernels_the_plan_names(
    arch, disable, fixture_artifacts
) -> None:
    """(llama without the prologue fusion: plain paged attention after separate rotary.)"""
    ran = _cuda_traced(fixture_artifacts(arch), "cpu", "float32", disable, kv_dtype="f32")
    assert {"triton.gemv", "cublas.gemm"} <= ran  # batch 1 and the prefill rows


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("weights", ["bf16", "fp8", "nvfp4"])
def test_gpu_executor_runs_the_kernels_the_plan_names(weights, fixture_hf_dir, tmp_path) -> None:
    from ninfer.artifact.convert_hf import convert_hf

    for arch in ("qwen3", "qwen3_5"):
        path = convert_hf(
            fixture_hf_dir(arch), tmp_path / f"{arch}-{weights}.ninfer", weights=weights
        )
        ran = _cuda_traced(path, "cuda", "bfloat16")
        assert any(k.endswith("paged_attention_decode") for k in ran)
