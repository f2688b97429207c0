"""Tensor parallelism on CPU (gloo, 2 ranks): every fixture architecture, float32 weights,
generates greedily the same tokens sharded over two processes as whole in one (several choices
of one prompt among them), and its logits agree within float32 reduction-order noise.

One rank group (one worker process) serves every architecture in turn: each engine loads its
model onto the running group and unloads it when closed, so the module spawns once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from ninfer.artifact import Artifact
from ninfer.parallel.ranks import RankGroup
from ninfer.runtime.build import build_engine
from ninfer.runtime.config import EngineOptions
from ninfer.runtime.engine import Engine
from ninfer.runtime.request import Request, SamplingParams

ARCHS = ("llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe")
# two prompts batched together, the second longer than a prefill chunk and several pages, so
# steps mix prefill chunks with decode rows; run twice, the second time from the prefix cache
# (hybrid models restore a state checkpoint: copy_state on every rank)
PROMPTS = ((1, 5, 9, 22, 31), tuple(range(40, 62)))
MAX_TOKENS = 10
OPTIONS = {
    "max_concurrency": 2,
    "kv_capacity": 128,
    "page_size": 4,
    "prefill_chunk": 8,
    "cpu_weights": "float32",
}


@pytest.fixture(scope="module")
def ranks() -> Iterator[RankGroup]:
    group = RankGroup(2, "cpu")
    yield group
    group.close()
    assert all(p.poll() is not None for p in group.procs)  # no worker left behind


def generate(engine: Engine) -> list[tuple[int, ...]]:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    out, computed = [], []
    for _ in range(2):
        before = engine.executor.tokens_computed
        handles = [
            engine.submit(Request(p, params, session_key=None, checkpoint_positions=(len(p),)))
            for p in PROMPTS
        ]
        out += [tuple(h.result(timeout=120).token_ids) for h in handles]
        computed.append(engine.executor.tokens_computed - before)
    assert computed[1] < computed[0]  # the second round started from the prefix cache
    # two choices of one prompt: the second forks from the first, its prompt's partial last
    # page copied (copy_page on every rank; a rank without its copy would change the tokens)
    handles = engine.submit_choices([Request(PROMPTS[0], params)] * 2)
    out += [tuple(h.result(timeout=120).token_ids) for h in handles]
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_tensor_parallel_2_equals_1(arch, ranks, fixture_artifacts):
    artifact = Artifact(fixture_artifacts(arch))
    with build_engine(artifact, EngineOptions.of(**OPTIONS)) as whole:
        expected = generate(whole)
        logits = whole.prompt_logits(PROMPTS[1]).result(timeout=120)
        kv_page = whole.executor.kv_bytes_per_page
    with build_engine(artifact, EngineOptions.of(**OPTIONS, tensor_parallel=2), ranks=ranks) as tp:
        assert generate(tp) == expected
        tp_logits = tp.prompt_logits(PROMPTS[1]).result(timeout=120)
        assert tp.plan.parallel.world == 2 and tp.executor.local.kv_bytes_per_page * 2 == kv_page
    assert tp_logits.shape == logits.shape  # the whole vocabulary, gathered from both ranks
    torch.testing.assert_close(tp_logits, logits, rtol=1e-4, atol=1e-4)
