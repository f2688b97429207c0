"""The trained MTP head of the tiny-agent fixture (artifacts/train_mtp.py): it drafts well
(tau >= 2 with k = 3 on the fixture's prompts, tau as `ninfer bench` reports it: committed
tokens per round), with and without --lm-head-draft; output stays the plain output through EOS
stops, a thinking budget forcing its suffix mid-round, and stop strings."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from ninfer import LLM, SamplingParams
from ninfer.artifact.format import Artifact
from ninfer.runtime.request import Request
from tests.runtime.real_engine import settled
from tests.spec.spec_engine import check_counters, make_engine, run

K = 3


def _prompts(path, prompts) -> tuple[Tokenizer, list[tuple[int, ...]]]:
    tok = Tokenizer.from_str(Artifact(path).tokenizer_json)
    return tok, [tuple(tok.encode(p["prompt"], add_special_tokens=False).ids) for p in prompts]


def _run(path, requests, **spec):
    with make_engine(
        path, None, max_concurrency=8, max_context=1024, kv_capacity=8192, **spec
    ) as engine:
        outs = run(engine, requests())
        return outs, settled(engine)


@pytest.mark.parametrize("lm_head_draft", [False, True])
def test_the_trained_head_reaches_tau_2_and_changes_no_token(
    lm_head_draft, tiny_agent_mtp, tiny_agent_prompts
):
    _, prompts = _prompts(tiny_agent_mtp, tiny_agent_prompts)

    def requests():
        return [Request(p, SamplingParams(max_tokens=200, temperature=0.0)) for p in prompts]

    want, _ = _run(tiny_agent_mtp, requests)
    spec = {"spec": "mtp", "draft_tokens": K, "lm_head_draft": lm_head_draft}
    outs, stats = _run(tiny_agent_mtp, requests, **spec)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert {o.finish_reason for o in outs} == {"stop"}  # every reply ends on its own EOS
    check_counters(outs, stats, K, "mtp")
    rounds = stats.spec_decode_rounds_total
    tau = (stats.spec_decode_accepted_tokens_total + rounds) / rounds
    assert tau >= 2.0, (tau, stats)


def test_thinking_budget_and_stop_strings(tiny_agent_mtp, tiny_agent_prompts):
    """A thinking budget of 5 forces the close suffix mid-round; stop strings truncate a
    round as plain decoding does."""
    tok, prompts = _prompts(tiny_agent_mtp, tiny_agent_prompts[:8])
    close = tuple(tok.encode("</think>", add_special_tokens=False).ids)
    suffix = tuple(tok.encode("\nOK.\n</think>\n\n", add_special_tokens=False).ids)

    def requests():
        out = []
        for i, p in enumerate(prompts):
            budget = {"thinking_budget": 5, "thinking_close_ids": close,
                      "thinking_suffix_ids": suffix} if i % 2 else {}  # fmt: skip
            out.append(Request(p, SamplingParams(max_tokens=40, temperature=0.0), **budget))
        return out

    want, _ = _run(tiny_agent_mtp, requests)
    outs, stats = _run(tiny_agent_mtp, requests, spec="mtp", draft_tokens=K)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert [o.usage.thinking_forced_tokens for o in outs] == [
        o.usage.thinking_forced_tokens for o in want
    ]
    assert any(o.usage.thinking_forced_tokens for o in outs)
    check_counters(outs, stats, K, "mtp")

    params = SamplingParams(max_tokens=40, temperature=0.0, stop=["e"])
    opts = {"max_concurrency": 4, "kv_capacity": 2048, "max_context": 512}
    ids = [list(p) for p in prompts[:4]]
    plain = LLM(str(tiny_agent_mtp), **opts).generate(ids, params)
    got = LLM(str(tiny_agent_mtp), spec="mtp", draft_tokens=K, **opts).generate(ids, params)
    assert [o.text for o in got] == [o.text for o in plain]
    assert any(o.finish_reason == "stop" for o in got)


def test_the_reduced_head_takes_the_most_frequent_tokens(tiny_agent_mtp):
    """--lm-head-draft's vocabulary: a quarter of the 512 tokens, the special tokens (EOS among
    them) always in, the rest from the top of the head's stored ranking (token counts of the
    target's continuations)."""
    import numpy as np

    from ninfer.spec.draft_vocab import RANKING, draft_vocab

    art = Artifact(tiny_agent_mtp)
    ids = draft_vocab(art, 512)
    assert len(ids) == 128 and ids == sorted(ids)
    special = {t["id"] for t in json.loads(art.tokenizer_json)["added_tokens"]}
    assert special <= set(ids) and set(art.special_tokens["eos_token_ids"]) <= set(ids)
    ranking = [int(t) for t in np.asarray(art.dense(RANKING))]
    top = [t for t in ranking if t not in special][: 128 - len(special)]
    assert set(ids) == special | set(top)


def test_bench_reports_the_mtp_head(tiny_agent_mtp, tmp_path, capsys):
    """`ninfer bench engine ARTIFACT --spec mtp --lm-head-draft`: tau, acceptance, step costs
    and speeds of the trained head against plain decoding, identical output."""
    import argparse

    from ninfer.commands import bench

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hi!\nWhat can you do?\n")
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    out = tmp_path / "report.json"
    args = p.parse_args([
        "engine", str(tiny_agent_mtp), "--spec", "mtp", "--lm-head-draft", "--draft-tokens",
        "3", "--batch-sizes", "1,2", "--prompts", str(prompts), "--output-len", "24",
        "--device", "cpu", "--reps", "2", "--json", str(out),
    ])  # fmt: skip
    assert bench.run(args) == 0
    assert "drafted by its MTP head (--lm-head-draft)" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["spec"] == "mtp"
    for r in report["results"]:
        assert r["identical"] and r["rounds"] > 0 and r["drafted"] >= r["accepted"]
        assert r["tau"] == pytest.approx(1.0 + sum(r["accept_rate_per_position"]))


def test_constrained_rows_share_the_batch(tiny_agent_mtp, tiny_agent_prompts):
    """A step with a constrained (JSON schema) row runs plainly (the engine still hands the
    head that step's hidden states): output unchanged, and the other rows draft once the
    constrained ones are done."""
    from ninfer.constrain import JsonSchema, TokenizerInfo, compile_constraint

    tok, prompts = _prompts(tiny_agent_mtp, tiny_agent_prompts[8:12])  # long replies
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    c = compile_constraint(
        JsonSchema(schema), TokenizerInfo.from_artifact(Artifact(tiny_agent_mtp))
    )

    def requests():  # the constrained rows end first; the others then speculate
        return [
            Request(p, SamplingParams(max_tokens=20 if i % 2 else 120, temperature=0.0),
                    constraint=c if i % 2 else None)
            for i, p in enumerate(prompts)
        ]  # fmt: skip

    want, _ = _run(tiny_agent_mtp, requests)
    outs, stats = _run(tiny_agent_mtp, requests, spec="mtp", draft_tokens=K)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert tok.decode(list(outs[1].token_ids)).startswith("{")  # held to the schema
    assert outs[0].timings.speculative["rounds"] > 0 and outs[2].timings.speculative["rounds"] > 0
    check_counters(outs, stats, K, "mtp")
