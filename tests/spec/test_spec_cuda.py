"""On a GPU (skipped without one): the CUDA executor outputs the hidden states a plan captures
exactly as the CPU reference executor does (eager prefill steps, CUDA Graph decode steps and a
verify step run as decode rows), and `--spec mtp` and `--spec dflash` (with and without
`--lm-head-draft`) on CUDA give token for token the output of plain decoding, on hybrid (Gated
DeltaNet) targets too (eager verify chunks writing each position's state into the round slots;
tests/spec/test_spec_hybrid_cuda.py checks those states and every accepted count), pauses under
a tiny KV pool included."""

from __future__ import annotations

import pytest
import torch

from ninfer.artifact import Artifact
from ninfer.passes.options import CompileOptions
from ninfer.passes.pipeline import compile_artifact
from ninfer.runtime.engine import EngineStats
from ninfer.runtime.executors.choose import make_executor
from ninfer.runtime.request import Request, SamplingParams
from ninfer.runtime.step import SeqChunk, StepBatch
from tests.runtime.real_engine import settled
from tests.spec.spec_engine import make_engine, run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CAPTURE = ("final", "L0", "L1")


def _hidden_trace(path, device: str) -> list[dict[str, torch.Tensor]]:
    """The captured rows of a prefill of two prompts, two decode steps and a verify step."""
    options = CompileOptions(
        device=device, dtype="float32", kv_dtype="f32", max_context=256, max_concurrency=4,
        kv_capacity=1024,
        capture=CAPTURE,
    )  # fmt: skip
    artifact = Artifact(path)
    ex = make_executor(compile_artifact(artifact, options), artifact, device)
    tables = (tuple(range(16)), tuple(range(16, 32)))
    prompts = ((5, 9, 13, 200, 7, 3, 31, 44, 90), (17, 3, 8, 100, 101))
    steps = [StepBatch(tuple(SeqChunk(i, p, 0, tables[i]) for i, p in enumerate(prompts)))]
    for j in range(2):  # decode rows (a graph bucket on cuda)
        steps.append(
            StepBatch(tuple(SeqChunk(i, (50 + j,), len(p) + j, tables[i]) for i, p in enumerate(prompts)))
        )  # fmt: skip
    verify = SeqChunk(0, (60, 61, 62), len(prompts[0]) + 2, tables[0], num_logits=3)
    steps.append(StepBatch((verify, SeqChunk(1, (52,), len(prompts[1]) + 2, tables[1]))))
    trace = []
    for batch in steps:
        ex.run(batch)
        trace.append({k: v.float().cpu() for k, v in ex.hidden.items()})
    return trace


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_cuda_captures_what_the_cpu_executor_captures(arch, fixture_artifacts):
    cpu = _hidden_trace(fixture_artifacts(arch), "cpu")
    cuda = _hidden_trace(fixture_artifacts(arch), "cuda")
    worst = {}
    for step, (want, got) in enumerate(zip(cpu, cuda)):
        assert set(got) == set(CAPTURE), step
        for name in CAPTURE:
            assert got[name].shape == want[name].shape, (step, name)
            err = float((got[name] - want[name]).abs().max() / want[name].abs().max())
            worst[(step, name)] = err
    assert max(worst.values()) < 1e-4, worst


def _requests() -> list[Request]:
    return [
        Request(tuple((7 * i + 3 * j) % 500 + 1 for j in range(L)),
                SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))
        for i, (L, m) in enumerate(zip((3, 17, 40, 64), (9, 21, 14, 30)))
    ]  # fmt: skip


@pytest.mark.parametrize("lm_head_draft", [False, True])
@pytest.mark.parametrize(("spec", "k"), [("mtp", 3), ("dflash", 7)])
def test_greedy_speculation_on_cuda_equals_plain_decoding(
    spec, k, lm_head_draft, mtp_artifacts, fixture_artifacts, fixture_root
):
    from artifacts.fixture_dflash import build_dflash_fixture

    if spec == "mtp":
        target = mtp_artifacts("qwen3")
    else:
        target = build_dflash_fixture(fixture_artifacts("qwen3"), fixture_root)
    _assert_greedy_spec_equals_plain(target, spec, k, lm_head_draft)


@pytest.mark.parametrize("lm_head_draft", [False, True])
@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_5_moe"])
def test_greedy_mtp_on_a_hybrid_target_on_cuda_equals_plain_decoding(
    arch, lm_head_draft, mtp_artifacts
):
    _assert_greedy_spec_equals_plain(mtp_artifacts(arch), "mtp", 3, lm_head_draft)


def test_greedy_dflash_on_a_hybrid_target_on_cuda_equals_plain_decoding(
    fixture_artifacts, fixture_root
):
    from artifacts.fixture_dflash import build_dflash_fixture

    target = build_dflash_fixture(fixture_artifacts("qwen3_5"), fixture_root)
    _assert_greedy_spec_equals_plain(target, "dflash", 7, False)


def test_hybrid_pauses_under_a_tiny_pool_on_cuda_change_nothing(mtp_artifacts):
    """8 pages for four requests that need 14 together: the youngest is paused (a host
    snapshot of the round slot it continues from) and restored while others speculate."""
    pool = {"kv_capacity": 128, "host_context_mib": 64}
    stats = _assert_greedy_spec_equals_plain(mtp_artifacts("qwen3_5"), "mtp", 3, False, **pool)
    assert stats.preemptions_total > 0 and stats.snapshot_restores_total > 0, stats


def _assert_greedy_spec_equals_plain(
    target, spec: str, k: int, lm_head_draft: bool, **pool
) -> EngineStats:
    """Plain and speculating engines give the same tokens; the latter's settled stats."""
    opts = {"device": "cuda", "dtype": "float32", "max_concurrency": 4, **pool}
    with make_engine(target, None, **opts) as plain:
        want = run(plain, _requests())
    options = {"spec": spec, "draft_tokens": k, "lm_head_draft": lm_head_draft}
    with make_engine(target, None, **options, **opts) as engine:
        outs = run(engine, _requests())
        graphs = getattr(engine.speculator.drafter, "graphs", None)
        stats = settled(engine)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert sum(o.timings.speculative["rounds"] for o in outs) > 0
    if spec == "dflash":  # the rounds ran from the drafter's CUDA Graphs, for 1 to 4 rows
        assert graphs is not None and graphs.rounds > 0 and graphs.captures >= 2
    return stats


def test_dflash_graph_logits_equal_the_eager_forwards():
    """The captured DFlash graph (Qwen3-8B's layer shapes, bf16: the kernels the H200 bench
    runs, the reduced head's unmeasured width included) gives the eager forward's logits within
    bf16 rounding, over rows of different context lengths, and its argmax drafts."""
    from artifacts.fixture_dflash import dflash_config, random_state
    from ninfer.artifact.dflash import DFlashConfig
    from ninfer.spec.dflash_graph import DFlashGraphs
    from ninfer.spec.dflash_model import DFlashModel
    from ninfer.spec.draft_head import DraftHead

    target = {"num_hidden_layers": 4, "hidden_size": 4096, "intermediate_size": 12288,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
              "vocab_size": 32768, "rope_theta": 1e6, "rms_norm_eps": 1e-6}  # fmt: skip
    cfg = dflash_config(target, layers=2, block_size=16, target_layer_ids=[0, 2])
    gen = torch.Generator().manual_seed(0)
    embed = torch.randn(32768, 4096, generator=gen).cuda().bfloat16()
    head = (0.02 * torch.randn(32768, 4096, generator=gen)).cuda().bfloat16()
    W = {k: v.cuda().bfloat16() for k, v in random_state(cfg, 0, 0.02).items()}
    model = DFlashModel(DFlashConfig.from_config(cfg, 4, 4096), W, embed, head)
    for reduced in (False, True):
        if reduced:
            ids = torch.arange(1, 32768, 3, device="cuda")
            model.reduce_head(DraftHead(ids, head[ids]))  # > 16 rows a call: its bf16 rows
        graphs = DFlashGraphs(model)
        lengths = (700, 37)
        feats = torch.randn(sum(lengths), 2 * 4096, generator=gen).cuda().bfloat16()
        kv, rows, at = [], [], 0
        for b, n in enumerate(lengths):
            pairs = model.context_kv(feats[at : at + n], torch.arange(n, device="cuda"))
            at += n
            st = type("St", (), {"slot": None, "synced": 0})()
            kv.append(torch.stack([torch.stack(p) for p in pairs]))  # [layers, 2, n, width]
            rows.append((st, kv[-1], n, 100 + b, n))
        for _ in range(2):  # captured on the first call, replayed on the second
            ids, logits = graphs.run(rows)
        assert graphs.captures == 1 and graphs.rounds == 2
        C = max(lengths)
        mask = cfg["dflash_config"]["mask_token_id"]
        ctx = [(torch.zeros(2, C, 1024, dtype=torch.bfloat16, device="cuda"),
                torch.zeros(2, C, 1024, dtype=torch.bfloat16, device="cuda")) for _ in range(2)]  # fmt: skip
        valid = torch.zeros(2, C, dtype=torch.bool, device="cuda")
        for b, n in enumerate(lengths):
            for i in range(2):
                ctx[i][0][b, :n], ctx[i][1][b, :n] = kv[b][i, 0], kv[b][i, 1]
            valid[b, :n] = True
        tokens = torch.tensor([[100 + b] + [mask] * 15 for b in range(2)], device="cuda")
        positions = torch.stack([torch.arange(n, n + 16, device="cuda") for n in lengths])
        want = model.block_logits(tokens, positions, ctx, valid)  # [2, 15, vocab] fp32
        got = model.full_logits(logits.view(2, 16, -1)[:, 1:])
        keep = torch.isfinite(want)
        assert torch.equal(keep, torch.isfinite(got))
        err = float((got[keep] - want[keep]).abs().max() / want[keep].abs().max())
        assert err < 0.03, err
        assert torch.equal(ids[:2], got.argmax(dim=-1))  # the drafts: its own logits' argmax
        agree = float((want.argmax(dim=-1) == ids[:2]).float().mean())
        assert agree > 0.5, agree
