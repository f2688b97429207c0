"""The openai-agents SDK against `ninfer serve` on the trained tiny agent: its function tools are
declared `strict: true` (the SDK's default, with the schema the SDK derives from the Python
signature) and ninfer enforces them by constrained decoding, so every call the agent executes
has valid arguments. Skipped when the SDK is not installed.

The tiny agent was trained on a handful of exact prompts; the SDK's schemas (titles, all
properties required, additionalProperties false) are not among them, so its free text and
thinking drift. The run is made to end by the agent's own means rather than by the model's
prose: the first turn requires a tool (the SDK resets tool_choice after a call), the server
caps thinking (--default-thinking-budget), and the agent stops once the weather is fetched
(StopAtTools). The argument bounds below are enforced, not hoped for."""

from __future__ import annotations

import json
import re
from typing import Annotated

import pytest
from pydantic import Field

agents = pytest.importorskip("agents")

from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    StopAtTools,
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
    return server_factory(
        "--max-concurrency", "2", "--max-context", "2048", "--default-thinking-budget", "32"
    )


def test_two_tool_agent_with_strict_tools_runs_to_completion(server):
    set_tracing_disabled(True)  # no trace upload: all traffic stays on loopback
    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    agent = Agent(
        name="assistant",
        model=OpenAIResponsesModel(model=server.model, openai_client=client),
        # greedy (the fixture is scripted); the first turn must call a tool
        model_settings=ModelSettings(temperature=0, tool_choice="required", max_tokens=200),
        tools=[get_weather, set_alarm],
        tool_use_behavior=StopAtTools(stop_at_tool_names=["get_weather"]),
    )
    assert all(t.strict_json_schema for t in agent.tools)  # the SDK's default, sent as strict
    CALLS.clear()
    result = Runner.run_sync(
        agent, "What is the weather in Paris for the next 3 days?", max_turns=6
    )
    assert CALLS and CALLS[-1][0] == "get_weather"
    for name, args in CALLS:  # what the tools received: valid under their schemas
        if name == "get_weather":
            assert len(args["city"]) <= 20 and 1 <= args["days"] <= 7
        else:
            assert re.fullmatch(r"[0-2][0-9]:[0-5][0-9]", args["time"])
            assert isinstance(args["enabled"], bool)
    assert json.loads(result.final_output)["city"] == CALLS[-1][1]["city"]
