"""The openai-agents SDK against `ninfer serve` on the trained tiny agent, with the SDK's and
the server's defaults: no model settings (no temperature, no tool_choice, no token limit), the
default tool-use behaviour (the tool's output goes back to the model, which answers), and a
server started with no sampling or thinking flags. The SDK declares its function tools
`strict: true` (its default, with the schemas it derives from the Python signatures: titles,
every property required, no additional properties) and ninfer enforces them by constrained
decoding. Skipped when the SDK is not installed.

The tiny agent is trained on the turns this run produces (artifacts/agent_corpus.py,
`SDK_TOOLS`): the tool call, then, after the tool's output, the answer. The server samples with
the artifact's recorded defaults (Qwen3's temperature 0.6, top_p 0.95, top_k 20), and the
fixture's training margin makes those defaults replay every scripted turn exactly
(artifacts/train_tiny.py, `replay_margin`), so the run is the scripted one, not a lucky draw."""

from __future__ import annotations

import json
from typing import Annotated

import pytest
from pydantic import Field

agents = pytest.importorskip("agents")

from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

CALLS: list[tuple[str, dict]] = []


@function_tool
def get_weather(
    city: Annotated[str, Field(max_length=20)], days: Annotated[int, Field(ge=1, le=7)]
) -> str:
    """Get the weather forecast for a city.

    Args:
        city: City name
        days: Number of days
    """
    CALLS.append(("get_weather", {"city": city, "days": days}))
    return json.dumps({"city": city, "forecast": ["sunny", "cloudy", "rain"][:days]})


@function_tool
def set_alarm(
    time: Annotated[str, Field(pattern=r"^[0-2][0-9]:[0-5][0-9]$")], enabled: bool
) -> str:
    """Set or clear an alarm.

    Args:
        time: HH:MM
        enabled: On or off
    """
    CALLS.append(("set_alarm", {"time": time, "enabled": enabled}))
    return json.dumps({"ok": True})


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory("--max-concurrency", "2", "--max-context", "2048")


def test_two_tool_agent_with_the_sdk_defaults_runs_to_completion(server):
    set_tracing_disabled(True)  # no trace upload: all traffic stays on loopback
    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    agent = Agent(
        name="assistant",
        model=OpenAIResponsesModel(model=server.model, openai_client=client),
        tools=[get_weather, set_alarm],
    )
    assert agent.model_settings == ModelSettings()  # nothing set: the SDK's defaults
    assert all(t.strict_json_schema for t in agent.tools)  # the SDK's default, sent as strict
    CALLS.clear()
    result = Runner.run_sync(agent, "What is the weather in Paris for the next 3 days?")
    assert CALLS == [("get_weather", {"city": "Paris", "days": 3})]
    assert result.final_output == "Paris: sunny today, cloudy tomorrow, then rain."
    kinds = [item.type for item in result.new_items]
    assert kinds.count("tool_call_item") == kinds.count("tool_call_output_item") == 1
    assert kinds[-1] == "message_output_item"  # the model answered after the tool's output
