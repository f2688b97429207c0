"""The DFlash graph path's body (ninfer/spec/dflash_graph.py: fused q/k/v and gate/up GEMMs,
kernels.rmsnorm, kernels.attn_prologue into the staging rows, kernels.block_attention, the head
and its argmax on the device) against the eager forward: on the CPU its kernels run under the
Triton interpreter (in a child process: TRITON_INTERPRET is read when a kernel is defined),
uncaptured. Rows of different context lengths, contexts that grow, are cut back (a rejected
draft) and move between staging rows, a finished sequence's row reused, greedy and sampled
rows, the full and the reduced (--lm-head-draft) head, the layers as fp8 rows (--lm-head-draft
on CUDA), and a round too large for the staging buffer run eagerly. tests/spec/test_spec_cuda.py runs the captured graphs on a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
TARGET = {  # 4 target layers, GQA 4/2, head_dim 16 (as tests/spec/test_spec_dflash_model.py)
    "num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 96,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 600,
    "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
}  # fmt: skip


def _model(seed: int, reduced: bool):
    from artifacts.fixture_dflash import dflash_config, random_state
    from ninfer.artifact.dflash import DFlashConfig
    from ninfer.spec.dflash_model import DFlashModel
    from ninfer.spec.draft_head import DraftHead

    cfg = dflash_config(TARGET, layers=2, block_size=5, target_layer_ids=[0, 2])
    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(600, 64, generator=gen)
    head = 0.3 * torch.randn(600, 64, generator=gen)
    model = DFlashModel(
        DFlashConfig.from_config(cfg, 4, 64), random_state(cfg, seed, 0.15), embed, head
    )
    if reduced:
        ids = torch.arange(3, 600, 4)
        model.reduce_head(DraftHead(ids, head[ids]))
    return model


def _fp8_exact(model) -> None:
    """Round the layers' projections to fp8 values (e4m3 times their row scale): quantised
    again by an fp8 layer they give the same bytes and scales, so the fp8 rows hold exactly
    the weights the eager forward reads."""
    from kernels.quant_gemm import quantize_weight_fp8

    for name, w in model.w.items():
        if name.endswith("_proj.weight"):
            q, s = quantize_weight_fp8(w)
            model.w[name] = q.view(torch.float8_e4m3fn).float() * s[:, None]


def compare(reduced: bool, fp8: bool = False) -> None:
    """Run in the child: the same rounds through an eager drafter and an uncaptured graph one;
    `fp8`: the graph's layers read fp8 rows (--lm-head-draft on CUDA) of weights fp8 holds
    exactly."""
    from ninfer.runtime.executors.sampler import Sampler
    from ninfer.runtime.request import SamplingParams
    from ninfer.runtime.step import SeqChunk, StepBatch
    from ninfer.spec import dflash_graph
    from ninfer.spec.dflash import DFlashDrafter
    from ninfer.spec.dflash_graph import DFlashGraphs
    from ninfer.spec.drafter import DraftRow

    models = [_model(1, reduced), _model(1, reduced)]
    if fp8:
        for model in models:
            _fp8_exact(model)
    eager = DFlashDrafter(models[0])
    graphs = DFlashGraphs(models[1], capture=False, fp8_layers=fp8)
    assert len(graphs._fp8) == (8 if fp8 else 0)  # 2 layers: q/k/v, o, gate/up, down
    fast = DFlashDrafter(graphs.m, graphs)
    gen = torch.Generator().manual_seed(7)
    committed: dict[int, list[int]] = {}

    def observe(seq: int, start: int, tokens: list[int]) -> None:
        hidden = {n: torch.randn(len(tokens), 64, generator=gen) for n in ("L0", "L2")}
        batch = StepBatch((SeqChunk(seq, tuple(tokens), start, ()),))
        for d in (eager, fast):
            d.observe(batch, hidden)
        committed[seq] = committed.get(seq, [])[:start] + tokens

    def round_(seqs: list[int], temperature: float = 0.0) -> None:
        params = SamplingParams(temperature=temperature, seed=5)
        rows = [DraftRow(s, (*committed[s], 11 + s), 1, 4, params) for s in seqs]
        want = eager._propose(rows, Sampler())
        got = fast._propose(rows, Sampler())
        for w, g in zip(want, got):
            assert w.tokens == g.tokens, (seqs, w.tokens, g.tokens)
            if w.probs is not None:
                torch.testing.assert_close(g.probs, w.probs, atol=1e-4, rtol=1e-4)

    observe(1, 0, list(range(20, 60)))  # 40 context rows
    observe(2, 0, [5, 6, 7])
    round_([1])
    round_([1, 2])  # two rows of different lengths
    round_([2, 1])  # the sequences swap staging rows
    observe(1, 40, [11 + 1, 70, 71, 72])  # a verify chunk grows the context
    round_([1, 2])
    committed[1] = committed[1][:42] + [99]  # 71 rejected: positions from 42 on are cut
    round_([1, 2])
    observe(1, 42, [99, 80, 81])  # the next step recomputes from 42: staged rows 42, 43 stale
    round_([1, 2])
    observe(3, 0, list(range(100, 400)))  # 300 rows: the staging buffer grows (C 256 -> 512)
    round_([3, 1, 2])
    fast.forget(2)
    eager.forget(2)
    observe(4, 0, [9] * 10)
    round_([4, 3], temperature=0.8)  # sampled rows: q from the graph's logits
    assert graphs.rounds == 8 and graphs._P == 4 and graphs._C == 512
    if fp8:  # a one-row round's 5 block rows read fp8 rows; the wider rounds bf16
        assert all(5 in rows._calls and 20 in rows._calls for rows in graphs._fp8.values())
    dflash_graph.STAGING_MAX_BYTES = 0  # a round whose staging would not fit runs eagerly
    round_([4, 3])
    assert graphs.rounds == 8


# The reduced head with bf16 layers needs no run of its own: the fp8 run's rounds of several
# sequences read the bf16 layers with the reduced head, and the head and the layers are
# separate calls in the graph body.
@pytest.mark.parametrize(("reduced", "fp8"), [(False, False), (True, True)])
def test_graph_body_drafts_what_the_eager_forward_drafts(reduced, fp8):
    path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    code = f"from tests.spec.test_spec_dflash_graph import compare; compare({reduced}, {fp8})"
    proc = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=REPO, env=env, capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
