"""Anthropic Messages request normalisation and validation (no engine): what the parser turns
a wire body into, and every refusal with the field it names."""

from __future__ import annotations

from typing import Any

import pytest

from ninfer.api.anthropic.request import parse_messages_request
from ninfer.api.wire.errors import ApiError

DEFAULT_MAX = 512
WEATHER = {
    "name": "get_weather",
    "description": "Get the weather forecast for a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def parse(body: dict[str, Any], *, vision: bool = False, count_only: bool = False, **kw: Any):
    body = {"model": "claude-local", **body}
    body.setdefault("messages", [{"role": "user", "content": "Hi"}])
    return parse_messages_request(
        body, vision=vision, default_max_tokens=DEFAULT_MAX, count_only=count_only, **kw
    )


def refused(body: dict[str, Any], code: str, param: str | None = None, **kw: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(body, **kw)
    err = info.value
    assert err.status == 400 and err.code == code, repr(err)
    if param is not None:
        assert err.param == param, repr(err)
    return err


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def text(t: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": t, **extra}


def tool_use(
    call_id: str, name: str = "get_weather", args: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": call_id,
        "name": name,
        "input": args if args is not None else {"city": "Paris"},
    }


def result(call_id: str, content: Any = "sunny", **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": content, **extra}


EPHEMERAL = {"type": "ephemeral"}


# -- conversation lowering ----------------------------------------------------------------------


def test_minimal_request_defaults():
    req = parse({})
    assert req.model == "claude-local"
    assert req.messages == ({"role": "user", "content": "Hi"},)
    assert req.max_tokens == DEFAULT_MAX and not req.stream and not req.prefill
    gen = req.generation_request()
    # omitted: the service applies --default-max-tokens (logged as not requested)
    assert gen.protocol == "anthropic" and gen.tools is None and gen.max_tokens is None
    assert parse({"max_tokens": 7}).generation_request().max_tokens == 7
    assert gen.thinking_budget is None and gen.cache_points == () and not gen.continue_final_message


def test_system_string_blocks_and_inline_system_keep_positions():
    req = parse(
        {
            "system": [text("Be "), text("brief.")],
            "messages": [
                user("a"),
                {"role": "system", "content": "mid"},
                assistant("b"),
                user("c"),
            ],
        }
    )
    assert [m["role"] for m in req.messages] == ["system", "user", "system", "assistant", "user"]
    assert req.messages[0]["content"] == "Be brief."
    assert req.messages[2]["content"] == "mid"


def test_billing_header_block_is_consumed_only_in_first_position():
    header = "x-anthropic-billing-header: cc_version=1.0; cch=abc"
    req = parse({"system": [text(header, cache_control=EPHEMERAL), text("Real system.")]})
    assert req.messages[0] == {"role": "system", "content": "Real system."}
    assert req.cache_points == ()  # its marker went with it
    later = parse({"system": [text("Real. "), text(header)]})
    assert later.messages[0]["content"] == "Real. " + header
    as_string = parse({"system": header})
    assert as_string.messages[0]["content"] == header
    inline = parse({"messages": [{"role": "system", "content": [text(header)]}, user("Hi")]})
    assert inline.messages[0]["content"] == header
    only = parse({"system": [text(header)]})
    assert [m["role"] for m in only.messages] == ["user"]


def test_consecutive_turns_join_without_separators():
    req = parse(
        {
            "messages": [
                user("a"),
                user([text("b"), text("c")]),
                assistant("x"),
                assistant("y"),
                user("z"),
            ]
        }
    )
    assert req.messages == (
        {"role": "user", "content": "abc"},
        {"role": "assistant", "content": "xy"},
        {"role": "user", "content": "z"},
    )


def test_thinking_history_signature_ignored_and_tool_calls_keep_member_order():
    turn = assistant(
        [
            {"type": "thinking", "thinking": "Need weather.", "signature": "anything-at-all"},
            text("Checking."),
            tool_use("toolu_1", args={"days": 3, "city": "Paris"}),
        ]
    )
    req = parse(
        {"tools": [WEATHER], "messages": [user("Weather?"), turn, user([result("toolu_1")])]}
    )
    a = req.messages[1]
    assert a["reasoning_content"] == "Need weather." and a["content"] == "Checking."
    args = a["tool_calls"][0]["function"]["arguments"]
    assert list(args) == ["days", "city"]
    assert a["tool_calls"][0]["id"] == "toolu_1"
    same = parse(
        {"tools": [WEATHER], "messages": [user("Weather?"), turn, user([result("toolu_1")])]}
    )
    turn["content"][0]["signature"] = "different"
    other = parse(
        {"tools": [WEATHER], "messages": [user("Weather?"), turn, user([result("toolu_1")])]}
    )
    assert same.messages == other.messages


def test_tool_results_matched_by_id_in_call_order_with_is_error_and_trailing_text():
    req = parse(
        {
            "tools": [WEATHER],
            "messages": [
                user("Two cities"),
                assistant([tool_use("t_a"), tool_use("t_b", args={"city": "Rome"})]),
                user(
                    [
                        result("t_b", [text("rain")], is_error=True),
                        result("t_a", "sun"),
                        text("Summarise."),
                    ]
                ),
            ],
        }
    )
    assert req.messages[2:] == (
        {"role": "tool", "tool_call_id": "t_a", "content": "sun"},
        {"role": "tool", "tool_call_id": "t_b", "content": "Error: rain"},
        {"role": "user", "content": "Summarise."},
    )


def test_history_may_begin_with_results():
    req = parse({"messages": [user([result("old")]), assistant("ok"), user("next")]})
    assert req.messages[0] == {"role": "tool", "tool_call_id": "old", "content": "sunny"}


@pytest.mark.parametrize(
    "messages",
    [
        [
            user("q"),
            assistant([tool_use("t1"), tool_use("t2")]),
            user([result("t1")]),
        ],  # missing t2
        [user("q"), assistant([tool_use("t1")]), user([result("t1"), result("t1")])],  # duplicate
        [
            user("q"),
            assistant([tool_use("t1")]),
            user([result("t9")]),
        ],  # unknown id... and t1 missing
        [
            user("q"),
            assistant([tool_use("t1")]),
            user([result("t1"), result("t2")]),
        ],  # unknown extra
        [user("q"), assistant([tool_use("t1")]), user("no results")],
        [user("q"), assistant("plain"), user([result("t1")])],  # nothing to answer
        [
            user("q"),
            assistant([tool_use("t1")]),
            user([text("first"), result("t1")]),
        ],  # not leading
    ],
)
def test_tool_result_pairing_errors(messages):
    refused({"tools": [WEATHER], "messages": messages}, "invalid_value")


def test_assistant_prefill_is_continued():
    req = parse(
        {"messages": [user("Capital of France?"), assistant([text("The capital"), text(" is")])]}
    )
    assert req.prefill and req.generation_request().continue_final_message
    assert req.messages[-1] == {"role": "assistant", "content": "The capital is"}
    dropped = parse({"messages": [user("Hi"), assistant("")]})
    assert not dropped.prefill and dropped.messages == ({"role": "user", "content": "Hi"},)


@pytest.mark.parametrize("tail", [" ", "\n", " \n\n", "\t"])
def test_a_prefill_ending_in_whitespace_is_refused(tail):
    """The templates trim message text, so the prompt could not end with the prefill's bytes
    (Anthropic's API refuses these too)."""
    err = refused(
        {"messages": [user("Capital of France?"), assistant([text("The capital" + tail)])]},
        "invalid_value",
        "messages[1].content",
    )
    assert "trailing whitespace" in err.message
    # leading whitespace and whitespace inside stay
    assert parse({"messages": [user("q"), assistant(" The  capital")]}).prefill


@pytest.mark.parametrize("empty", ["", []])
def test_only_a_final_assistant_message_may_be_empty(empty):
    err = refused({"messages": [user(empty)]}, "invalid_value", "messages[0].content")
    assert "non-empty" in err.message
    refused(
        {"messages": [user("q"), assistant(empty), user("again")]},
        "invalid_value",
        "messages[1].content",
    )
    assert parse({"messages": [user("q"), assistant(empty)]}).messages == (
        {"role": "user", "content": "q"},
    )


def test_a_result_for_an_unknown_call_is_named():
    err = refused(
        {
            "tools": [WEATHER],
            "messages": [
                user("q"),
                assistant([tool_use("toolu_1")]),
                user([{"type": "tool_result", "tool_use_id": "toolu_2", "content": "r"}]),
            ],
        },
        "invalid_value",
    )
    assert "unknown tool_use id(s) toolu_2" in err.message and "called toolu_1" in err.message


@pytest.mark.parametrize(
    "final, param",
    [
        (
            [{"type": "thinking", "thinking": "x", "signature": "s"}, text("a")],
            "messages[1].content[0].type",
        ),
        ([text("a"), tool_use("t1")], "messages[1].content[1].type"),
    ],
)
def test_prefill_cannot_hold_thinking_or_tool_calls(final, param):
    refused(
        {"tools": [WEATHER], "messages": [user("q"), assistant(final)]}, "unsupported_value", param
    )


@pytest.mark.parametrize("mode", [{"type": "enabled", "budget_tokens": 1024}, {"type": "adaptive"}])
def test_prefill_cannot_start_with_thinking_enabled(mode):
    refused(
        {"max_tokens": 2048, "thinking": mode, "messages": [user("q"), assistant("The")]},
        "unsupported_value",
        "thinking.type",
    )


def test_images_need_vision_and_keep_their_position():
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    err = refused(
        {"messages": [user([text("See "), image])]}, "vision_disabled", "messages[0].content[1]"
    )
    assert "--vision" in err.message
    req = parse({"messages": [user([text("See "), image, text("?")])]}, vision=True)
    assert req.has_media
    assert req.messages[0]["content"] == [
        {"type": "text", "text": "See "},
        {
            "type": "image",
            "url": "data:image/png;base64,iVBORw0KGgo=",
            "param": "messages[0].content[1].source",
        },
        {"type": "text", "text": "?"},
    ]
    refused(
        {"messages": [user([{"type": "image", "source": {"type": "file", "file_id": "f1"}}])]},
        "unsupported_value",
        "messages[0].content[0].source.type",
        vision=True,
    )
    # count_tokens shares the media rule
    refused({"messages": [user([image])]}, "vision_disabled", count_only=True)


# -- malformed input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, code, param",
    [
        ({"messages": []}, "invalid_value", "messages"),
        ({"messages": "hi"}, "invalid_type", "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "invalid_value", "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "missing_required_parameter", "messages[0].content"),
        (
            {"messages": [user([{"type": "text"}])]},
            "missing_required_parameter",
            "messages[0].content[0].text",
        ),
        ({"messages": [user([{"type": "video"}])]}, "invalid_value", "messages[0].content[0].type"),
        ({"system": [{"type": "image"}]}, "invalid_value", "system[0].type"),
        ({"system": 5}, "invalid_type", "system"),
        (
            {
                "messages": [
                    user("q"),
                    assistant([tool_use("t1", args=None) | {"input": "x"}]),
                    user("r"),
                ]
            },
            "invalid_type",
            "messages[1].content[0].input",
        ),
    ],
)
def test_malformed(body, code, param):
    refused(body, code, param)
