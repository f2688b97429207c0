"""Greedy output with `--spec draft` is token-for-token the output without it: every attention
architecture of the fixtures, batches shrinking from 8 rows to 1 with different windows (rows
near max_tokens verify fewer drafts, rows at it none), a drafter that is always right (the
model itself) and one that is mostly wrong (another fixture), EOS stops, stop strings, the
thinking budget and pauses under a tiny KV pool; and what cannot speculate is refused."""

from __future__ import annotations

import json
import shutil

import pytest
from tokenizers import Tokenizer

from ninfer import LLM, SamplingParams
from ninfer.artifact.format import Artifact
from ninfer.errors import ConfigError
from ninfer.runtime.request import Request
from tests.spec.spec_engine import check_counters, make_engine, plain_and_spec, run

LENGTHS = (3, 9, 17, 32, 47, 64, 85, 120)
OUTPUTS = (1, 2, 3, 21, 14, 6, 11, 17)  # 1 and 2: never a window; 3: one draft at most


def _requests(n: int = 8) -> list[Request]:
    return [
        Request(tuple((7 * i + 3 * j) % 500 + 1 for j in range(L)),
                SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))
        for i, (L, m) in enumerate(zip(LENGTHS[:n], OUTPUTS[:n]))
    ]  # fmt: skip


PAIRS = [  # (target, drafter): each attention fixture drafting for itself and drafted by
    # another; hybrid targets (Gated DeltaNet: round slots) drafted by attention-only fixtures
    ("llama", "self"), ("qwen3", "self"), ("qwen3_moe", "self"),
    ("llama", "qwen3"), ("qwen3", "llama"), ("qwen3_moe", "llama"),
    ("qwen3_5", "qwen3"), ("qwen3_5", "llama"), ("qwen3_5_moe", "qwen3"),
]  # fmt: skip


@pytest.mark.parametrize(("arch", "drafter"), PAIRS)
def test_greedy_speculation_equals_plain_decoding(arch, drafter, fixture_artifacts):
    target = fixture_artifacts(arch)
    draft = target if drafter == "self" else fixture_artifacts(drafter)
    requests = _requests()
    want, outs, stats = plain_and_spec(target, draft, lambda: requests, max_concurrency=8)
    want = [o.token_ids for o in want]
    assert [o.token_ids for o in outs] == want
    assert [o.usage.completion_tokens for o in outs] == list(OUTPUTS)
    check_counters(outs, stats, 4)
    assert stats.spec_decode_rounds_total > 0
    assert stats.generation_tokens_total == sum(OUTPUTS)
    # max_tokens 1 decodes nothing, 2 decodes one token without a window (a fallback step)
    assert (
        outs[0].timings.speculative["rounds"] == outs[0].timings.speculative["fallback_steps"] == 0
    )
    assert outs[1].timings.speculative["fallback_steps"] == 1
    if drafter == "self":  # the model drafting for itself is (almost) always right
        acc = stats.spec_decode_accepted_tokens_total / stats.spec_decode_draft_tokens_total
        assert acc > 0.9, stats
        assert stats.decode_rounds_total < stats.decode_tokens_total / 2


@pytest.mark.parametrize("k", [1, 3, 7])
def test_one_lane_and_other_windows(k, fixture_artifacts):
    target = fixture_artifacts("qwen3")
    requests = _requests(5)[3:5]
    want, outs, stats = plain_and_spec(target, target, lambda: requests, k=k, max_concurrency=1)
    want = [o.token_ids for o in want]
    assert [o.token_ids for o in outs] == want
    check_counters(outs, stats, k)


@pytest.mark.parametrize(
    ("arch", "route"), [("qwen3", "replay"), ("qwen3", "snapshot"), ("qwen3_5", "snapshot")]
)
def test_pauses_under_a_tiny_pool_change_nothing(arch, route, fixture_artifacts):
    """12 pages for 8 requests that need up to 9 each: the youngest are paused (and rebuilt by
    replay or from a host snapshot, of the hybrid's current round slot) while others
    speculate."""
    target, draft = fixture_artifacts(arch), fixture_artifacts("llama")
    requests = [
        Request(r.prompt_token_ids, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
        for r in _requests()
    ]
    pool = {"kv_capacity": 192, "host_context_mib": 0 if route == "replay" else 64}
    want, outs, stats = plain_and_spec(target, draft, lambda: requests, max_concurrency=8, **pool)
    want = [o.token_ids for o in want]
    assert [o.token_ids for o in outs] == want
    assert stats.preemptions_total > 0, stats
    check_counters(outs, stats, 4)


def _agent_prompts(tiny_agent, tiny_agent_prompts) -> tuple[Tokenizer, list[tuple[int, ...]]]:
    tok = Tokenizer.from_str(Artifact(tiny_agent).tokenizer_json)
    return tok, [tuple(tok.encode(p["prompt"], add_special_tokens=False).ids) for p in tiny_agent_prompts[:8]]  # fmt: skip


@pytest.mark.parametrize("drafter", ["self", "qwen3"])
def test_eos_stops_and_thinking_budget_on_the_trained_model(
    drafter, tiny_agent, tiny_agent_prompts, fixture_artifacts
):
    """The trained model thinks and stops on EOS by itself; a thinking budget of 5 forces the
    close suffix mid-round. Each round commits exactly what plain decoding would have."""
    tok, prompts = _agent_prompts(tiny_agent, tiny_agent_prompts)
    close = tuple(tok.encode("</think>", add_special_tokens=False).ids)
    suffix = tuple(tok.encode("\nOK.\n</think>\n\n", add_special_tokens=False).ids)

    def requests() -> list[Request]:
        out = []
        for i, p in enumerate(prompts):
            budget = {"thinking_budget": 5, "thinking_close_ids": close,
                      "thinking_suffix_ids": suffix} if i % 2 else {}  # fmt: skip
            out.append(Request(p, SamplingParams(max_tokens=40, temperature=0.0), **budget))
        return out

    draft = tiny_agent if drafter == "self" else fixture_artifacts(drafter)
    want, outs, stats = plain_and_spec(tiny_agent, draft, requests, max_concurrency=8)
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    assert [o.finish_reason for o in outs] == [o.finish_reason for o in want]
    assert [o.usage.thinking_forced_tokens for o in outs] == [
        o.usage.thinking_forced_tokens for o in want
    ]
    assert "stop" in {o.finish_reason for o in outs}  # EOS inside accepted rounds
    assert any(o.usage.thinking_forced_tokens for o in outs)
    check_counters(outs, stats, 4)


def test_stop_strings_truncate_a_round_as_plain_decoding_does(tiny_agent, tiny_agent_prompts):
    _, prompts = _agent_prompts(tiny_agent, tiny_agent_prompts)
    params = SamplingParams(max_tokens=40, temperature=0.0, stop=["e"])
    opts = {"max_concurrency": 4, "kv_capacity": 2048, "max_context": 512}
    want = LLM(str(tiny_agent), **opts).generate([list(p) for p in prompts[:4]], params)
    spec = LLM(str(tiny_agent), spec="draft", draft_model=str(tiny_agent), **opts)
    got = spec.generate([list(p) for p in prompts[:4]], params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.text for o in got] == [o.text for o in want]
    assert any(o.finish_reason == "stop" for o in got)


def test_a_hybrid_draft_model_is_refused_at_startup(fixture_artifacts):
    with pytest.raises(ConfigError, match="--draft-model .*hybrid .*attention-only") as e:
        make_engine(fixture_artifacts("qwen3"), fixture_artifacts("qwen3_5"))
    assert "\n" not in str(e.value)


def test_a_draft_model_with_another_tokenizer_is_refused(tmp_path, fixture_hf_dir):
    from ninfer.artifact.convert_hf import convert_hf
    from ninfer.ir.models import check_tensors

    def convert(name: str, swap: bool):
        hf = tmp_path / name
        shutil.copytree(fixture_hf_dir("qwen3"), hf)
        if swap:  # two tokens trade ids: the same text would be other ids
            data = json.loads((hf / "tokenizer.json").read_text())
            vocab = data["model"]["vocab"]
            a, b = sorted(vocab, key=vocab.get)[300:302]
            vocab[a], vocab[b] = vocab[b], vocab[a]
            (hf / "tokenizer.json").write_text(json.dumps(data))
        return convert_hf(hf, tmp_path / f"{name}.ninfer", name=name, check_model=check_tensors)

    target, other = convert("target", False), convert("other", True)
    with pytest.raises(ConfigError, match=r"--draft-model .*other\.ninfer: its tokenizer differs"):
        make_engine(target, other)


def test_penalties_count_the_drafts_before_each_position(fixture_artifacts):
    """Presence / frequency penalties read the output so far: at a draft position they count
    the drafts before it, on both sides, so greedy output still equals plain decoding."""
    target, draft = fixture_artifacts("qwen3"), fixture_artifacts("qwen3")
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True,
                            presence_penalty=1.5, frequency_penalty=1.0)  # fmt: skip
    requests = [Request(r.prompt_token_ids, params) for r in _requests(3)]
    want, outs, stats = plain_and_spec(target, draft, lambda: requests, max_concurrency=4)
    want = [o.token_ids for o in want]
    assert [o.token_ids for o in outs] == want
    assert stats.spec_decode_accepted_tokens_total > 0


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_a_follow_up_reuses_the_prefix_a_speculating_request_left(arch, fixture_artifacts):
    """The pages (and, hybrid, the state checkpoint) retained by a request that speculated
    serve a follow-up turn that extends its history: the follow-up skips them and its output
    is still the plain one."""
    target, draft = fixture_artifacts(arch), fixture_artifacts("qwen3" if arch != "qwen3" else arch)
    first = _requests(4)[3]  # 32-token prompt, 21 outputs
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outs = {}
    for name, d in (("plain", None), ("spec", draft)):
        with make_engine(target, d, k=4, max_concurrency=2) as engine:
            (a,) = run(engine, [first])
            history = first.prompt_token_ids + a.token_ids + (5, 6, 7)
            (b,) = run(engine, [Request(history, params)])
            outs[name] = (a.token_ids, b.token_ids, b.usage.cached_tokens)
    assert outs["spec"][:2] == outs["plain"][:2]
    assert outs["spec"][2] >= 48  # at least three of its pages were reused
