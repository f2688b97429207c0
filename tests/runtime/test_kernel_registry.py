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
from ninfer.runtime.executor import CPU_KERNELS, Executor
from ninfer.runtime.step import SeqChunk, StepBatch

OPTS = {"max_context": 64, "max_concurrency": 2, "kv_capacity": 256}


def _steps(ex, log: list[str]) -> tuple[list[str], list[str]]:
    """(kernels one prefill step of two prompts ran, kernels the decode step after ran)."""
    slots = (0, 1) if ex.is_hybrid else (None, None)
    prompts = [[5, 6, 7, 8, 9], [3, 4, 5]]
    pages = [(0, 1), (2, 3)]
    prefill = StepBatch(
        tuple(SeqChunk(i, tuple(p), 0, pages[i], slots[i]) for i, p in enumerate(prompts))
    )
    ex.run(prefill)
    ran_prefill = list(log)
    log.clear()
    decode = StepBatch(
        tuple(SeqChunk(i, (11,), len(p), pages[i], slots[i]) for i, p in enumerate(prompts))
    )
    ex.run(decode)
    return ran_prefill, list(log)


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


def _cuda_traced(path, device: str, dtype: str, **kw) -> None:
    from ninfer.runtime.cuda_executor import CudaExecutor
    from ninfer.runtime.cuda_ops import CUDA_KERNELS

    a = Artifact(path)
    plan = compile_artifact(a, CompileOptions(device="cuda", dtype=dtype, **{**OPTS, **kw}))
    log: list[str] = []
    ex = CudaExecutor(plan, a, device, kernels=CUDA_KERNELS.traced(log))
    prefill, decode = _steps(ex, log)
    assert prefill == [c.kernel for c in plan.calls]
    names = [c.attrs.get("decode_kernel", c.kernel) for c in plan.calls]
    assert names != [c.kernel for c in plan.calls]  # attention (and the delta rule) differ
    # with CUDA Graphs the decode step's kernels ran while it was captured (warm-up + capture)
    assert decode and decode == names * (len(decode) // len(names))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the gpu test covers this on a GPU")
@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5_moe"])
def test_interpreted_cuda_executor_runs_the_kernels_the_plan_names(arch, fixture_artifacts) -> None:
    _cuda_traced(fixture_artifacts(arch), "cpu", "float32", kv_dtype="f32")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("weights", ["bf16", "fp8", "nvfp4"])
def test_gpu_executor_runs_the_kernels_the_plan_names(weights, fixture_hf_dir, tmp_path) -> None:
    from ninfer.artifact.convert_hf import convert_hf

    for arch in ("qwen3", "qwen3_5"):
        path = convert_hf(
            fixture_hf_dir(arch), tmp_path / f"{arch}-{weights}.ninfer", weights=weights
        )
        _cuda_traced(path, "cuda", "bfloat16")
