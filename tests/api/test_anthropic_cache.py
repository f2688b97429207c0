"""Anthropic cache_control (no engine): block-level and request-level breakpoints, the
four-breakpoint limit, and their mapping to template message ends."""

from __future__ import annotations

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


def test_block_breakpoints_map_to_message_ends():
    req = parse(
        {
            "tools": [{**WEATHER, "cache_control": EPHEMERAL}],
            "system": [text("S", cache_control={"type": "ephemeral", "ttl": "1h"})],
            "messages": [
                user([text("a", cache_control=EPHEMERAL), text("b")]),  # not the end: ignored
                assistant("ok"),
                user([text("c", cache_control=EPHEMERAL)]),
            ],
        }
    )
    # system (0), user "ab" (1) no, assistant (2), user "c" (3)
    assert req.cache_points == (0, 3)


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
    assert req.cache_points == (2,)


def test_more_than_four_breakpoints_refused():
    blocks = [
        user([text(str(i), cache_control=EPHEMERAL)]) if i % 2 == 0 else assistant(str(i))
        for i in range(9)
    ]
    refused({"messages": blocks}, "invalid_value", "cache_control")
    ok = parse({"messages": blocks[:7]})
    assert ok.cache_points == (0, 2, 4, 6)


def test_request_level_cache_control_merge_conflict_and_slots():
    four = [
        user([text(str(i), cache_control=EPHEMERAL)]) if i % 2 == 0 else assistant(str(i))
        for i in range(7)
    ]
    # merges with the explicit breakpoint on the last block (same TTL)
    assert parse({"messages": four, "cache_control": EPHEMERAL}).cache_points == (0, 2, 4, 6)
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
    assert req.cache_points == (2,)


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
