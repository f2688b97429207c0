"""`--spec dflash`: greedy output is token-for-token the output without it, with a seeded
random DFlash drafter attached to the tiny fixtures (mostly wrong drafts: every round commits
through the rejection path) and to the trained tiny-agent model: batches shrinking from 8 rows
to 1, windows past the block (k = 15 drafts at most block - 1), pauses under a tiny KV pool,
EOS stops, stop strings, the thinking budget and a follow-up reusing the prefix. The drafter
keeps exactly the context of committed positions; an artifact without the component is
refused at startup."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer

from ninfer import LLM, SamplingParams
from ninfer.artifact.format import Artifact
from ninfer.errors import ConfigError
from ninfer.runtime.request import Request
from ninfer.runtime.step import SeqChunk, StepBatch
from tests.runtime.real_engine import settled
from tests.spec.spec_engine import check_counters, make_engine, run

LENGTHS = (3, 9, 17, 32, 47, 64, 85, 120)
OUTPUTS = (1, 2, 3, 21, 14, 6, 11, 17)  # 1 and 2: never a window; 3: one draft at most
BLOCK = 8  # artifacts/fixture_dflash.py: block_size 8, so at most 7 drafts a round


@pytest.fixture(scope="module")
def dflash(fixture_artifacts, fixture_root):
    """arch (or a path) -> that fixture with a seeded random DFlash drafter attached."""
    from artifacts.fixture_dflash import build_dflash_fixture

    def build(target):
        path = target if not isinstance(target, str) else fixture_artifacts(target)
        return build_dflash_fixture(path, fixture_root)

    return build


def _requests(n: int = 8, **params) -> list[Request]:
    params = {"temperature": 0.0, "ignore_eos": True, **params}
    return [
        Request(tuple((7 * i + 3 * j) % 500 + 1 for j in range(L)),
                SamplingParams(max_tokens=m, **params))
        for i, (L, m) in enumerate(zip(LENGTHS[:n], OUTPUTS[:n]))
    ]  # fmt: skip


def plain_and_dflash(target, requests, k=4, **options):
    """(plain outputs, --spec dflash outputs, the speculative engine's settled stats)."""
    with make_engine(target, None, **options) as plain:
        want = run(plain, requests())
    with make_engine(target, None, spec="dflash", draft_tokens=k, **options) as spec:
        outs = run(spec, requests())
        stats = settled(spec)
    return want, outs, stats


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen3_5"])
def test_greedy_dflash_equals_plain_decoding(arch, dflash):
    want, outs, stats = plain_and_dflash(dflash(arch), _requests, max_concurrency=8)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert [o.usage.completion_tokens for o in outs] == list(OUTPUTS)
    check_counters(outs, stats, 4, backend="dflash")
    assert stats.spec_decode_rounds_total > 0
    assert outs[1].timings.speculative["fallback_steps"] == 1


@pytest.mark.parametrize("k", [1, 15])
def test_one_lane_and_windows_past_the_block(k, dflash):
    requests = _requests(5)[3:5]
    want, outs, stats = plain_and_dflash(dflash("qwen3"), lambda: requests, k=k, max_concurrency=1)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    check_counters(outs, stats, k, backend="dflash")
    for o in outs:  # one block forward drafts at most block - 1 tokens
        s = o.timings.speculative
        assert s["drafted_tokens"] <= min(k, BLOCK - 1) * s["rounds"]
        assert k == 1 or s["accepted_per_position"][BLOCK - 1 :] == [0] * (k - BLOCK + 1)


@pytest.mark.parametrize(("arch", "route"), [("qwen3", "replay"), ("qwen3_5", "snapshot")])
def test_pauses_under_a_tiny_pool_change_nothing(arch, route, dflash):
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    requests = [Request(r.prompt_token_ids, params) for r in _requests()]
    pool = {"kv_capacity": 192, "host_context_mib": 0 if route == "replay" else 64}
    want, outs, stats = plain_and_dflash(dflash(arch), lambda: requests, max_concurrency=8, **pool)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert stats.preemptions_total > 0, stats
    check_counters(outs, stats, 4, backend="dflash")


def _agent(tiny_agent, tiny_agent_prompts):
    tok = Tokenizer.from_str(Artifact(tiny_agent).tokenizer_json)
    prompts = [tuple(tok.encode(p["prompt"], add_special_tokens=False).ids) for p in tiny_agent_prompts[:8]]  # fmt: skip
    return tok, prompts


def test_eos_stops_and_thinking_budget(dflash, tiny_agent, tiny_agent_prompts):
    """The trained model stops on EOS by itself; a thinking budget of 5 forces the close
    suffix mid-round. Each round commits exactly what plain decoding would have."""
    tok, prompts = _agent(tiny_agent, tiny_agent_prompts)
    close = tuple(tok.encode("</think>", add_special_tokens=False).ids)
    suffix = tuple(tok.encode("\nOK.\n</think>\n\n", add_special_tokens=False).ids)

    def requests() -> list[Request]:
        out = []
        for i, p in enumerate(prompts):
            budget = {"thinking_budget": 5, "thinking_close_ids": close,
                      "thinking_suffix_ids": suffix} if i % 2 else {}  # fmt: skip
            out.append(Request(p, SamplingParams(max_tokens=40, temperature=0.0), **budget))
        return out

    want, outs, stats = plain_and_dflash(dflash(tiny_agent), requests, k=7, max_concurrency=8)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert [o.finish_reason for o in outs] == [o.finish_reason for o in want]
    assert "stop" in {o.finish_reason for o in outs}
    assert any(o.usage.thinking_forced_tokens for o in outs)
    check_counters(outs, stats, 7, backend="dflash")


def test_stop_strings_and_a_follow_up_reusing_the_prefix(dflash, tiny_agent, tiny_agent_prompts):
    _, prompts = _agent(tiny_agent, tiny_agent_prompts)
    path = str(dflash(tiny_agent))
    params = SamplingParams(max_tokens=40, temperature=0.0, stop=["e"])
    opts = {"max_concurrency": 4, "kv_capacity": 2048, "max_context": 512}
    want = LLM(path, **opts).generate([list(p) for p in prompts[:4]], params)
    spec = LLM(path, spec="dflash", draft_tokens=5, **opts)
    got = spec.generate([list(p) for p in prompts[:4]], params)
    assert [o.text for o in got] == [o.text for o in want]
    assert any(o.finish_reason == "stop" for o in got)
    # a follow-up extending the first history: served from retained pages, drafted with the
    # context the drafter holds for the positions the target computed
    follow = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    history = list(prompts[0]) + list(got[0].token_ids) + [5, 6, 7]
    (a,) = LLM(path, **opts).generate([history], follow)
    (b,) = spec.generate([history], follow)
    assert b.token_ids == a.token_ids


def test_an_artifact_without_the_component_is_refused_at_startup(fixture_artifacts):
    from ninfer.api.server.config import check_capabilities
    from tests.spec.test_spec_options import parse

    with pytest.raises(
        ConfigError, match="--spec dflash needs the artifact's dflash component"
    ) as e:
        make_engine(fixture_artifacts("qwen3"), None, spec="dflash")
    assert "\n" not in str(e.value)
    with pytest.raises(
        ConfigError, match="--spec dflash needs the artifact's dflash component"
    ) as e:
        check_capabilities(
            parse("--spec", "dflash"), Artifact(fixture_artifacts("qwen3")).components
        )
    assert "\n" not in str(e.value)


def test_the_drafter_keeps_exactly_the_committed_context(dflash):
    """Context rows of rejected drafts (a token that differs from the committed one, and all
    after it) are dropped; the rest are the rows computed when they were observed."""
    from ninfer.runtime.executors.cpu.executor import executor_for
    from ninfer.spec.dflash import build_dflash_drafter

    path = dflash("qwen3")
    art = Artifact(path)
    ex = executor_for(str(path), capture=("L0", "L1"))
    drafter = build_dflash_drafter(art, ex)
    gen = torch.Generator().manual_seed(0)

    def observe(seq, start, tokens):
        hidden = {n: torch.randn(len(tokens), 64, generator=gen) for n in ("L0", "L1")}
        drafter.observe(StepBatch((SeqChunk(seq, tuple(tokens), start, ()),)), hidden)

    observe(1, 0, [10, 11, 12, 13])  # prefill
    observe(2, 0, [10, 11])  # another sequence in between
    observe(1, 4, [14, 20, 21, 22])  # a verify chunk: token 14 and drafts 20, 21, 22
    first = [k[:7].clone() for k in drafter._ctx[1].k]
    from ninfer.spec.drafter import DraftRow

    committed = (10, 11, 12, 13, 14, 20, 30)  # 20 accepted, 21 rejected for 30
    ctx = drafter._valid(DraftRow(1, committed, 4, 4, SamplingParams(temperature=0.0)))
    assert ctx.positions == [0, 1, 2, 3, 4, 5] and ctx.tokens == [10, 11, 12, 13, 14, 20]
    for i, k in enumerate(ctx.k):
        assert torch.equal(k[:6], first[i][:6])
    assert drafter._ctx[2].positions == [0, 1]
    observe(1, 6, [30])  # the next step recomputes from position 6
    assert drafter._ctx[1].positions == list(range(7))
    (d,) = drafter.propose(
        [DraftRow(1, (*committed, 31), 4, 4, SamplingParams(temperature=0.0))], _sampler()
    )
    assert len(d.tokens) == 4 and d.probs is None
    drafter.forget(1)
    assert 1 not in drafter._ctx


def _sampler():
    from ninfer.runtime.executors.sampler import Sampler

    return Sampler()


def test_lm_head_draft_drafts_from_the_reduced_head_and_changes_no_output(dflash):
    """--lm-head-draft: the drafter's logits come from the reduced, frequency-ranked head
    (ninfer/spec/draft_vocab.py): every draft is one of its tokens; greedy output is still the
    plain output (the target's full head verifies)."""
    from ninfer.runtime.executors.cpu.executor import executor_for
    from ninfer.spec.dflash import build_dflash_drafter
    from ninfer.spec.draft_vocab import draft_vocab
    from ninfer.spec.drafter import DraftRow

    path = dflash("qwen3")
    requests = _requests()
    with make_engine(path, None, max_concurrency=8) as plain:
        want = run(plain, requests)
    with make_engine(path, None, spec="dflash", draft_tokens=4, lm_head_draft=True,
                     max_concurrency=8) as spec:  # fmt: skip
        outs = run(spec, requests)
        stats = settled(spec)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    check_counters(outs, stats, 4, backend="dflash")
    art = Artifact(path)
    allowed = set(draft_vocab(art, 512))
    assert len(allowed) == 128
    drafter = build_dflash_drafter(art, executor_for(str(path), capture=("L0", "L1")), True)
    gen = torch.Generator().manual_seed(1)
    for seq in range(20):
        tokens = tuple(int(t) for t in torch.randint(1, 500, (9,), generator=gen))
        hidden = {n: torch.randn(8, 64, generator=gen) for n in ("L0", "L1")}
        drafter.observe(StepBatch((SeqChunk(seq, tokens[:8], 0, ()),)), hidden)
        for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=seq)):
            (d,) = drafter.propose([DraftRow(seq, tokens, 8, 7, params)], _sampler())
            assert len(d.tokens) == 7 and set(d.tokens) <= allowed
            if d.probs is not None:  # q is zero outside the reduced head
                outside = torch.ones(d.probs.shape[-1], dtype=torch.bool)
                outside[sorted(allowed)] = False
                assert float(d.probs[:, outside].sum()) == 0.0
