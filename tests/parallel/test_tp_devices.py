"""Where a tensor-parallel engine's ranks run (cpu for all on cpu; on cuda one GPU per rank,
more ranks than the host has GPUs refused before anything starts), `ninfer.LLM` with
tensor_parallel, and a rank that stops answering."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from ninfer.errors import ConfigError
from ninfer.parallel.engine import rank_devices
from ninfer.runtime.config import EngineOptions


def test_cpu_ranks_share_the_host() -> None:
    assert rank_devices(EngineOptions.of(tensor_parallel=4)) == ["cpu"] * 4


def test_more_ranks_than_gpus_is_refused() -> None:
    count = torch.cuda.device_count()
    options = EngineOptions.of(device="cuda", tensor_parallel=8, cuda_graphs=False)
    if count >= 8:
        assert rank_devices(options) == [f"cuda:{r}" for r in range(8)]
        return
    with pytest.raises(ConfigError) as e:
        rank_devices(options)
    assert str(e.value) == (
        f"--tensor-parallel 8: needs CUDA devices cuda:0..cuda:7, this host has {count} CUDA "
        "device(s)"
    )


def test_bench_shards_only_an_artifact_file(capsys) -> None:
    """The ranks load their parts from the artifact file: bench's in-memory synthetic models
    are refused with --tensor-parallel, naming what to give instead."""
    from ninfer.cli import main

    rc = main(["bench", "engine", "--synthetic", "qwen3-8b", "--tensor-parallel", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "--tensor-parallel: the ranks load their parts from a file" in err


def test_llm_with_tensor_parallel_closes_its_ranks(fixture_artifacts) -> None:
    """`ninfer.LLM(..., tensor_parallel=2)` starts its own worker, generates what one process
    generates, and `close()` leaves no worker process behind."""
    from ninfer import LLM, SamplingParams

    path = fixture_artifacts("llama")
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    whole = LLM(path, max_concurrency=1, kv_capacity=64)
    expected = whole.generate([[1, 2, 3, 4]], params)[0].token_ids
    whole.close()
    llm = LLM(path, max_concurrency=1, kv_capacity=64, tensor_parallel=2)
    (worker,) = llm.executor.group.procs
    assert llm.generate([[1, 2, 3, 4]], params)[0].token_ids == expected
    llm.close()
    assert worker.poll() == 0  # stopped when asked, not killed


def test_a_stuck_rank_fails_the_step_after_the_collective_timeout(fixture_artifacts) -> None:
    """A worker that stops answering (SIGSTOP: alive, not dead) fails the step when the
    collective times out, and every later step fails at once, instead of waiting for ever."""
    from ninfer.artifact import Artifact
    from ninfer.parallel.ranks import RankGroup
    from ninfer.runtime.build import build_engine
    from ninfer.runtime.request import EngineError, Request, SamplingParams

    group = RankGroup(2, "cpu", timeout_s=3)
    (worker,) = group.procs
    try:
        options = EngineOptions.of(max_concurrency=1, kv_capacity=64, tensor_parallel=2)
        engine = build_engine(Artifact(fixture_artifacts("llama")), options, ranks=group)
        params = SamplingParams(max_tokens=4, temperature=0.0)
        os.kill(worker.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(EngineError, match="tensor-parallel collective failed on rank 0"):
            engine.submit(Request((1, 2, 3), params, session_key=None)).result(timeout=60)
        assert time.monotonic() - t0 < 30
        with pytest.raises(EngineError, match="tensor-parallel collective failed on rank 0"):
            engine.submit(Request((1, 2, 3), params, session_key=None)).result(timeout=5)
        engine.close()
    finally:
        group.close()
    assert worker.poll() is not None
