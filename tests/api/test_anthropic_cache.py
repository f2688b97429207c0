"""Anthropic cache_control (no engine): block-level and request-level breakpoints, the
four-breakpoint limit, and where each marked block ends (`CachePoint`). Where those ends land
in real prompts: tests/api/test_cache_point_positions.py."""

from __future__ import annotations

from ninfer.api.service.generation import CachePoint
from tests.api.test_anthropic_request import (
    EPHEMERAL,
    WEATHER,
    assistant,
    parse,
    refused,
    result,
    text,
    tool_use,
    user,
)

# -- cache_control ------------------------------------------------------------------------------


def at(message: int, offset: int) -> CachePoint:
    return CachePoint(message=message, offset=offset)


def test_block_breakpoints_map_to_block_ends():
    req = parse(
        {
            "tools": [{**WEATHER, "cache_control": EPHEMERAL}],
            "system": [text("S", cache_control={"type": "ephemeral", "ttl": "1h"})],
            "messages": [
                user([text("a", cache_control=EPHEMERAL), text("b")]),  # inside the message
                assistant("ok"),
                user([text("c", cache_control=EPHEMERAL)]),
            ],
        }
    )
    # the tool, system "S" (0), "a" of user "ab" (1), user "c" (3)
    assert req.cache_points == (CachePoint(tool=0), at(0, 1), at(1, 1), at(3, 1))


def test_tool_result_breakpoint_ends_its_tool_message():
    req = parse(
        {
            "messages": [
                user("q"),
                assistant([tool_use("t1")]),
                user([result("t1", [text("r", cache_control=EPHEMERAL)]), text("go")]),
            ]
        }
    )
    assert req.cache_points == (at(2, 1),)


def test_tool_use_and_error_result_breakpoints():
    req = parse(
        {
            "messages": [
                user("q"),
                assistant(
                    [text("hm"), {**tool_use("t1"), "cache_control": EPHEMERAL}, tool_use("t2")]
                ),
                user(
                    [
                        result("t1", "bad", is_error=True, cache_control=EPHEMERAL),
                        result("t2", "ok"),
                    ]
                ),
            ]
        }
    )
    # the first call of message 1; the whole error result "Error: bad" (message 2)
    assert req.cache_points == (CachePoint(message=1, tool_call=0), at(2, len("Error: bad")))


def test_more_than_four_breakpoints_refused():
    blocks = [
        user([text(str(i), cache_control=EPHEMERAL)]) if i % 2 == 0 else assistant(str(i))
        for i in range(9)
    ]
    refused({"messages": blocks}, "invalid_value", "cache_control")
    ok = parse({"messages": blocks[:7]})
    assert ok.cache_points == tuple(at(i, 1) for i in (0, 2, 4, 6))


def test_request_level_cache_control_merge_conflict_and_slots():
    four = [
        user([text(str(i), cache_control=EPHEMERAL)]) if i % 2 == 0 else assistant(str(i))
        for i in range(7)
    ]
    # merges with the explicit breakpoint on the last block (same TTL)
    merged = parse({"messages": four, "cache_control": EPHEMERAL}).cache_points
    assert merged == tuple(at(i, 1) for i in (0, 2, 4, 6))
    # conflicts at the same target with another TTL
    refused(
        {"messages": four, "cache_control": {"type": "ephemeral", "ttl": "1h"}},
        "invalid_value",
        "cache_control",
    )
    # needs a fifth slot when four other targets are taken
    five = [*four, assistant("x"), user("last")]
    refused({"messages": five, "cache_control": EPHEMERAL}, "invalid_value", "cache_control")
    # otherwise it marks the last cacheable block
    req = parse({"messages": [user("a"), assistant("b"), user("c")], "cache_control": EPHEMERAL})
    assert req.cache_points == (at(2, 1),)


def test_cache_control_ttl_and_type_validation():
    refused(
        {"messages": [user([text("a", cache_control={"type": "ephemeral", "ttl": "10m"})])]},
        "invalid_value",
        "messages[0].content[0].cache_control.ttl",
    )
    refused(
        {"messages": [user([text("a", cache_control={"type": "persistent"})])]},
        "invalid_value",
        "messages[0].content[0].cache_control.type",
    )
    refused(
        {"cache_control": {"type": "ephemeral", "ttl": "2h"}}, "invalid_value", "cache_control.ttl"
    )
    refused(
        {
            "messages": [
                user("q"),
                assistant(
                    [
                        {
                            "type": "thinking",
                            "thinking": "t",
                            "signature": "",
                            "cache_control": EPHEMERAL,
                        },
                        text("a"),
                    ]
                ),
                user("b"),
            ]
        },
        "invalid_value",
        "messages[1].content[0].cache_control",
    )
