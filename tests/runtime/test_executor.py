"""The reference executor over a paged KV cache and state slots: mixed batches, block tables,
state copies, quantised KV, and fused plans equal to unfused ones."""

from __future__ import annotations

import functools

import pytest
import torch

from ninfer.artifact import Artifact
from ninfer.passes.assign_kernels import ASSIGN_KERNELS
from ninfer.passes.choose_kv import CHOOSE_KV
from ninfer.passes.lower import lower
from ninfer.passes.options import CompileOptions
from ninfer.passes.pipeline import compile_artifact, graph_for_artifact
from ninfer.passes.plan_memory import PLAN_MEMORY
from ninfer.runtime.executor_api import Executor as ExecutorProtocol
from ninfer.runtime.executors.cpu.executor import Executor
from ninfer.runtime.step import SeqChunk, StateCopy, StepBatch

OPTS = CompileOptions(max_concurrency=3, kv_capacity=512)


pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def _executor(path: str, kv_dtype: str | None = None) -> Executor:
    a = Artifact(path)
    opts = CompileOptions(max_concurrency=3, kv_capacity=512, kv_dtype=kv_dtype)
    return Executor(compile_artifact(a, opts), a)


def ids(n: int, seed: int) -> tuple[int, ...]:
    return tuple(
        torch.randint(0, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    )


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5_moe"])
def test_protocol_and_mixed_batch_equals_separate_runs(arch, fixture_artifacts) -> None:
    a, b, c = ids(20, 1), ids(9, 2), ids(5, 3)
    ex = _executor(str(fixture_artifacts(arch)))
    assert isinstance(ex, ExecutorProtocol)
    assert (ex.num_pages, ex.page_size, ex.is_hybrid) == (32, 16, arch == "qwen3_5_moe")
    assert ex.num_state_slots == (6 if ex.is_hybrid else 0)
    slot = (lambda i: i) if ex.is_hybrid else (lambda i: None)
    # one sequence at a time
    ra = ex.run(StepBatch((SeqChunk(1, a, 0, (3, 4), slot(0)),)))
    rb = ex.run(StepBatch((SeqChunk(2, b, 0, (9,), slot(1)),)))
    rb2 = ex.run(StepBatch((SeqChunk(2, (7,), 9, (9,), slot(1)),)))
    # the same work mixed: a prefill chunk, b's prefill, then decode of b beside c's prefill
    m1 = ex.run(
        StepBatch((SeqChunk(11, a, 0, (10, 5), slot(2)), SeqChunk(12, b, 0, (0,), slot(0))))
    )
    m2 = ex.run(
        StepBatch(
            (
                SeqChunk(12, (7,), 9, (0,), slot(0)),
                SeqChunk(13, c, 0, (1,), slot(1), want_logits=False),
            )
        )
    )
    assert m1.shape == (2, ex.vocab_size) and m2.shape == (1, ex.vocab_size)
    torch.testing.assert_close(m1[0], ra[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(m1[1], rb[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(m2[0], rb2[0], atol=1e-5, rtol=0)


def test_state_copy_restores_a_checkpoint(fixture_artifacts) -> None:
    ex = _executor(str(fixture_artifacts("qwen3_5")))
    prefix, rest = ids(16, 4), ids(6, 5)
    ex.run(StepBatch((SeqChunk(1, prefix, 0, (0, 1), 0),)))
    ex.copy_state(0, 4)  # checkpoint after 16 tokens
    first = ex.run(StepBatch((SeqChunk(1, rest, 16, (0, 1), 0),)))
    # another sequence reuses the prefix pages and the checkpoint, copied in by the step
    again = ex.run(StepBatch((SeqChunk(2, rest, 16, (0, 2), 1),), state_copies=(StateCopy(4, 1),)))
    torch.testing.assert_close(again, first, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="state slot 9"):
        ex.copy_state(0, 9)


@pytest.mark.parametrize(
    "kv_dtype, bound", [("bf16", 0.05), ("fp8", 0.3), ("int8", 0.1), ("nvfp4", 1.0), ("k8v4", 1.0)]
)
def test_quantised_kv_stays_close(kv_dtype, bound, fixture_artifacts) -> None:
    path = str(fixture_artifacts("llama"))
    prompt = ids(40, 6)
    ref = _executor(path).run(StepBatch((SeqChunk(1, prompt, 0, (0, 1, 2)),)), all_logits=True)
    q = _executor(path, kv_dtype).run(
        StepBatch((SeqChunk(1, prompt, 0, (0, 1, 2)),)), all_logits=True
    )
    err = (q - ref).abs().max().item()
    assert 0 < err < bound, f"{kv_dtype}: {err}"  # rounded (so different) but close


@pytest.mark.parametrize("arch", ["llama", "qwen3_5_moe"])
def test_fused_plan_equals_unfused_plan(arch, fixture_artifacts) -> None:
    a = Artifact(fixture_artifacts(arch))
    g = graph_for_artifact(a, OPTS)
    unfused = lower(PLAN_MEMORY(ASSIGN_KERNELS(CHOOSE_KV(g, OPTS), OPTS), OPTS), OPTS)
    fused = compile_artifact(a, OPTS)
    assert len(fused.calls) < len(unfused.calls)
    prompt = SeqChunk(1, ids(30, 7), 0, (0, 1), 0 if unfused.state.layers else None)
    x = Executor(unfused, a).run(StepBatch((prompt,)), all_logits=True)
    y = Executor(fused, a).run(StepBatch((prompt,)), all_logits=True)
    torch.testing.assert_close(x, y, atol=1e-5, rtol=0)


def test_block_table_too_short_is_an_error(fixture_artifacts) -> None:
    ex = _executor(str(fixture_artifacts("llama")))
    with pytest.raises(ValueError, match="does not cover position 19"):
        ex.run(StepBatch((SeqChunk(1, ids(20, 8), 0, (0,)),)))
