"""Constrained decoding through the real engine (CPU executor, the trained tiny agent): the
sampler masks every constrained row, the matcher sees every committed token (a thinking-budget
suffix included), a complete constraint finishes the request with 'stop', and a broken one with
a clear error. Steps scheduled ahead sample their constrained rows after the previous commit:
their output equals the one of an engine that never plans ahead."""

from __future__ import annotations

import json

import jsonschema
import pytest

from ninfer import LLM
from ninfer.artifact.demo import demo_artifact_path
from ninfer.artifact.format import Artifact
from ninfer.constrain import (
    ConstraintError,
    JsonSchema,
    Regex,
    TokenizerInfo,
    compile_constraint,
)
from ninfer.constrain.errors import ConstraintFailed
from ninfer.runtime.request import Request, SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 31},
            "maxItems": 3,
        },
        "where": {
            "type": "object",
            "properties": {
                "lat": {"type": "integer", "minimum": -90, "maximum": 90},
                "ok": {"type": "boolean"},
            },
            "required": ["ok"],
            "additionalProperties": False,
        },
    },
    "required": ["city", "unit", "where"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm(tiny_agent) -> LLM:
    llm = LLM(str(tiny_agent), max_concurrency=4, kv_capacity=4096, max_context=1024)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def info(llm: LLM) -> TokenizerInfo:
    return TokenizerInfo.from_artifact(llm.artifact)


def _prompt(llm: LLM, i: int) -> tuple[int, ...]:
    return tuple(llm.tokenizer.encode(f"<|im_start|>user\nweather report {i}<|im_end|>\n"))


def _run(llm: LLM, requests: list[Request]) -> list:
    handles = [llm.engine.submit(r) for r in requests]
    return [h.result(timeout=300) for h in handles]


def test_json_schema_outputs_validate_and_stop(llm, info):
    """Four sampled requests batched together: each output is JSON valid against the schema,
    and the request ends with 'stop' as soon as the object is complete (no EOS needed)."""
    c = compile_constraint(JsonSchema(SCHEMA), info)
    params = [SamplingParams(max_tokens=300, temperature=1.0, seed=s) for s in range(4)]
    outs = _run(llm, [Request(_prompt(llm, i), p, constraint=c) for i, p in enumerate(params)])
    for out in outs:
        assert out.finish_reason == "stop", out
        text = llm.tokenizer.decode(list(out.token_ids))
        jsonschema.validate(json.loads(text), SCHEMA)


def test_ahead_steps_sample_the_same_as_without_overlap(tiny_agent, info):
    """With overlap the engine plans decode steps ahead of the last commit; their constrained
    rows are sampled once that commit fed the matchers. Seeded outputs equal an engine's that
    never plans ahead, mixed with an unconstrained request in the same batch."""
    c = compile_constraint(JsonSchema(SCHEMA), info)
    results = []
    for overlap in (True, False):
        llm = LLM(str(tiny_agent), max_concurrency=3, kv_capacity=4096, overlap=overlap)
        try:
            reqs = [
                Request(_prompt(llm, i), SamplingParams(max_tokens=120, seed=7 + i), constraint=k)
                for i, k in enumerate((c, c, None))
            ]
            results.append([tuple(o.token_ids) for o in _run(llm, reqs)])
            steps = llm.engine.snapshot().steps_total
        finally:
            llm.close()
        assert steps > 0
    assert results[0] == results[1]


def test_thinking_gate_and_forced_suffix_feed_the_matcher(llm, info):
    """Thinking on: free text until </think>; the budget's forced suffix (ending with </think>)
    is fed to the matcher like a sampled token, and the answer after it is constrained."""
    close = info.think_end_id
    suffix = tuple(llm.tokenizer.encode("\nOK.\n")) + (close,)
    c = compile_constraint(Regex(r"[0-9]{3}"), info).after_thinking()
    req = Request(
        _prompt(llm, 0) + tuple(llm.tokenizer.encode("<|im_start|>assistant\n<think>\n")),
        SamplingParams(max_tokens=60, seed=3),
        thinking_budget=4,
        thinking_close_ids=(close,),
        thinking_suffix_ids=suffix,
        constraint=c,
    )
    (out,) = _run(llm, [req])
    ids = list(out.token_ids)
    assert out.finish_reason == "stop", out
    assert close in ids
    answer = llm.tokenizer.decode(ids[ids.index(close) + 1 :])
    assert answer.isdigit() and len(answer) == 3, answer


def test_a_refused_forced_token_fails_the_request_clearly(llm, info):
    """Without the thinking gate, a forced thinking suffix the constraint does not allow ends
    the request with 'error' naming the constraint, instead of emitting it as valid output."""
    close = info.think_end_id
    c = compile_constraint(Regex(r"[0-9]+"), info)
    req = Request(
        _prompt(llm, 1),
        SamplingParams(max_tokens=40, seed=1),
        thinking_budget=1,
        thinking_close_ids=(close,),
        thinking_suffix_ids=tuple(llm.tokenizer.encode("\nOK.\n")) + (close,),
        constraint=c,
    )
    with pytest.raises(ConstraintFailed, match="output token 1 refused: .* not allowed"):
        _run(llm, [req])


def test_after_thinking_needs_a_think_token(info):
    smol = TokenizerInfo.from_artifact(Artifact(demo_artifact_path()))  # SmolLM2: no </think>
    with pytest.raises(ConstraintError, match="</think>"):
        compile_constraint(Regex("a+"), smol).after_thinking()
    assert compile_constraint(Regex("a+"), info).after_thinking().thinking
