"""Hermes JSON tool calls end to end: the real server on a tiny random model served with a
Hermes-format chat template (Qwen2.5's form), driven by the official openai client. Constrained
decoding (tool_choice required / named, strict tools) makes even random weights emit calls, in the
JSON form the template teaches; they come back as structured tool_calls with valid arguments."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from ninfer.api.observability.request_log import RequestLog
from ninfer.api.observability.wiring import Observability
from ninfer.api.server.app import create_app
from ninfer.artifact import Artifact
from ninfer.commands import serve
from tests.api.live_app import serve_config, uvicorn_url
from tests.api.test_toolcalls_json import HERMES_TEMPLATE

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 12}},
                "required": ["city"],
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def served(fixture_artifacts, tmp_path_factory) -> Iterator[tuple[openai.OpenAI, Path, Any]]:
    """(client, request log path, tokenizer) of the real server on the tiny qwen3 fixture with
    the Hermes template (`--chat-template`) and a request log, behind uvicorn on loopback."""
    root = Path(tmp_path_factory.mktemp("hermes"))
    template = root / "hermes.jinja"
    template.write_text(HERMES_TEMPLATE, encoding="utf-8")
    log_path = root / "requests.jsonl"
    artifact = Artifact(fixture_artifacts("qwen3"))
    config = serve_config(artifact=str(artifact.path), chat_template=str(template),
                          max_context=2048, log_stats_interval_ms=0)  # fmt: skip
    state = serve.build_state(config, artifact)
    obs = Observability.start(state, artifact, request_log=RequestLog.open(log_path, artifact.path))
    try:
        with uvicorn_url(create_app(state)) as url:
            oa = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
            yield oa, log_path, state.tokenizer
    finally:
        obs.close()
        state.engine.close()


@pytest.fixture(scope="module")
def oa(served) -> openai.OpenAI:
    return served[0]


def raw_outputs(served, at_least: int = 1) -> list[tuple[str, dict]]:
    """(generated text, tool_call_parse) of every finished request so far, from the log (waiting
    up to 10 s for `at_least` of them: the record may land just after the response)."""
    _, path, tokenizer = served
    deadline = time.monotonic() + 10
    while True:
        lines = path.read_text(encoding="utf-8").splitlines()
        records = [r for r in map(json.loads, lines) if r["event"] == "request_done"]
        if len(records) >= at_least or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return [
        (tokenizer.decode(r["result"]["generated_token_ids"], skip_special_tokens=False),
         r["result"]["tool_call_parse"])
        for r in records
    ]  # fmt: skip


def _request(**extra) -> dict:
    return {
        "model": "tiny-qwen3",
        "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
        "tools": TOOLS,
        "max_tokens": 120,
        "temperature": 1.0,
        "seed": 3,
        **extra,
    }


def _check_calls(calls, names) -> None:
    assert calls, "no tool call came back"
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        assert c.function.name in names
        args = json.loads(c.function.arguments)  # valid JSON, compact as OpenAI's
        jsonschema.validate(args, SCHEMAS[c.function.name])
        assert c.function.arguments == json.dumps(args, ensure_ascii=False, separators=(",", ":"))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_required_tool_choice_returns_structured_calls(served, oa, seed) -> None:
    before = len(raw_outputs(served, 0))
    r = oa.chat.completions.create(**_request(tool_choice="required", seed=seed))
    choice = r.choices[0]
    # the model wrote the template's JSON form (not Qwen XML), and the JSON parser read it
    text, parse = raw_outputs(served, before + 1)[-1]
    assert '<tool_call>\n{"name": "' in text and "<function=" not in text, text
    assert parse["fallback_reason"] == "none" and parse["calls"] == len(choice.message.tool_calls)
    assert choice.finish_reason == "tool_calls"
    # at most the blank line the forced-call grammar allows before the first call
    assert not (choice.message.content or "").strip()
    _check_calls(choice.message.tool_calls, set(SCHEMAS))


def test_named_tool_choice_streamed(oa) -> None:
    stream = oa.chat.completions.create(
        **_request(
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            parallel_tool_calls=False,
            stream=True,
        )
    )
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        assert not (delta.content or "").strip()
        for tc in delta.tool_calls or ():
            entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            if tc.function and tc.function.name:
                entry["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                entry["arguments"] += tc.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0]
    assert calls[0]["name"] == "get_time"
    jsonschema.validate(json.loads(calls[0]["arguments"]), SCHEMAS["get_time"])


def test_history_with_json_calls_renders_and_continues(oa) -> None:
    """A conversation whose assistant turn holds a call (rendered by the template in JSON) and
    its tool result is accepted; the forced reply is again a structured call."""
    messages = [
        {"role": "user", "content": "Weather in Oslo, then Rome?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Oslo", "unit": "celsius"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "3 C, snow"},
    ]
    r = oa.chat.completions.create(**_request(messages=messages, tool_choice="required"))
    _check_calls(r.choices[0].message.tool_calls, set(SCHEMAS))
