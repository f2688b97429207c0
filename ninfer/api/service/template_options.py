"""Template options: the variables one request passes to the chat template.

`resolve_template_options` merges the typed request fields (enable_thinking, preserve_thinking,
reasoning_effort), `chat_template_kwargs` and the server defaults (`ThinkingDefaults`) into a
`TemplateOptions`, rejecting conflicts and reserved names; `ChatTemplate.render`
(ninfer.api.service.template) turns it into template variables.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ninfer.api.wire import errors

STANDARD_OPTIONS = ("enable_thinking", "preserve_thinking", "reasoning_effort")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# Efforts that ask for thinking; "minimal" is left to the template.
_THINKING_EFFORTS = frozenset({"low", "medium", "high", "xhigh", "max"})
SPECIAL_TOKEN_VARIABLES = (
    "bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token",
)  # fmt: skip
RESERVED_VARIABLES = frozenset(
    {"messages", "tools", "add_generation_prompt", "continue_final_message"}
    | set(SPECIAL_TOKEN_VARIABLES)
)
# Names the template environment provides (Jinja's globals, ninfer's helpers, Jinja's own
# context names): a kwarg of the same name would shadow the helper, e.g. turn
# raise_exception into a string and so disarm the template's input checks.
TEMPLATE_HELPERS = frozenset(
    {"range", "dict", "lipsum", "cycler", "joiner", "namespace"}
    | {"raise_exception", "strftime_now"}
    | {"self", "loop", "caller", "varargs", "kwargs"}
)


@dataclass(frozen=True)
class ThinkingDefaults:
    """Server-wide defaults: `--no-thinking` sets enable_thinking=False, `--preserve-thinking`
    preserve_thinking=True; None leaves the template's own default."""

    enable_thinking: bool | None = None
    preserve_thinking: bool | None = None

    @classmethod
    def from_flags(cls, thinking: bool = True, preserve_thinking: bool = False) -> ThinkingDefaults:
        """From the serve flags: only `--no-thinking` / `--preserve-thinking` set a default."""
        return cls(
            enable_thinking=None if thinking else False,
            preserve_thinking=True if preserve_thinking else None,
        )


@dataclass(frozen=True)
class TemplateOptions:
    """Resolved template variables of one request.

    `enable_thinking`, `preserve_thinking`, `reasoning_effort` are None when neither the request
    nor the server set them (the template default applies). `requested_*` record only what the
    request itself said, for the request log. `extra` holds the other kwargs, passed verbatim.
    """

    enable_thinking: bool | None = None
    preserve_thinking: bool | None = None
    reasoning_effort: str | None = None
    requested_reasoning_effort: str | None = None
    requested_preserve_thinking: bool | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def variables(self) -> dict[str, Any]:
        """Template variables: extra kwargs plus every standard option that is set."""
        out = dict(self.extra)
        for name in STANDARD_OPTIONS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


def _check_option(name: str, param: str, value: Any) -> None:
    if name == "reasoning_effort":
        if not isinstance(value, str):
            raise errors.invalid_type(param, "a string", value)
        if value not in REASONING_EFFORTS:
            raise errors.invalid_value(param, f"must be one of {', '.join(REASONING_EFFORTS)}")
    elif not isinstance(value, bool):
        raise errors.invalid_type(param, "a boolean", value)


def resolve_template_options(
    *,
    enable_thinking: bool | None = None,
    preserve_thinking: bool | None = None,
    reasoning_effort: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    defaults: ThinkingDefaults = ThinkingDefaults(),
    fields: Mapping[str, str] | None = None,
    effort_enables_thinking: bool = True,
) -> TemplateOptions:
    """Merge typed request fields, `chat_template_kwargs` and server defaults.

    Rules (docs/serving.md, "Thinking and template options"):
    - a null standard option means unspecified; other null kwargs stay None;
    - a standard option given both as a typed field and in kwargs must agree, else
      `conflicting_template_option`;
    - reasoning_effort "none" means enable_thinking False; explicit enable_thinking True with
      effort "none", or False with low..max effort, is `conflicting_template_option` (the
      latter not when `effort_enables_thinking` is False: Anthropic's effort applies to the
      whole output, thinking or not);
    - messages, tools, generation mode and special-token variables cannot be set through kwargs
      (`invalid_value`); wrongly typed options are `invalid_type` / `invalid_value`.
    All errors are `ApiError` 400 naming the field: the typed ones by their names in the
    request's protocol (`fields`, e.g. {"reasoning_effort": "reasoning.effort"} for Responses).
    - request options override server defaults; the server's enable_thinking default is not
      applied when the request chose a reasoning effort.
    """
    kwargs = {} if chat_template_kwargs is None else chat_template_kwargs
    if not isinstance(kwargs, Mapping):
        raise errors.invalid_type("chat_template_kwargs", "an object", kwargs)
    typed = {
        "enable_thinking": enable_thinking,
        "preserve_thinking": preserve_thinking,
        "reasoning_effort": reasoning_effort,
    }
    field = {name: name for name in STANDARD_OPTIONS} | dict(fields or {})
    resolved: dict[str, Any] = {}
    for name in STANDARD_OPTIONS:
        a, b = typed[name], kwargs.get(name)
        if a is not None:
            _check_option(name, field[name], a)
        if b is not None:
            _check_option(name, f"chat_template_kwargs.{name}", b)
        if a is not None and b is not None and a != b:
            # A protocol field may carry the option under another name and kind (Anthropic's
            # thinking.type is a string, not enable_thinking's boolean): name both.
            said = (
                f"{name} is {_js(a)} in the request"
                if field[name] == name
                else f"{field[name]} sets {name} {_js(a)}"
            )
            raise errors.conflicting_template_option(
                field[name], f"{said} but {_js(b)} in chat_template_kwargs.{name}"
            )
        resolved[name] = a if a is not None else b
    extra: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in STANDARD_OPTIONS:
            continue
        if key in RESERVED_VARIABLES:
            raise errors.invalid_value(
                f"chat_template_kwargs.{key}",
                "messages, tools, generation mode and special tokens cannot be set through "
                "chat_template_kwargs",
            )
        if key in TEMPLATE_HELPERS:
            raise errors.invalid_value(
                f"chat_template_kwargs.{key}",
                f"{key!r} names a helper of the chat template ({', '.join(sorted(TEMPLATE_HELPERS))}),"
                " which chat_template_kwargs cannot replace",
            )
        extra[key] = value
    think, effort = resolved["enable_thinking"], resolved["reasoning_effort"]
    where = (  # the field that carried the effort
        field["reasoning_effort"]
        if typed["reasoning_effort"] is not None
        else "chat_template_kwargs.reasoning_effort"
    )
    if effort == "none":
        if think is True:
            raise errors.conflicting_template_option(
                where, f'enable_thinking true conflicts with {where} "none"'
            )
        think = False
    elif effort in _THINKING_EFFORTS and think is False and effort_enables_thinking:
        raise errors.conflicting_template_option(
            where, f'enable_thinking false conflicts with {where} "{effort}"'
        )
    if think is None and effort is None:
        think = defaults.enable_thinking
    preserve = resolved["preserve_thinking"]
    return TemplateOptions(
        enable_thinking=think,
        preserve_thinking=preserve if preserve is not None else defaults.preserve_thinking,
        reasoning_effort=effort,
        requested_reasoning_effort=effort,
        requested_preserve_thinking=preserve,
        extra=extra,
    )


def _js(value: Any) -> str:
    return json.dumps(value)
