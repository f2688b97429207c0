"""Where a tensor-parallel engine's ranks run: cpu for all on cpu; on cuda one GPU per rank,
and more ranks than the host has GPUs is refused before anything starts."""

from __future__ import annotations

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
