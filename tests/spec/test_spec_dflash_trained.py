"""The trained tiny DFlash drafter (artifacts/train_dflash.py: self-distillation on the tiny
agent's own greedy continuations, committed in artifacts/fixtures/tiny-agent-dflash/) drafts
for its target well: with k = 7 (one block of 8) on the fixture's prompts, every round commits
tau >= 2 tokens on average, and the output is the plain greedy output."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer

from ninfer.artifact.format import Artifact
from ninfer.runtime.request import Request, SamplingParams
from tests.runtime.real_engine import settled
from tests.spec.spec_engine import check_counters, make_engine, run


@pytest.fixture(scope="module")
def trained_dflash(tiny_agent, fixture_root):
    """tiny-agent.ninfer with the committed trained drafter attached (one trained on first use
    instead when the fixture's weights changed since: artifacts/train_dflash.py `attached`)."""
    from artifacts.train_dflash import attached

    n = torch.get_num_threads()
    torch.set_num_threads(2)  # the module runs single-threaded; a training would use both cores
    try:
        return attached(tiny_agent, fixture_root, log=lambda *_: None)
    finally:
        torch.set_num_threads(n)


def test_the_trained_drafter_reaches_tau_2_with_k_7(trained_dflash, tiny_agent_prompts):
    tok = Tokenizer.from_str(Artifact(trained_dflash).tokenizer_json)
    prompts = [tuple(tok.encode(p["prompt"], add_special_tokens=False).ids) for p in tiny_agent_prompts[:8]]  # fmt: skip
    requests = [Request(p, SamplingParams(max_tokens=120, temperature=0.0)) for p in prompts]
    with make_engine(trained_dflash, None, max_concurrency=8) as plain:
        want = run(plain, requests)
    with make_engine(trained_dflash, None, spec="dflash", draft_tokens=7, max_concurrency=8) as e:
        outs = run(e, requests)
        stats = settled(e)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert all(o.finish_reason == "stop" for o in outs)  # the replies end with <|im_end|>
    check_counters(outs, stats, 7, backend="dflash")
    tau = 1 + stats.spec_decode_accepted_tokens_total / stats.spec_decode_rounds_total
    assert tau >= 2.0, (tau, stats)
    # the drafts past the first are used too: the block drafts several tokens at once
    per_position = [
        sum(o.timings.speculative["accepted_per_position"][j] for o in outs) for j in range(7)
    ]
    assert per_position[2] > 0, per_position


def test_bench_engine_reports_the_dflash_drafter(trained_dflash, tmp_path, capsys):
    """`ninfer bench engine ARTIFACT --spec dflash`: plain and speculative runs of the same
    prompts, with tau, acceptance by position and the drafter's cost per round."""
    import argparse
    import json

    from ninfer.commands import bench

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What is 2 plus 3?\nIs a tomato a fruit?\n", encoding="utf-8")
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    out = tmp_path / "spec.json"
    args = p.parse_args([
        "engine", str(trained_dflash), "--spec", "dflash", "--draft-tokens", "7",
        "--prompts", str(prompts), "--batch-sizes", "2", "--output-len", "40", "--device", "cpu",
        "--reps", "2", "--json", str(out),
    ])  # fmt: skip
    assert bench.run(args) == 0
    assert "drafted by its DFlash drafter" in capsys.readouterr().out
    (r,) = json.loads(out.read_text())["results"]
    assert r["identical"] and r["draft_tokens"] == 7
    assert r["drafted"] >= r["accepted"] > 0 and r["drafted"] <= 7 * r["rounds"]
    assert r["tau"] == pytest.approx(1.0 + sum(r["accept_rate_per_position"]))
    assert r["tau"] > 1.5 and r["draft_ratio"] > 0
    # one block forward per step drafts for every row of it (rounds count rows)
    assert 0.5 <= r["draft_forwards_per_round"] <= 1.0


def test_constrained_rows_share_the_batch(trained_dflash, tiny_agent_prompts):
    """A step with a constrained (JSON schema) row runs plainly; the engine still hands the
    drafter that step's hidden states, so the other rows' context stays whole: output
    unchanged, and the unconstrained rows draft (and are accepted) once the others are done."""
    from ninfer.constrain import JsonSchema, TokenizerInfo, compile_constraint

    art = Artifact(trained_dflash)
    tok = Tokenizer.from_str(art.tokenizer_json)
    prompts = [tuple(tok.encode(p["prompt"], add_special_tokens=False).ids) for p in tiny_agent_prompts[4:8]]  # fmt: skip
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    c = compile_constraint(JsonSchema(schema), TokenizerInfo.from_artifact(art))
    requests = [
        Request(p, SamplingParams(max_tokens=12 if i % 2 else 120, temperature=0.0),
                constraint=c if i % 2 else None)
        for i, p in enumerate(prompts)
    ]  # fmt: skip
    with make_engine(trained_dflash, None, max_concurrency=4) as plain:
        want = run(plain, requests)
    with make_engine(trained_dflash, None, spec="dflash", draft_tokens=7, max_concurrency=4) as e:
        outs = run(e, requests)
        stats = settled(e)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert tok.decode(list(outs[1].token_ids)).startswith("{")  # held to the schema
    for o in (outs[0], outs[2]):
        assert o.timings.speculative["rounds"] > 0 and o.timings.speculative["accepted_tokens"] > 0
    check_counters(outs, stats, 7, backend="dflash")


def test_the_reduced_draft_head_keeps_the_output(trained_dflash, tiny_agent_prompts):
    """--lm-head-draft on the trained drafter: the same plain output, drafts still accepted.
    (The fixture has no frequency ranking of its own, so the reduced head is the tokenizer's
    top 128 of 512 by merge order, which misses many of the agent's tokens: tau fell from 3.29
    to 1.41 when measured.)"""
    tok = Tokenizer.from_str(Artifact(trained_dflash).tokenizer_json)
    prompts = [tuple(tok.encode(p["prompt"], add_special_tokens=False).ids) for p in tiny_agent_prompts[:8]]  # fmt: skip
    requests = [Request(p, SamplingParams(max_tokens=120, temperature=0.0)) for p in prompts]
    with make_engine(trained_dflash, None, max_concurrency=8) as plain:
        want = run(plain, requests)
    with make_engine(trained_dflash, None, spec="dflash", draft_tokens=7, lm_head_draft=True,
                     max_concurrency=8) as e:  # fmt: skip
        outs = run(e, requests)
        stats = settled(e)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    check_counters(outs, stats, 7, backend="dflash")
    assert stats.spec_decode_accepted_tokens_total > stats.spec_decode_rounds_total / 5, stats
