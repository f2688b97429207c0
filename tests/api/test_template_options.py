"""Chat template options: typed request fields, chat_template_kwargs and server defaults merged
(ninfer.api.service.template_options), and the errors that name the request's field."""

from __future__ import annotations

import pytest

from ninfer.api.service.template_options import ThinkingDefaults, resolve_template_options
from ninfer.api.wire.errors import ApiError


@pytest.mark.parametrize(
    "fields, code, param",
    [
        ({"enable_thinking": True, "chat_template_kwargs": {"enable_thinking": False}}, "conflicting_template_option", "enable_thinking"),
        ({"preserve_thinking": False, "chat_template_kwargs": {"preserve_thinking": True}}, "conflicting_template_option", "preserve_thinking"),
        ({"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high"}}, "conflicting_template_option", "reasoning_effort"),
        ({"enable_thinking": True, "reasoning_effort": "none"}, "conflicting_template_option", "reasoning_effort"),
        ({"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": "none"}, "conflicting_template_option", "reasoning_effort"),
        ({"enable_thinking": False, "reasoning_effort": "high"}, "conflicting_template_option", "reasoning_effort"),
        ({"reasoning_effort": "extreme"}, "invalid_value", "reasoning_effort"),
        ({"enable_thinking": "yes"}, "invalid_type", "enable_thinking"),
        ({"chat_template_kwargs": {"preserve_thinking": 1}}, "invalid_type", "chat_template_kwargs.preserve_thinking"),
        ({"chat_template_kwargs": {"messages": []}}, "invalid_value", "chat_template_kwargs.messages"),
        ({"chat_template_kwargs": {"tools": None}}, "invalid_value", "chat_template_kwargs.tools"),
        ({"chat_template_kwargs": {"add_generation_prompt": False}}, "invalid_value", "chat_template_kwargs.add_generation_prompt"),
        ({"chat_template_kwargs": {"eos_token": "x"}}, "invalid_value", "chat_template_kwargs.eos_token"),
        ({"chat_template_kwargs": ["not", "an", "object"]}, "invalid_type", "chat_template_kwargs"),
    ],
)  # fmt: skip
def test_option_errors(fields: dict, code: str, param: str) -> None:
    with pytest.raises(ApiError) as e:
        resolve_template_options(**fields)
    assert (e.value.status, e.value.code, e.value.param) == (400, code, param)


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high"}}, "reasoning.effort"),
        ({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}}, "reasoning.effort"),
        ({"reasoning_effort": "extreme"}, "reasoning.effort"),
        ({"chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "none"}}, "chat_template_kwargs.reasoning_effort"),
    ],
)  # fmt: skip
def test_option_errors_name_the_protocols_field(fields: dict, param: str) -> None:
    """Responses carries the effort as reasoning.effort: its errors name that field."""
    with pytest.raises(ApiError) as e:
        resolve_template_options(**fields, fields={"reasoning_effort": "reasoning.effort"})
    assert e.value.param == param


def test_option_resolution() -> None:
    # duplicated and equal is fine; null standard kwargs mean unspecified
    o = resolve_template_options(
        enable_thinking=True,
        chat_template_kwargs={"enable_thinking": True, "preserve_thinking": None},
    )
    assert (o.enable_thinking, o.preserve_thinking) == (True, None)
    o = resolve_template_options(reasoning_effort="none")
    assert o.enable_thinking is False and o.variables() == {
        "enable_thinking": False,
        "reasoning_effort": "none",
    }
    assert (
        resolve_template_options(reasoning_effort="minimal", enable_thinking=False).enable_thinking
        is False
    )
    # server defaults apply only when the request is silent
    d = ThinkingDefaults.from_flags(thinking=False, preserve_thinking=True)
    assert (d.enable_thinking, d.preserve_thinking) == (False, True)
    o = resolve_template_options(defaults=d)
    assert (o.enable_thinking, o.preserve_thinking, o.requested_preserve_thinking) == (
        False,
        True,
        None,
    )
    o = resolve_template_options(enable_thinking=True, preserve_thinking=False, defaults=d)
    assert (o.enable_thinking, o.preserve_thinking, o.requested_preserve_thinking) == (
        True,
        False,
        False,
    )
    assert resolve_template_options(reasoning_effort="high", defaults=d).enable_thinking is None
    assert resolve_template_options(defaults=ThinkingDefaults.from_flags()).variables() == {}
