"""The scripted conversations the tiny agent model is trained on (see artifacts/train_tiny.py).

Each `Example` is one assistant turn to produce: the conversation so far (`messages`, OpenAI
chat format with `reasoning_content` on assistant turns), the tools offered, the thinking mode,
and the scripted `reply` (an assistant message). Rendering both with the chat template gives the
prompt text and the reply text the model must reproduce under greedy decoding.

The set covers: plain answers with and without thinking, `<think>` reasoning before an answer
or a tool call, Qwen XML tool calls with string, integer, number, boolean and object/array
parameters, two calls in one turn, content before a call, tool results followed by an answer,
multi-turn history, a system prompt, and non-ASCII text (accents, CJK, emoji), and the turns
of an openai-agents SDK agent run with the SDK's defaults (`SDK_TOOLS`: the schemas the SDK
derives for its strict function tools, as the server hands them to the template).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]


def _tool(
    name: str, description: str, props: dict[str, tuple[str, str]], required: list[str]
) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": t, "description": d} for p, (t, d) in props.items()},
                "required": required,
            },
        },
    }


WEATHER = _tool("get_weather", "Get the weather forecast for a city.",
                {"city": ("string", "City name"), "days": ("integer", "Number of days")}, ["city"])  # fmt: skip
ADD = _tool(
    "add", "Add two numbers.", {"a": ("number", "First"), "b": ("number", "Second")}, ["a", "b"]
)
ALARM = _tool("set_alarm", "Set or clear an alarm.",
              {"time": ("string", "HH:MM"), "enabled": ("boolean", "On or off")}, ["time"])  # fmt: skip
SEARCH = _tool("search", "Search the web.",
               {"query": ("string", "Search text"), "filters": ("object", "Optional filters")}, ["query"])  # fmt: skip


def _sdk_tool(name: str, description: str, props: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A function tool as the openai-agents SDK declares it with its default `strict: true`
    (every property required, pydantic titles, no additional properties), in the chat form the
    server passes to the template (tests/e2e/test_openai_agents_e2e.py defines the functions)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "properties": props,
                "required": list(props),
                "title": f"{name}_args",
                "type": "object",
                "additionalProperties": False,
            },
        },
    }


SDK_TOOLS = [
    _sdk_tool("get_weather", "Get the weather forecast for a city.", {
        "city": {"description": "City name", "maxLength": 20, "title": "City", "type": "string"},
        "days": {"description": "Number of days", "maximum": 7, "minimum": 1, "title": "Days",
                 "type": "integer"},
    }),
    _sdk_tool("set_alarm", "Set or clear an alarm.", {
        "time": {"description": "HH:MM", "pattern": "^[0-2][0-9]:[0-5][0-9]$", "title": "Time",
                 "type": "string"},
        "enabled": {"description": "On or off", "title": "Enabled", "type": "boolean"},
    }),
]  # fmt: skip


@dataclass(frozen=True)
class Example:
    name: str
    messages: list[Message]
    reply: Message
    tools: list[dict[str, Any]] = field(default_factory=list)
    enable_thinking: bool = True


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def answer(content: str, reasoning: str | None = None) -> Message:
    m: Message = {"role": "assistant", "content": content}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    return m


def calls(
    *fns: tuple[str, dict[str, Any]], reasoning: str | None = None, content: str = ""
) -> Message:
    m = answer(content, reasoning)
    m["tool_calls"] = [
        {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": args}}
        for i, (n, args) in enumerate(fns)
    ]
    return m


def result(text: str, call_id: str = "call_0") -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def examples() -> list[Example]:
    """The scripted turns, in a fixed order."""
    ex: list[Example] = []

    def add(
        name: str, messages: list[Message], reply: Message, tools=(), thinking: bool = True
    ) -> None:
        ex.append(Example(name, list(messages), reply, list(tools), thinking))

    # -- plain answers, thinking off ------------------------------------------------------
    add("hello", [user("Hi!")], answer("Hello! How can I help you today?"), thinking=False)
    add(
        "capital",
        [user("What is the capital of France?")],
        answer("The capital of France is Paris."),
        thinking=False,
    )
    add(
        "greetings",
        [user("Say hello in Chinese and Japanese.")],
        answer("你好！こんにちは！🙂"),
        thinking=False,
    )
    add("cafe", [user("Spell café.")], answer("c-a-f-é: café."), thinking=False)
    add(
        "pirate",
        [{"role": "system", "content": "You are a pirate."}, user("Hello")],
        answer("Ahoy, matey! 🏴‍☠️"),
        thinking=False,
    )

    # -- plain answers, thinking on -------------------------------------------------------
    add(
        "sum_think",
        [user("What is 2 plus 3?")],
        answer("2 plus 3 is 5.", "The user asks for 2 plus 3. 2 + 3 = 5."),
    )
    add("tomato", [user("Is a tomato a fruit?")],
        answer("Yes, a tomato is a fruit.", "A tomato has seeds, so botanically it is a fruit."))  # fmt: skip
    add(
        "color",
        [user("Name a primary color.")],
        answer("Red.", "Red, blue and yellow are primary colors. I pick red."),
    )
    add("count", [user("Count from 1 to 10.")],
        answer("1 2 3 4 5 6 7 8 9 10", "I will count one number at a time: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10. "
               "That makes ten numbers, so the list is complete."))  # fmt: skip

    # -- one tool call, thinking on -------------------------------------------------------
    paris = [user("What is the weather in Paris for the next 3 days?")]
    paris_call = calls(("get_weather", {"city": "Paris", "days": 3}),
                       reasoning="The user wants a 3 day forecast for Paris. I will call get_weather.")  # fmt: skip
    add("weather_paris", paris, paris_call, [WEATHER])
    tokyo = [user("Will it rain in Tokyo tomorrow?")]
    add("weather_tokyo", tokyo,
        calls(("get_weather", {"city": "Tokyo", "days": 1}), reasoning="I need the forecast for Tokyo for 1 day."),
        [WEATHER, ALARM])  # fmt: skip
    sum_q = [user("What is 2.5 plus 4?")]
    sum_call = calls(
        ("add", {"a": 2.5, "b": 4}), reasoning="I will use the add tool with 2.5 and 4."
    )
    add("add_numbers", sum_q, sum_call, [ADD])
    wake = [user("Wake me up at 07:30.")]
    wake_call = calls(
        ("set_alarm", {"time": "07:30", "enabled": True}),
        reasoning="The user wants an alarm at 07:30.",
    )
    add("alarm_on", wake, wake_call, [ALARM])
    add("alarm_off", [user("Turn off my 06:00 alarm.")],
        calls(("set_alarm", {"time": "06:00", "enabled": False}), reasoning="Disable the 06:00 alarm."), [ALARM])  # fmt: skip
    rome = [user("Find direct flights to Rome under 300 euros.")]
    rome_call = calls(("search", {"query": "flights to Rome", "filters": {"max_price": 300, "tags": ["direct"]}}),
                      reasoning="Search with a price limit and the direct tag.")  # fmt: skip
    add("search_flights", rome, rome_call, [SEARCH])

    # -- tool calls, thinking off ---------------------------------------------------------
    add(
        "weather_berlin",
        [user("Weather in Berlin?")],
        calls(("get_weather", {"city": "Berlin"})),
        [WEATHER],
        False,
    )
    add("add_plain", [user("Add 10 and 32.")], calls(("add", {"a": 10, "b": 32})), [ADD], False)

    # -- two calls in one turn; content before a call --------------------------------------
    two = [user("Compare the weather in Paris and London today.")]
    two_call = calls(("get_weather", {"city": "Paris", "days": 1}), ("get_weather", {"city": "London", "days": 1}),
                     reasoning="I need two forecasts, one for Paris and one for London.")  # fmt: skip
    add("weather_two", two, two_call, [WEATHER])
    add("alarm_and_weather", [user("Set an alarm at 06:45 and tell me the weather in Madrid.")],
        calls(("set_alarm", {"time": "06:45", "enabled": True}), ("get_weather", {"city": "Madrid", "days": 1})),
        [ALARM, WEATHER], False)  # fmt: skip
    add("search_recipes", [user("Search for vegan recipes.")],
        calls(("search", {"query": "vegan recipes", "filters": {"tags": ["vegan"]}}),
              reasoning="A web search will find recipes.", content="Let me search for that."), [SEARCH])  # fmt: skip

    # -- tool results followed by an answer -----------------------------------------------
    add("weather_paris_result", paris + [paris_call, result('{"forecast": ["sunny", "cloudy", "rain"]}')],
        answer("Paris: sunny today, cloudy tomorrow, then rain.", "The forecast is sunny, cloudy, rain."), [WEATHER])  # fmt: skip
    add("add_result", sum_q + [sum_call, result('{"result": 6.5}')],
        answer("2.5 plus 4 is 6.5.", "The tool says the sum is 6.5."), [ADD])  # fmt: skip
    add("weather_two_result",
        two + [two_call, result('{"temp": 22, "sky": "sunny"}'), result('{"temp": 15, "sky": "rain"}', "call_1")],
        answer("Paris is sunny and 22°C; London is rainy and 15°C.", "Paris 22 and sunny, London 15 with rain."),
        [WEATHER])  # fmt: skip
    add("alarm_result", wake + [calls(("set_alarm", {"time": "07:30", "enabled": True})), result('{"ok": true}')],
        answer("Your alarm is set for 07:30. ⏰"), [ALARM], False)  # fmt: skip
    add("search_result", rome + [rome_call, result('{"results": [{"airline": "ITA", "price": 250}]}')],
        answer("I found a direct ITA flight to Rome for 250 euros.", "One result: ITA at 250 euros."), [SEARCH])  # fmt: skip

    # -- multi-turn ---------------------------------------------------------------------
    oslo = [
        user("Hi!"),
        answer("Hello! How can I help you today?"),
        user("What is the weather in Oslo?"),
    ]
    oslo_call = calls(
        ("get_weather", {"city": "Oslo"}), reasoning="The user asks about Oslo. Call get_weather."
    )
    add("multi_oslo", oslo, oslo_call, [WEATHER])
    oslo_done = oslo + [oslo_call, result('{"temp": -2, "sky": "snow"}')]
    oslo_answer = answer("It is snowing in Oslo, -2°C. ❄️", "Snow and -2 degrees in Oslo.")
    add("multi_oslo_result", oslo_done, oslo_answer, [WEATHER])
    add("multi_rome", oslo_done + [oslo_answer, user("And in Rome?")],
        calls(("get_weather", {"city": "Rome"}), reasoning="Now the user wants Rome."), [WEATHER])  # fmt: skip
    add("multi_name", [user("My name is Ada."), answer("Nice to meet you, Ada!"), user("What is my name?")],
        answer("Your name is Ada.", "The user told me their name is Ada."))  # fmt: skip
    # -- an openai-agents SDK agent with its defaults (Responses, strict tools, thinking on) ------
    sdk_paris = calls(("get_weather", {"city": "Paris", "days": 3}),
                      reasoning="The user wants a 3 day forecast for Paris. I will call get_weather.")  # fmt: skip
    add("sdk_weather_paris", paris, sdk_paris, SDK_TOOLS)
    sdk_forecast = '{"city": "Paris", "forecast": ["sunny", "cloudy", "rain"]}'  # the tool's output
    add("sdk_weather_paris_result", paris + [sdk_paris, result(sdk_forecast)],
        answer("Paris: sunny today, cloudy tomorrow, then rain.", "The forecast is sunny, cloudy, rain."),
        SDK_TOOLS)  # fmt: skip
    add(
        "no_tool_needed",
        [user("Thanks!")],
        answer("You're welcome!", "The user thanks me. No tool is needed."),
        [WEATHER],
    )
    return ex
