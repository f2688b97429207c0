"""Host snapshots with the real executors on the tiny fixtures (float32).

- The reference executor's `snapshot` / `restore` carry a request's KV pages and recurrent
  state exactly: after its pages and slot were overwritten by another sequence, restoring into
  other pages and another slot continues with the logits of an uninterrupted run.
- The CUDA executor's copies (data and scale tensors, state) round-trip byte for byte; on CPU
  here, and on a GPU through pinned asynchronous copies.
- The engine under a KV pool too small for its requests pauses them and restores them by
  replay (host budget 0) or from host snapshots (the default budget): either way every greedy
  request produces exactly the tokens it produces alone, and every page, slot and host byte
  comes back.

qwen3 is the attention-only model, qwen3_5 the hybrid one.
"""

from __future__ import annotations

import functools

import pytest
import torch
from real_engine import alone, greedy, random_prompt, settled

from ninfer.runtime.config import EngineOptions
from ninfer.runtime.engine import Engine, EngineStats
from ninfer.runtime.executors.cpu.executor import Executor, executor_for
from ninfer.runtime.executors.sampler import Sampler
from ninfer.runtime.preemption import D2H, H2D, KV, STATE
from ninfer.runtime.request import Request
from ninfer.runtime.step import SeqChunk, StepBatch

ARCHS = ("qwen3", "qwen3_5")
PAGE = 16
MAX_CONTEXT = 256
POOL = 128  # tokens = 8 pages: each request below fits alone, the four together do not
LENGTHS = (21, 38, 50, 70)
OUTPUTS = (20, 16, 24, 12)
T = 60.0


def _alone(path: str, prompt: tuple[int, ...], max_tokens: int) -> tuple[int, ...]:
    return alone(path, prompt, max_tokens, kv_capacity=512, max_context=MAX_CONTEXT)


pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def _executor(path: str, kv_capacity: int) -> Executor:
    return executor_for(
        path, max_concurrency=4, kv_capacity=kv_capacity, max_context=MAX_CONTEXT, page_size=PAGE
    )


# -- executor level ------------------------------------------------------------------------------


def _chunk(seq_id, tokens, start, pages, slot, ex) -> StepBatch:
    hybrid_slot = slot if ex.is_hybrid else None
    return StepBatch((SeqChunk(seq_id, tuple(tokens), start, tuple(pages), hybrid_slot),))


@pytest.mark.parametrize("arch", ARCHS)
def test_restored_pages_and_state_continue_like_an_uninterrupted_run(arch, fixture_artifacts):
    ex = _executor(str(fixture_artifacts(arch)), POOL)  # 8 pages, 8 state slots (hybrid)
    a = random_prompt(37, seed=1, vocab=ex.vocab_size)  # 3 pages, the last one partly filled
    b = random_prompt(40, seed=2, vocab=ex.vocab_size)
    nxt = (5,)
    # uninterrupted: prefill then decode one token, in pages 5..7 and slot 3
    ex.run(_chunk(0, a, 0, (5, 6, 7), 3, ex))
    expected = ex.run(_chunk(0, nxt, 37, (5, 6, 7), 3, ex))
    # paused: prefill in pages 0..2 / slot 0, snapshot, let `b` overwrite both, restore
    # into pages 4, 1, 6 (one run of one page, not in order) and slot 2
    ex.run(_chunk(1, a, 0, (0, 1, 2), 0, ex))
    snap = ex.snapshot((0, 1, 2), 0 if ex.is_hybrid else None)
    assert snap.num_pages == 3 and snap.has_state == ex.is_hybrid
    assert snap.kv_nbytes == 3 * ex.kv_bytes_per_page > 0
    assert snap.state_nbytes == ex.state_bytes and (ex.state_bytes > 0) == ex.is_hybrid
    ex.run(_chunk(2, b, 0, (0, 1, 2), 0, ex))
    ex.restore(snap, (4, 1, 6), 2 if ex.is_hybrid else None)
    got = ex.run(_chunk(1, nxt, 37, (4, 1, 6), 2, ex))
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    with pytest.raises(ValueError, match="holds 3 pages"):
        ex.restore(snap, (4, 1), 2 if ex.is_hybrid else None)


def _cuda_executor(path, device: str, **options):
    from ninfer.artifact import Artifact
    from ninfer.passes.options import CompileOptions
    from ninfer.passes.pipeline import compile_artifact
    from ninfer.runtime.executors.cuda.executor import CudaExecutor

    base = {"kv_dtype": "fp8", "max_concurrency": 2, "kv_capacity": POOL, "cuda_graphs": False}
    options = CompileOptions(
        device="cuda", dtype="float32", max_context=MAX_CONTEXT, page_size=PAGE,
        **{**base, **options},
    )  # fmt: skip
    return CudaExecutor(compile_artifact(Artifact(path), options), Artifact(path), device)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_executor_snapshots_round_trip_every_tensor(arch, device, fixture_artifacts):
    ex = _cuda_executor(fixture_artifacts(arch), device)
    kv, state = ex._kv_tensors(), ex._state_tensors()
    assert any(t.dtype == torch.uint8 for t in kv) and len(kv) > 2  # fp8 data + scales
    g = torch.Generator().manual_seed(0)
    for t in (*kv, *state):  # arbitrary contents, byte for byte
        t.view(torch.uint8).copy_(torch.randint(0, 256, t.view(torch.uint8).shape, generator=g))
    src, dst = (3, 4, 5, 1), (0, 6, 7, 2)
    slot_src, slot_dst = (0, 1) if ex.is_hybrid else (None, None)
    before = [t.clone() for t in (*kv, *state)]
    snap = ex.snapshot(src, slot_src)
    snap.wait()
    assert all(not h.is_cuda for h in (*snap.kv, *snap.state))
    assert snap.nbytes == 4 * ex.kv_bytes_per_page + (ex.state_bytes if ex.is_hybrid else 0)
    for t in (*kv, *state):
        t.zero_()  # the pages and slot are reused before the restore
    ex.restore(snap, dst, slot_dst)
    if device == "cuda":
        torch.cuda.synchronize()
    for t, old in zip(kv, before):
        assert torch.equal(t[list(dst)].view(torch.uint8), old[list(src)].view(torch.uint8))
        assert not t[[8]].any()  # the scratch page was not touched
    for t, old in zip(state, before[len(kv) :]):
        assert torch.equal(t[slot_dst].view(torch.uint8), old[slot_src].view(torch.uint8))


# -- engine level ---------------------------------------------------------------------------------


def _requests(vocab: int) -> list[Request]:
    return [
        Request(random_prompt(n, seed=100 + i, vocab=vocab), greedy(m))
        for i, (n, m) in enumerate(zip(LENGTHS, OUTPUTS))
    ]


def _pressured_run(ex: Executor, host_context_mib: int | None) -> tuple[list, EngineStats]:
    config = EngineOptions.of(
        max_concurrency=4,
        max_context=MAX_CONTEXT,
        kv_capacity=ex.num_pages * ex.page_size,
        page_size=ex.page_size,
        prefill_chunk=32,
        prefix_reuse=False,  # a replay recomputes everything; nothing stays in the pool
        host_context_mib=host_context_mib,
    )
    with Engine(config, ex, Sampler(), eos_ids=()) as engine:
        handles = [engine.submit(r) for r in _requests(ex.vocab_size)]
        outs = [h.result(T) for h in handles]
        return outs, settled(engine)


@pytest.mark.parametrize("arch", ARCHS)
def test_pauses_restore_by_replay_and_by_snapshot_to_the_solo_tokens(arch, fixture_artifacts):
    path = str(fixture_artifacts(arch))
    ex = _executor(path, POOL)
    runs = {route: _pressured_run(ex, mib) for route, mib in (("replay", 0), ("snapshot", None))}
    for route, (outs, stats) in runs.items():
        for i, (req, out) in enumerate(zip(_requests(ex.vocab_size), outs)):
            alone = _alone(path, req.prompt_token_ids, req.sampling.max_tokens)
            assert out.token_ids == alone, f"{route}: request {i} (paused {out.usage.preemptions})"
        assert stats.preemptions_total > 0, (route, stats)
        assert stats.generation_tokens_total == sum(OUTPUTS)  # nothing published twice
        assert stats.kv_pages_used == 0 and stats.state_slots_used == 0
        assert stats.host_context_used_bytes == stats.host_context_reserved_bytes == 0
    replay = runs["replay"][1]
    assert replay.replay_restores_total == replay.preemptions_total
    assert replay.replayed_tokens_total > 0 and replay.snapshot_restores_total == 0
    assert replay.host_context_capacity_bytes == 0 and not replay.context_transfer_bytes
    snap = runs["snapshot"][1]
    assert snap.snapshot_restores_total > 0 and snap.replayed_tokens_total == 0
    assert snap.host_context_capacity_bytes == 8192 * 2**20 + 8 * ex.state_bytes
    assert snap.host_context_peak_bytes > 0
    moved = snap.context_transfer_bytes
    assert moved[(KV, D2H)] >= moved[(KV, H2D)] > 0
    assert moved[(KV, H2D)] % ex.kv_bytes_per_page == 0
    restored_states = moved.get((STATE, H2D), 0)
    assert restored_states == (snap.snapshot_restores_total * ex.state_bytes if ex.is_hybrid else 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_engine_restores_from_pinned_snapshots_to_the_replay_tokens(arch, fixture_artifacts):
    """On the GPU (decode from CUDA Graphs): the snapshot route gives the replay route's tokens,
    and those equal each request's tokens on a pool large enough for no pause."""
    from ninfer.runtime.executors.cuda.executor import CudaExecutor

    path = fixture_artifacts(arch)
    small = _cuda_executor(path, "cuda", kv_dtype="f32", cuda_graphs=True, max_concurrency=4)
    big = _cuda_executor(
        path, "cuda", kv_dtype="f32", cuda_graphs=True, max_concurrency=4, kv_capacity=1024
    )
    assert isinstance(small, CudaExecutor) and small.num_pages == POOL // PAGE
    replay_outs, replay = _pressured_run(small, 0)
    snap_outs, snap = _pressured_run(small, None)
    calm_outs, calm = _pressured_run(big, None)
    assert calm.preemptions_total == 0 and replay.preemptions_total > 0
    assert snap.snapshot_restores_total > 0 and snap.replayed_tokens_total == 0
    for a, b, c in zip(replay_outs, snap_outs, calm_outs):
        assert a.token_ids == b.token_ids == c.token_ids
    assert snap.host_context_used_bytes == 0 and snap.kv_pages_used == 0
