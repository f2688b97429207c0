"""Greedy output with `--spec mtp` is token-for-token the output without it: every fixture
architecture (the hybrids included) with a random MTP head, batches shrinking from 8 rows to 1 with
different windows, one lane, pauses under a tiny KV pool, a follow-up turn whose prefix is
reused (no target rows there: the head's KV starts after it), and penalties; the
artifact's component is shown by `compile`, listed by `inspect`, and required at startup."""

from __future__ import annotations

import pytest

from ninfer.artifact.format import Artifact
from ninfer.errors import ConfigError
from ninfer.runtime.request import Request, SamplingParams
from tests.runtime.real_engine import settled
from tests.spec.spec_engine import check_counters, make_engine, run

LENGTHS = (3, 9, 17, 32, 47, 64, 85, 120)
OUTPUTS = (1, 2, 3, 21, 14, 6, 11, 17)  # 1 and 2: never a window; 3: one draft at most
K = 3


def _requests(n: int = 8, **params) -> list[Request]:
    params = {"temperature": 0.0, "ignore_eos": True, **params}
    return [
        Request(tuple((7 * i + 3 * j) % 500 + 1 for j in range(L)),
                SamplingParams(max_tokens=m, **params))
        for i, (L, m) in enumerate(zip(LENGTHS[:n], OUTPUTS[:n]))
    ]  # fmt: skip


def plain_and_mtp(target, requests, k: int = K, lm_head_draft: bool = False, **options):
    """(plain outputs, --spec mtp outputs, the speculating engine's settled stats)."""
    with make_engine(target, None, **options) as plain:
        want = run(plain, requests())
    mtp = {"spec": "mtp", "draft_tokens": k, "lm_head_draft": lm_head_draft}
    with make_engine(target, None, **mtp, **options) as spec:
        outs = run(spec, requests())
        stats = settled(spec)
    return want, outs, stats


ARCHS = ("llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe")


@pytest.mark.parametrize(("arch", "lm_head_draft"), [*((a, False) for a in ARCHS),
                                                      ("qwen3_5", True)])  # fmt: skip
def test_greedy_mtp_equals_plain_decoding(arch, lm_head_draft, mtp_artifacts):
    want, outs, stats = plain_and_mtp(
        mtp_artifacts(arch), _requests, max_concurrency=8, lm_head_draft=lm_head_draft
    )
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert [o.usage.completion_tokens for o in outs] == list(OUTPUTS)
    check_counters(outs, stats, K, "mtp")
    assert stats.spec_decode_rounds_total > 0
    assert stats.spec_decode_draft_tokens_total >= stats.spec_decode_rounds_total


def test_the_head_shares_the_models_embedding(mtp_artifacts):
    with make_engine(mtp_artifacts("qwen3_5"), None, spec="mtp") as engine:
        head = engine.speculator.drafter.executor.weights
        target = engine.executor.weights
        name = "model.embed_tokens.weight"
        assert head[name] is target[name]  # one copy in memory
        assert head["lm_head.weight"] is target["lm_head.weight"]
        assert head["mtp.norm.weight"] is not target["model.norm.weight"]


@pytest.mark.parametrize("k", [1, 5])
def test_one_lane_and_other_windows(k, mtp_artifacts):
    requests = lambda: _requests(5)[3:5]
    want, outs, stats = plain_and_mtp(mtp_artifacts("qwen3"), requests, k=k, max_concurrency=1)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    check_counters(outs, stats, k, "mtp")


@pytest.mark.parametrize(("arch", "route"), [("qwen3", "replay"), ("qwen3_5", "snapshot")])
def test_pauses_under_a_tiny_pool_change_nothing(arch, route, mtp_artifacts):
    def requests():
        return [Request(r.prompt_token_ids, SamplingParams(max_tokens=16, temperature=0.0,
                                                           ignore_eos=True)) for r in _requests()]  # fmt: skip

    pool = {"kv_capacity": 192, "host_context_mib": 0 if route == "replay" else 64}
    want, outs, stats = plain_and_mtp(mtp_artifacts(arch), requests, max_concurrency=8, **pool)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert stats.preemptions_total > 0, stats
    check_counters(outs, stats, K, "mtp")


def test_penalties_and_a_reused_prefix(mtp_artifacts):
    """Penalties count the drafts before each position on both sides; a follow-up turn reuses
    the pages the first left (no target rows there: the head starts after them), same tokens."""
    target = mtp_artifacts("qwen3")
    want, outs, _ = plain_and_mtp(
        target, lambda: _requests(3, presence_penalty=1.5, frequency_penalty=1.0),
        max_concurrency=4,
    )  # fmt: skip
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    first = _requests(4)[3]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    got = {}
    for name, spec in (("plain", {}), ("mtp", {"spec": "mtp", "draft_tokens": K})):
        with make_engine(target, None, max_concurrency=2, **spec) as engine:
            (a,) = run(engine, [first])
            history = first.prompt_token_ids + a.token_ids + (5, 6, 7)
            (b,) = run(engine, [Request(history, params)])
            got[name] = (a.token_ids, b.token_ids, b.usage.cached_tokens, b.timings.speculative)
    assert got["mtp"][:2] == got["plain"][:2]
    assert got["mtp"][2] >= 48
    assert got["mtp"][3]["rounds"] > 0  # the head drafts from the first computed position on


def test_the_component_is_required_shown_and_listed(mtp_artifacts, fixture_artifacts, capsys):
    with pytest.raises(ConfigError, match="--spec mtp needs the artifact's mtp component") as e:
        make_engine(fixture_artifacts("qwen3"), None, spec="mtp")
    assert "\n" not in str(e.value)
    path = mtp_artifacts("qwen3_5")
    assert Artifact(path).components == ["text", "mtp"]
    from ninfer.cli import main

    assert main(["inspect", str(path)]) == 0
    assert "mtp" in capsys.readouterr().out
    assert main(["compile", str(path), "--spec", "mtp"]) == 0
    out = capsys.readouterr().out
    assert "capture: final=%hidden.final" in out  # the target's plan outputs the head's input
    head = out.split("== mtp (--spec mtp drafter stage) ==\n")[1]
    assert head.startswith("plan tiny-qwen3_5-mtp-mtp (qwen3_5)")
    assert "kv: dtype=f32 page_size=16 pages=512 capacity=8192 tokens layers=0 " in head


def test_bfloat16_with_the_reduced_head(mtp_artifacts):
    """A bfloat16 CPU engine: the reduced head's rows are bfloat16 too (its logits float32)."""
    want, outs, stats = plain_and_mtp(
        mtp_artifacts("qwen3"), lambda: _requests(4), max_concurrency=4, dtype="bfloat16",
        lm_head_draft=True,
    )  # fmt: skip
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert stats.spec_decode_rounds_total > 0


@pytest.mark.parametrize("seed", range(30))
def test_agree_checks_only_what_is_new(seed):
    """drafter.agree with `known` leading entries found equal before gives the full
    comparison's count whenever those entries still agree, and re-checks everything when the
    last of them does not (the tokens it was given were not the same committed tokens)."""
    import random

    from ninfer.spec.drafter import agree

    rng = random.Random(seed)
    tokens = [rng.randrange(4) for _ in range(rng.randint(1, 40))]
    offset = rng.randrange(len(tokens))
    have = tokens[offset:] + [rng.randrange(4) for _ in range(rng.randrange(4))]
    for i in rng.sample(range(len(have)), rng.randrange(min(3, len(have)) + 1)):
        have[i] = rng.randrange(4)
    limit = min(len(have), len(tokens) - offset)

    def full() -> int:
        i = 0
        while i < limit and have[i] == tokens[offset + i]:
            i += 1
        return i

    for known in range(full() + 1):
        assert agree(have, tokens, offset, limit, known) == full()
    if full() < limit:  # a caller that was told wrong: known past the first difference
        wrong = rng.randint(full() + 1, limit)
        if have[wrong - 1] != tokens[offset + wrong - 1]:
            assert agree(have, tokens, offset, limit, wrong) == full()
