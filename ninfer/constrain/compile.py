"""`compile_constraint(spec, info) -> Constraint`: a request's spec checked and turned into an
llguidance grammar, once per request; `Constraint.matcher()` starts its per-sequence state.

The grammar engine is llguidance (bench/results/grammar_mask.md says why). Everything the
sampler touches goes through this package, so the engine is named in no other module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

from ninfer.constrain import spec as kinds
from ninfer.constrain.errors import ConstraintError
from ninfer.constrain.matcher import Matcher
from ninfer.constrain.schema import json_schema_grammar
from ninfer.constrain.tokenizer_info import TokenizerInfo
from ninfer.constrain.tools import forced_calls_lark, strict_tools_lark


@dataclass(frozen=True)
class Constraint:
    """A compiled constraint: immutable, shareable by the `n` choices of one request.
    `thinking`: the output starts inside a thinking block, and the constraint applies from the
    token after `</think>` (`after_thinking()` sets it; the engine's matchers follow it)."""

    spec: kinds.ConstraintSpec
    grammar: str = field(repr=False)
    info: TokenizerInfo = field(repr=False)
    thinking: bool = False

    def after_thinking(self) -> Constraint:
        """This constraint, gated until `</think>`. Raises ConstraintError when the tokenizer has
        no single `</think>` token (the gate could not tell where thinking ends)."""
        if self.info.think_end_id is None:
            raise ConstraintError(
                _spec_path(self.spec),
                "cannot constrain the answer after thinking: the tokenizer has no </think> token",
            )
        return replace(self, thinking=True)

    def matcher(self, *, thinking: bool | None = None) -> Matcher:
        """Fresh per-sequence state. `thinking` (default: the constraint's own): the output
        starts inside a thinking block, and the constraint applies from the token after
        `</think>` (the tokenizer must have it)."""
        thinking = self.thinking if thinking is None else thinking
        if thinking and self.info.think_end_id is None:
            raise ValueError("thinking gate requested, but the tokenizer has no </think> token")
        engine = llguidance.LLMatcher(self.info.ll_tokenizer, self.grammar, log_level=0)
        if engine.is_error():  # the grammar was validated at compile time
            raise RuntimeError(f"grammar engine refused a validated grammar: {engine.get_error()}")
        return Matcher(engine, self.info, self.info.think_end_id if thinking else None)


def compile_constraint(spec: kinds.ConstraintSpec, info: TokenizerInfo) -> Constraint:
    """Check `spec` and compile it for `info`'s vocabulary. Raises ConstraintError (naming the
    request field and schema path) for anything invalid or not enforceable."""
    if isinstance(spec, kinds.JsonObject):
        grammar = json_schema_grammar({"type": "object"}, info, strict=True, path=spec.path)
    elif isinstance(spec, kinds.JsonSchema):
        grammar = json_schema_grammar(spec.schema, info, strict=spec.strict, path=spec.path)
    elif isinstance(spec, kinds.Grammar):
        text = spec.text
        if spec.syntax == "gbnf":
            try:
                text = any_to_lark(text)
            except Exception as e:  # noqa: BLE001  (the converter raises plain exceptions)
                raise ConstraintError(spec.path, f"invalid GBNF grammar: {e}") from None
        grammar = _checked(llguidance.LLMatcher.grammar_from_lark(text), info, spec.path)
    elif isinstance(spec, kinds.Regex):
        grammar = _checked(llguidance.LLMatcher.grammar_from_regex(spec.pattern), info, spec.path)
    elif isinstance(spec, (kinds.ForcedToolCall, kinds.StrictTools)):
        for tool in spec.tools:  # each schema's own errors first, with their paths
            if tool.strict:
                json_schema_grammar(tool.parameters, info, strict=True, path=tool.path)
        if isinstance(spec, kinds.ForcedToolCall):
            lark = forced_calls_lark(spec.tools, info, spec.parallel, spec.call_format)
        else:
            answer = None
            if spec.answer is not None:  # its own errors first, with its path
                answer = _answer_schema(spec.answer)
                json_schema_grammar(
                    answer, info, strict=_strict(spec.answer), path=spec.answer.path
                )
            lark = strict_tools_lark(
                spec.tools,
                info,
                spec.parallel,
                answer,
                _strict(spec.answer),
                spec.call_format,
            )
        grammar = _checked(llguidance.LLMatcher.grammar_from_lark(lark), info, "tools")
    else:
        raise TypeError(f"not a constraint spec: {spec!r}")
    return Constraint(spec, grammar, info)


def _answer_schema(answer: kinds.JsonObject | kinds.JsonSchema) -> Mapping[str, Any] | bool:
    return {"type": "object"} if isinstance(answer, kinds.JsonObject) else answer.schema


def _strict(answer: kinds.JsonObject | kinds.JsonSchema | None) -> bool:
    return not isinstance(answer, kinds.JsonSchema) or answer.strict


def _spec_path(spec: kinds.ConstraintSpec) -> str:
    return "tools" if isinstance(spec, (kinds.ForcedToolCall, kinds.StrictTools)) else spec.path


def _checked(grammar: str, info: TokenizerInfo, path: str) -> str:
    message = llguidance.LLMatcher.validate_grammar(grammar, info.ll_tokenizer)
    if message:
        raise ConstraintError(path, message.strip().splitlines()[0])
    return grammar
