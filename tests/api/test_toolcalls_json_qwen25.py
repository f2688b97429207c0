"""The real Qwen2.5-Coder-0.5B-Instruct (slow: run with --run-slow; skipped when its converted
artifact is not in ninfer's cache, e.g. before `ninfer models fetch qwen2.5-coder-0.5b`), served
with its own embedded chat template, which teaches Hermes JSON tool calls.

With tool_choice required (one call) the call grammar takes the template's JSON form and the
model fills in the arguments: a weather question becomes get_weather(city=Paris). With tool_choice auto the
model (greedy) does not use the `<tool_call>` tags its template asks for: it answers with a
```json code block holding {"name": "get_weather", "arguments": {"city": "Paris"}} (so does the
1.5B; vLLM's hermes parser does not read that either, see vllm-project/vllm#33083). ninfer
returns that text as content; the test says so (xfail, strict: it fails once a call comes back)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from ninfer.artifact.cache import cache_dir
from tests.api.live_app import live_url

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def oa() -> Iterator[openai.OpenAI]:
    found = sorted(cache_dir().glob("qwen2.5-coder-0.5b-instruct-*.ninfer"))
    if not found:
        pytest.skip(f"no qwen2.5-coder-0.5b-instruct-*.ninfer in {cache_dir()}")
    with live_url(found[-1], max_context=2048) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=900)


def _ask(oa: openai.OpenAI, tool_choice: str, **extra):
    return oa.chat.completions.create(
        model=oa.models.list().data[0].id,
        messages=[{"role": "user", "content": "What's the weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice=tool_choice,
        temperature=0,
        max_tokens=96,
        **extra,
    ).choices[0]


def _check_paris(choice) -> None:
    assert choice.finish_reason == "tool_calls", choice.message
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert "paris" in json.loads(call.function.arguments)["city"].lower()


def test_required_weather_question_becomes_a_json_form_call(oa) -> None:
    # one call: with parallel calls allowed, greedy decoding goes on to London, Berlin, Madrid...
    _check_paris(_ask(oa, "required", parallel_tool_calls=False))


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="Qwen2.5-Coder-0.5B answers in a ```json code block, not in <tool_call> tags",
)
def test_auto_weather_question_becomes_a_tool_call(oa) -> None:
    choice = _ask(oa, "auto")
    assert '"get_weather"' in (choice.message.content or "") or choice.message.tool_calls
    _check_paris(choice)
