"""The Responses Item normaliser: canonical input Items and their lowering to template
messages, checked against the real chat template and the tiny agent's scripted prompts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ninfer.api.responses.history import items_to_messages
from ninfer.api.responses.items import parse_input
from ninfer.api.responses.tools import ToolSet, parse_tools
from ninfer.api.service.generation import CachePoint
from ninfer.api.service.template import TEMPLATES_DIR, ChatTemplate
from ninfer.api.service.template_options import TemplateOptions
from ninfer.api.wire.errors import ApiError
from tests.conftest import TINY_AGENT_PROMPTS

PROMPTS = {p["name"]: p for p in json.loads(TINY_AGENT_PROMPTS.read_text())["prompts"]}


def reject(value: Any, *, vision: bool = False) -> ApiError:
    with pytest.raises(ApiError) as e:
        parse_input(value, "input", vision=vision)
    return e.value


NO_TOOLS = ToolSet()


def lower(items: list[dict[str, Any]], tools: ToolSet = NO_TOOLS, **kw: Any):
    return items_to_messages(parse_input(items, "input", vision=False), tools, **kw)


def lower_reject(items: list[dict[str, Any]]) -> ApiError:
    with pytest.raises(ApiError) as e:
        lower(items)
    return e.value


def call(cid: str, name: str = "f", args: str = "{}", **kw: Any) -> dict[str, Any]:
    return {"type": "function_call", "call_id": cid, "name": name, "arguments": args, **kw}


def result(cid: str, output: Any = "ok", **kw: Any) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": cid, "output": output, **kw}


def test_string_input_is_one_user_message():
    (item,) = parse_input("Hello", "input", vision=False)
    assert item["type"] == "message" and item["role"] == "user" and item["id"].startswith("msg_")
    assert item["content"] == [{"type": "input_text", "text": "Hello"}]


def test_ids_are_kept_or_generated_and_duplicates_fail():
    items = parse_input(
        [{"role": "user", "content": "a", "id": "msg_mine"}, call("c1"), result("c1"),
         {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "r"}], "summary": []}],
        "input", vision=False,
    )  # fmt: skip
    assert [i["id"][:3] for i in items] == ["msg", "fc_", "fco", "rs_"] and items[0][
        "id"
    ] == "msg_mine"
    assert len({i["id"] for i in items}) == 4
    e = reject([{"role": "user", "content": "a", "id": "x"}, call("c", id="x")])
    assert (e.code, e.param) == ("duplicate_item_id", "input[1].id")


def test_assistant_string_content_becomes_output_text():
    (item,) = parse_input(
        [{"role": "assistant", "content": "hi", "status": "completed", "phase": "final_answer"}],
        "input",
        vision=False,
    )
    assert item["content"] == [{"type": "output_text", "text": "hi", "annotations": []}]
    assert item["status"] == "completed" and item["phase"] == "final_answer"


@pytest.mark.parametrize(
    "value, code, param",
    [
        ([{"type": "input_file", "file_id": "f"}], "unsupported_value", "input[0].type"),
        ([{"type": "item_reference", "id": "x"}], "unsupported_value", "input[0].type"),
        ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], "unsupported_value", "input[0].content[0].type"),
        ([{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}], "unsupported_parameter", "input[0].content[0].file_id"),
        ([{"role": "user", "content": [{"type": "input_image", "image_url": "data:,x", "detail": "high"}]}], "unsupported_value", "input[0].content[0].detail"),
        ([{"role": "user", "content": [{"type": "input_image", "image_url": "data:,x"}]}], "vision_disabled", "input[0].content[0]"),
        ([{"role": "user", "content": [{"type": "output_text", "text": "x"}]}], "invalid_value", "input[0].content[0].type"),
        ([{"role": "tool", "content": "x"}], "invalid_value", "input[0].role"),
        ([{"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]}], "unsupported_value", "input[0].content"),
        ([{"type": "reasoning", "encrypted_content": "abc", "summary": []}], "unsupported_value", "input[0].content"),
        ([{"type": "reasoning", "content": [], "summary": [{"type": "summary_text", "text": "s"}]}], "unsupported_value", "input[0].content"),
        ([{"type": "reasoning", "content": [], "encrypted_content": "abc"}], "unsupported_value", "input[0].content"),
        ([call("c", status="in_progress")], "unsupported_value", "input[0].status"),
        ([call("c", args="[1]")], "invalid_value", "input[0].arguments"),
        ([call("c", args={"a": 1})], "invalid_type", "input[0].arguments"),
        ([result("c", output=[])], "invalid_value", "input[0].output"),
        ([result("c", output=[{"type": "input_file"}])], "unsupported_value", "input[0].output[0].type"),
        (42, "invalid_type", "input"),
    ],
)  # fmt: skip
def test_unsupported_and_malformed_items(value, code, param):
    e = reject(value)
    assert (e.status, e.code, e.param) == (400, code, param)


def test_media_with_vision_is_kept():
    (item,) = parse_input(
        [{"role": "user", "content": [{"type": "input_text", "text": "see "}, {"type": "input_image", "image_url": "https://x/a.png"}]}],
        "input", vision=True,
    )  # fmt: skip
    assert item["content"][1] == {
        "type": "input_image",
        "image_url": "https://x/a.png",
        "detail": "auto",
    }
    (msg,) = items_to_messages([item], ToolSet()).messages
    assert msg["content"] == [
        {"type": "text", "text": "see "},
        {"type": "image", "url": "https://x/a.png"},
    ]


def test_assistant_items_group_into_one_turn_and_results_reorder():
    p = lower(
        [
            {"role": "user", "content": "q"},
            {
                "type": "reasoning",
                "content": [
                    {"type": "reasoning_text", "text": "th"},
                    {"type": "reasoning_text", "text": "ink"},
                ],
            },
            {"role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "b"}]},
            call("c1", "f", '{"x": 1}'),
            call("c2", "g"),
            result("c2", "two"),
            result("c1", "one"),
            {"role": "user", "content": "next"},
        ],
        instructions="Be brief.",
    )
    assert p.messages == [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "ab", "reasoning_content": "think", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
        ]},
        {"role": "tool", "content": "one", "tool_call_id": "c1"},
        {"role": "tool", "content": "two", "tool_call_id": "c2"},
        {"role": "user", "content": "next"},
    ]  # fmt: skip


def test_reasoning_only_turn_is_kept():
    p = lower(
        [
            {"role": "user", "content": "q"},
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "r"}]},
        ]
    )
    assert p.messages[-1] == {"role": "assistant", "content": "", "reasoning_content": "r"}


@pytest.mark.parametrize(
    "items, param",
    [
        ([{"role": "assistant", "content": "a"}, {"type": "reasoning", "content": []}], "input[1]"),
        ([call("c"), {"role": "assistant", "content": "a"}], "input[1]"),
        ([call("c"), {"type": "reasoning", "content": []}], "input[1]"),
    ],
)
def test_assistant_content_that_needs_rearranging_fails(items, param):
    e = lower_reject(items)
    assert (e.code, e.param) == ("invalid_assistant_history", param)


@pytest.mark.parametrize(
    "items, param",
    [
        ([{"role": "user", "content": "q"}, result("nope")], "input[1]"),
        ([call("a"), call("b"), result("a")], "input[2]"),  # partial
        ([call("a"), result("a"), result("a")], "input[2]"),  # duplicate
        ([call("a"), call("a")], "input[1]"),
        (
            [call("a"), result("a"), {"role": "user", "content": "x"}, result("a")],
            "input[3]",
        ),  # not after its call
        # a call that no output answers (OpenAI: "No tool output found for function call")
        ([{"role": "user", "content": "q"}, call("a")], "input[1]"),
        ([call("a"), call("b")], "input[0]"),
        ([call("a"), {"role": "user", "content": "x"}, result("a")], "input[0]"),
        ([call("a"), result("a"), call("b"), {"role": "developer", "content": "x"}], "input[2]"),
        ([call("a", "f"), result("a", name="g")], "input[1].name"),
        ([call("a", "f", namespace="n"), result("a", namespace="m")], "input[1].namespace"),
    ],
)
def test_invalid_tool_history(items, param):
    e = lower_reject(items)
    assert (e.code, e.param) == ("invalid_tool_history", param)


def test_calls_without_any_output_are_refused():
    """OpenAI answers 400 "No tool output found for function call <call_id>." to a
    function_call that no function_call_output answers, wherever it is (it used to be
    rendered as an unanswered call); calls answered as the last Items stay valid."""
    e = lower_reject([{"role": "user", "content": "q"}, call("c1"), call("c2")])
    assert (e.status, e.type, e.code, e.param) == (
        400,
        "invalid_request_error",
        "invalid_tool_history",
        "input[1]",
    )
    assert e.message.startswith("No tool output found for function call 'c1', 'c2'")
    ok = lower(
        [{"role": "user", "content": "q"}, call("c1"), call("c2"), result("c2"), result("c1")]
    )
    assert [m["role"] for m in ok.messages] == ["user", "assistant", "tool", "tool"]
    # a stored chain that ends with calls is continued by their outputs, not by a new question
    chain = parse_input([{"role": "user", "content": "q"}, call("c1")], "input", vision=False)
    answer = parse_input([result("c1")], "input", vision=False)
    assert len(items_to_messages([*chain, *answer], ToolSet(), history=2).messages) == 3
    question = parse_input([{"role": "user", "content": "and?"}], "input", vision=False)
    with pytest.raises(ApiError) as info:
        items_to_messages([*chain, *question], ToolSet(), history=2)
    assert (info.value.code, info.value.param) == ("invalid_tool_history", "previous_response_id")
    assert "'c1'" in info.value.message


def test_history_errors_name_previous_response_id():
    items = parse_input([call("a"), {"role": "assistant", "content": "x"}], "input", vision=False)
    with pytest.raises(ApiError) as e:
        items_to_messages(items, ToolSet(), history=2)
    assert e.value.param == "previous_response_id"


def test_namespaced_calls_render_their_internal_name():
    tools = parse_tools({"tools": [
        {"type": "function", "name": "get"},
        {"type": "namespace", "name": "mcp__w", "description": "d", "tools": [{"type": "function", "name": "get"}]},
    ]})  # fmt: skip
    assert [f.internal for f in tools.functions] == ["get", "mcp__w__get"]
    p = items_to_messages(
        parse_input(
            [call("a", "get", namespace="mcp__w"), call("b", "get"), result("a"), result("b")],
            "input",
            vision=False,
        ),
        tools,
    )
    assert [c["function"]["name"] for c in p.messages[0]["tool_calls"]] == ["mcp__w__get", "get"]
    assert tools.public("mcp__w__get") == ("mcp__w", "get") and tools.public("get") == (None, "get")


def test_cache_points():
    bp = {"mode": "explicit"}
    msgs = [
        {
            "role": "user",
            "content": [{"type": "input_text", "text": str(i), "prompt_cache_breakpoint": bp}],
        }
        for i in range(6)
    ]
    # the latest four explicit markers, each at the end of its marked part
    assert lower(msgs).cache_points == tuple(CachePoint(message=i, offset=1) for i in (2, 3, 4, 5))
    two = lower(msgs[:2] + [{"role": "user", "content": "x"}]).cache_points
    assert [p.message for p in two] == [0, 1]
    assert lower([{"role": "user", "content": "x"}], instructions="i").cache_points == ()


@pytest.mark.parametrize(
    "name", ["weather_paris_result", "multi_oslo_result", "weather_two_result", "alarm_result"]
)
def test_lowered_items_render_the_scripted_prompt(name):
    """Items equivalent to a scripted chat conversation render byte-identical prompt text."""
    p = PROMPTS[name]
    items: list[dict[str, Any]] = []
    for m in p["messages"]:
        if m["role"] == "user":
            items.append({"role": "user", "content": m["content"]})
        elif m["role"] == "assistant":
            if m.get("reasoning_content"):
                items.append(
                    {
                        "type": "reasoning",
                        "content": [{"type": "reasoning_text", "text": m["reasoning_content"]}],
                        "summary": [],
                    }
                )
            if m["content"]:
                items.append({"role": "assistant", "content": m["content"]})
            for c in m.get("tool_calls", []):
                items.append(
                    call(c["id"], c["function"]["name"], json.dumps(c["function"]["arguments"]))
                )
        else:
            items.append(result(m["tool_call_id"], m["content"]))
    tools = parse_tools({"tools": [{"type": "function", **t["function"]} for t in p["tools"]]})
    lowered = items_to_messages(parse_input(items, "input", vision=False), tools)
    template = ChatTemplate(
        (TEMPLATES_DIR / "qwen_xml.jinja").read_text(),
        control_tokens=("<|im_start|>", "<|im_end|>"),
    )
    rendered = template.render(
        lowered.messages,
        tools=tools.template_tools(),
        options=TemplateOptions(enable_thinking=p["enable_thinking"]),
    )
    assert rendered.text == p["prompt"]
