"""Hybrid (Gated DeltaNet) models speculate on the CUDA executor: a verify chunk's GDN layers
write the state after each position into the lane's round slots, and the accepted count selects
the slot the request continues from. Float32; on a GPU the executor as served (decode steps
from CUDA Graphs, verify steps eager), on CPU its code and kernels under the Triton interpreter
(no graphs). tests/spec/test_spec_cuda.py has the GPU's greedy --spec mtp cases of both hybrid
fixtures.

1. The executor on the qwen3_5 fixture: a verify chunk of 5 tokens whose slot is one of its
   round slots, beside another lane's decode row, gives the logits, and in round slot t the
   state (conv tail and delta-rule state of every layer), that decoding the same tokens one by
   one gives after token t.
2. `--spec mtp` on the qwen3_5 fixture with a random MTP head, built by the composition root
   as `ninfer serve --device cuda --spec mtp` builds it (both on the CUDA executor): greedy
   output equals plain decoding at batch 2; the random head's drafts are rejected.
3. A drafter that proposes plain decoding's own continuation with one draft wrong, at a position
   that rotates round by round: rounds accept 0, 1, .., k drafts, so requests continue from
   every round slot, the own lane's included; output equals plain decoding at batch 2.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before kernels/ is imported

from collections.abc import Sequence

import pytest

from ninfer.artifact.format import Artifact
from ninfer.passes.options import CompileOptions
from ninfer.passes.pipeline import compile_artifact
from ninfer.runtime import build as runtime_build
from ninfer.runtime.config import EngineOptions
from ninfer.runtime.engine import Engine
from ninfer.runtime.executors import choose
from ninfer.runtime.executors.cuda.executor import CudaExecutor
from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.request import Request, RequestOutput, SamplingParams
from ninfer.runtime.step import SeqChunk, StepBatch
from ninfer.spec.drafter import NO_DRAFT, Draft, DraftRow
from ninfer.spec.speculator import Speculator
from tests.runtime.real_engine import settled
from tests.spec.spec_engine import make_engine, run

ON_GPU = torch.cuda.is_available()
K = 3
OPTIONS = {
    "device": "cuda", "dtype": "float32", "kv_dtype": "f32", "max_concurrency": 2,
    "max_context": 128, "kv_capacity": 256,
}  # fmt: skip
PROMPTS = ((5, 9, 13), (17, 3, 8, 100, 101))
MAX_TOKENS = (12, 11)


# --spec mtp below runs half of MAX_TOKENS: its random head's drafts are all rejected, so every
# round is alike (one token per lane, drafts rolled back) and 5-6 rounds exercise what 11-12 do
# at twice the interpreted cost (46 s of CI time); greedy decoding makes its output a prefix of
# `plain`'s. The draft test keeps MAX_TOKENS: its rounds must accept 0, 1, .., K drafts.
MTP_MAX_TOKENS = (6, 5)


def _requests(max_tokens: tuple[int, ...] = MAX_TOKENS) -> list[Request]:
    return [
        Request(p, SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))
        for p, m in zip(PROMPTS, max_tokens)
    ]


def _cuda_executor(plan, artifact, device=None, **kwargs) -> CudaExecutor:
    """make_executor for a CUDA device: the CUDA executor, on the CPU (interpreted kernels)
    where there is no GPU."""
    assert str(device).startswith("cuda"), device
    return CudaExecutor(plan, artifact, device if ON_GPU else "cpu", **kwargs)


def test_a_verify_chunk_leaves_each_position_state_in_its_round_slot(fixture_artifacts):
    path = fixture_artifacts("qwen3_5")
    options = CompileOptions(
        device="cuda", dtype="float32", kv_dtype="f32", max_concurrency=2, kv_capacity=256,
        max_context=128, page_size=16, spec_state_slots=8,
    )  # fmt: skip
    ex = _cuda_executor(compile_artifact(Artifact(path), options), Artifact(path), "cuda")
    assert ex.num_state_slots == 12  # 2 lanes, 2 checkpoints, 8 round slots
    prompt, drafts = tuple(range(3, 13)), (40, 41, 42, 43, 44)
    rounds = (4, 5, 0, 6, 7)  # lane 0's slot 0 holds the state after position 2
    pages = ((0,), (1,))
    ex.run(StepBatch(tuple(SeqChunk(i, prompt, 0, pages[i], i) for i in (0, 1))))
    # lane 0 verifies the five tokens in one chunk; lane 1 decodes the first beside it
    verify = SeqChunk(0, drafts, 10, pages[0], 0, True, 5, rounds)
    logits = ex.run(StepBatch((verify, SeqChunk(1, drafts[:1], 10, pages[1], 1))))
    assert logits.shape[0] == 6
    for t in range(len(drafts)):
        if t:  # lane 1: the tokens one at a time
            (row,) = ex.run(StepBatch((SeqChunk(1, drafts[t : t + 1], 10 + t, pages[1], 1),)))
        else:
            row = logits[5]
        torch.testing.assert_close(logits[t], row, rtol=1e-4, atol=1e-4)
        for layer in ex.state.ssm:
            for pool in (ex.state.ssm[layer], ex.state.conv[layer]):
                torch.testing.assert_close(pool[rounds[t]], pool[1], rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def cuda_executors():
    """Without a GPU, build_engine and the speculator builder load the CUDA executor on the
    CPU (where make_executor would refuse a CUDA device)."""
    if ON_GPU:
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(choose, "make_executor", _cuda_executor)
        mp.setattr(runtime_build, "make_executor", _cuda_executor)
        yield


@pytest.fixture(scope="module")
def target(cuda_executors, mtp_artifacts):
    return mtp_artifacts("qwen3_5")


@pytest.fixture(scope="module")
def plain(target) -> list[RequestOutput]:
    """Plain decoding of the requests on the CUDA executor."""
    with make_engine(target, None, **OPTIONS) as engine:
        assert isinstance(engine.executor, CudaExecutor) and engine.executor.is_hybrid
        return run(engine, _requests())


def test_greedy_mtp_on_the_cuda_executor_equals_plain_decoding(target, plain):
    with make_engine(target, None, spec="mtp", draft_tokens=K, **OPTIONS) as engine:
        assert isinstance(engine.executor, CudaExecutor)
        assert isinstance(engine.speculator.drafter.executor, CudaExecutor)
        outs = run(engine, _requests(MTP_MAX_TOKENS))
        stats = settled(engine)
    assert [o.token_ids for o in outs] == [o.token_ids[:m] for o, m in zip(plain, MTP_MAX_TOKENS)]
    assert stats.spec_decode_rounds_total > 0
    assert stats.spec_decode_draft_tokens_total > stats.spec_decode_accepted_tokens_total


class _OneWrongDraft:
    """Proposes the continuation plain decoding produced, with draft r mod (k + 1) of round r
    changed to another token (none changed when that is k): a round accepts r mod (k + 1)
    drafts, so over k + 1 rounds every round slot is selected."""

    name = "draft"

    def __init__(self, plain: dict[tuple[int, ...], tuple[int, ...]], vocab: int):
        self.plain, self.vocab, self.rounds = plain, vocab, 0

    def propose(self, rows: Sequence[DraftRow], sampler: Sampler) -> list[Draft]:
        wrong, self.rounds = self.rounds % (K + 1), self.rounds + 1
        out = []
        for r in rows:
            done = len(r.tokens) - r.num_prompt  # output tokens committed
            cont = list(self.plain[tuple(r.tokens[: r.num_prompt])][done : done + r.k])
            if wrong < len(cont):
                cont[wrong] = (cont[wrong] + 1) % self.vocab
            out.append(Draft(tuple(cont)) if cont else NO_DRAFT)
        return out

    def forget(self, seq_id: int) -> None:
        pass


def test_every_accepted_count_continues_from_its_round_slot(target, plain):
    options = EngineOptions.of(
        spec="draft", draft_model="unused.ninfer", draft_tokens=K, page_size=16,
        prefill_chunk=64, **OPTIONS,
    )  # fmt: skip
    artifact = Artifact(target)
    ex = _cuda_executor(compile_artifact(artifact, options.compile), artifact, options.device)
    assert ex.is_hybrid
    # verify steps run eagerly: no graph buckets beyond the plain decode batches
    assert tuple(ex.plan.cuda_graph_buckets) == (1, 2)
    drafter = _OneWrongDraft({p: o.token_ids for p, o in zip(PROMPTS, plain)}, ex.vocab_size)
    with Engine(options, ex, Sampler(), (), plan=ex.plan, speculator=Speculator(drafter)) as eng:
        outs = run(eng, _requests())
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    for o in outs:
        s = o.timings.speculative
        per = s["accepted_per_position"]
        # rounds that accepted nothing, rounds that accepted all k, and rounds in between
        assert s["rounds"] > per[0] > per[-1] > 0, s
