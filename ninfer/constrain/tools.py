"""Lark grammars for Qwen XML tool calls in the wire format that ninfer.api.service.toolcalls
documents and parses.

Calls are separated by one newline; free text before the first call ends with a blank line
(as the chat template renders history). A parameter's VALUE follows the parser's typing
(ninfer.api.service.tool_params.convert_parameter): when its schema admits "string", the text is the
string itself, so it is constrained by the string branches' enum / const / pattern / length;
otherwise the text is JSON valid against the parameter's schema (llguidance's `%json`). A
string value never contains `<parameter=` or `</parameter>` (the parser would read them as
markup). Parameters appear in declaration order; required ones always, optional ones may.
Markers that are single added tokens of the tokenizer (`<tool_call>` in Qwen's) are matched as
that token, so the model cannot spell them out in pieces.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ninfer.constrain.errors import ConstraintError, join_path
from ninfer.constrain.schema import JSON_OPTIONS
from ninfer.constrain.spec import ToolSpec
from ninfer.constrain.tokenizer_info import TokenizerInfo
from ninfer.constrain.tools_json import json_call_rules

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
_JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "null", "object", "array"})
# A string value is one lexeme together with its closer: llguidance's lexer is greedy, so a free
# text lexeme followed by a separate "\n</parameter>" lexeme could never end (the text would
# swallow the closer). `&` / `~` are llguidance's lexeme intersection and complement.
_NO_MARKUP = r"~/(.|\n)*<\/?parameter(.|\n)*/"
_CLOSE = r'"\n</parameter>\n"'
_ANY_TEXT = r"/(.|\n)*/"


def _string_value_lexeme(body: str) -> str:
    """A lexeme: `body` (a lexeme expression) without parameter markup, then the closer."""
    return f"(({body}) & {_NO_MARKUP}) {_CLOSE}"


def forced_calls_lark(
    tools: tuple[ToolSpec, ...], info: TokenizerInfo, parallel: bool, fmt: str = "xml"
) -> str:
    """Only tool calls: at least one (exactly one unless `parallel`) to the given tools, in the
    Qwen XML form or (`fmt` "json") the Hermes JSON one (ninfer.constrain.tools_json)."""
    # up to two newlines first: Qwen models (and our template) put a blank line after </think>
    more = ' ("\\n" call)*' if parallel else ""
    lines = ["%llguidance {}", f"start: LEAD? call{more}", "LEAD: /\\n\\n?/"]
    return "\n".join(lines + _call_rules(tools, info, fmt)) + "\n"


def strict_tools_lark(
    tools: tuple[ToolSpec, ...],
    info: TokenizerInfo,
    parallel: bool,
    answer: Mapping[str, Any] | bool | None = None,
    answer_strict: bool = True,
    fmt: str = "xml",
) -> str:
    """Free text without `<tool_call>`, optionally followed by valid calls (and nothing after).
    With an `answer` schema: that JSON value, or calls (after at most one blank line). `fmt`
    as in `forced_calls_lark`."""
    more = ' ("\\n" call)*' if parallel else ""
    if answer is not None:
        schema = {"anyOf": [answer]} if isinstance(answer, bool) else dict(answer)
        options = {**JSON_OPTIONS, "lenient": not answer_strict}
        lines = [
            "%llguidance {}",
            f"start: answer | LEAD? call{more}",
            "LEAD: /\\n\\n?/",
            f"answer: %json {json.dumps({**schema, 'x-guidance': options})}",
        ]
        return "\n".join(lines + _call_rules(tools, info, fmt)) + "\n"
    calls = "call" + more
    no_call = f"/(.|\\n)*/ & ~/(.|\\n)*{re.escape(TOOL_OPEN)}(.|\\n)*/"
    if TOOL_OPEN in info.added_tokens:
        # the special token cannot occur inside the text lexeme: the text simply ends there
        lines = [
            "%llguidance {}",
            f"start: TEXT | TEXT {calls}",
            f"TEXT: {no_call}",  # nor "<tool_call>" spelled out: the parser would read it
        ]
    else:
        # a lazy lexeme ends at the first "<tool_call>": text + opener, then the rest of a call
        lines = [
            "%llguidance {}",
            f"start: TEXT | first_call{more}",
            f"TEXT: {no_call}",
            f"first_open[lazy]: /(.|\\n)*/ {json.dumps(TOOL_OPEN)}",
            "first_call: first_open call_body",
        ]
    return "\n".join(lines + _call_rules(tools, info, fmt)) + "\n"


def _marker(text: str, info: TokenizerInfo) -> str:
    return text if text in info.added_tokens else json.dumps(text)


def _call_rules(tools: tuple[ToolSpec, ...], info: TokenizerInfo, fmt: str) -> list[str]:
    if not tools:
        raise ConstraintError("tools", "no tool to call")
    for tool in tools:
        if not _TOOL_NAME.fullmatch(tool.name):
            raise ConstraintError(tool.path.rsplit(".", 1)[0] + ".name", "invalid tool name")
    close = _marker(TOOL_CLOSE, info)
    if fmt == "json":
        return json_call_rules(tools, _marker(TOOL_OPEN, info), close)
    rules = [
        f"call: {_marker(TOOL_OPEN, info)} call_body",
        "call_body: " + " | ".join(f"fn_{i}" for i in range(len(tools))),
    ]
    for i, tool in enumerate(tools):
        if not _TOOL_NAME.fullmatch(tool.name):
            raise ConstraintError(tool.path.rsplit(".", 1)[0] + ".name", "invalid tool name")
        params = _param_rules(tool, f"fn_{i}")
        head = json.dumps(f"\n<function={tool.name}>\n")
        rules.append(f'fn_{i}: {head} {params[0]} "</function>\\n" {close}')
        rules += params[1:]
    return rules


def _param_rules(tool: ToolSpec, prefix: str) -> list[str]:
    """[the sequence expression of the function's parameters, then the rules it uses]."""
    schema = tool.parameters
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(props, Mapping) or not props:
        return ['""']
    if not tool.strict:
        names = " | ".join(json.dumps(str(n)) for n in props)
        rule = f'{prefix}_any: "<parameter=" ({names}) ">\\n" {prefix.upper()}_FREE'
        free = f"{prefix.upper()}_FREE: " + _string_value_lexeme(_ANY_TEXT)
        return [f"{prefix}_any*", rule, free]
    required = set(schema.get("required") or ())
    defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    seq, rules = [], []
    for j, (name, sub) in enumerate(props.items()):
        rule = f"{prefix}_p{j}"
        seq.append(rule if name in required else rule + "?")
        path = join_path(tool.path, ("properties", name))
        value = _value_expr(sub, defs, f"{prefix.upper()}_P{j}", path, rules)
        opener = json.dumps(f"<parameter={name}>\n")
        rules.append(f"{rule}: {opener} {value}")
    return [" ".join(seq), *rules]


def _value_expr(sub: Any, defs: dict[str, Any], token: str, path: str, rules: list[str]) -> str:
    """Lark expression of one parameter value and its closer; appends the lexeme it needs to
    `rules`."""
    branches = _string_branches(sub)
    if branches is None:  # not string-typed: JSON text valid against the schema
        # x-guidance: the same fixed layout as response_format JSON (no whitespace loops)
        schema = {**defs, **sub} if isinstance(sub, Mapping) else {"anyOf": [sub]}
        return f"%json {json.dumps({**schema, 'x-guidance': JSON_OPTIONS})} {_CLOSE}"
    alternatives = [_string_lexeme(b, join_path(path, p)) for p, b in branches]
    rules.append(f"{token}: " + _string_value_lexeme(" | ".join(f"({a})" for a in alternatives)))
    return token


def _string_branches(sub: Any) -> list[tuple[tuple[Any, ...], Mapping[str, Any]]] | None:
    """The string-typed branches of a parameter schema when the parser keeps its text as a
    string (its explicit types admit "string"), else None. Mirrors parameter_types in
    ninfer.api.service.tool_params."""
    if not isinstance(sub, Mapping):
        return None

    def types(s: Any) -> frozenset[str] | None:
        t = s.get("type") if isinstance(s, Mapping) else None
        if isinstance(t, str):
            return frozenset({t}) if t in _JSON_TYPES else None
        if isinstance(t, list) and t and all(isinstance(x, str) and x in _JSON_TYPES for x in t):
            return frozenset(t)
        return None

    if "type" in sub:
        direct = types(sub)
        return [((), sub)] if direct is not None and "string" in direct else None
    for key in ("anyOf", "oneOf"):
        branches = sub.get(key)
        if isinstance(branches, list) and branches:
            all_types = [types(b) for b in branches]
            if any(t is None for t in all_types) or not any("string" in t for t in all_types):  # type: ignore[operator]
                return None
            return [
                ((key, i), b)
                for i, (b, t) in enumerate(zip(branches, all_types, strict=True))
                if "string" in t
            ]  # type: ignore[operator]
    return None


def _string_lexeme(s: Mapping[str, Any], path: str) -> str:
    """A lark lexeme body for a string's text (unquoted) under enum / const / pattern / length."""
    unsupported = sorted(set(s) & {"format", "contentEncoding", "contentMediaType"})
    if unsupported:
        raise ConstraintError(
            join_path(path, (unsupported[0],)), "not supported for a string tool parameter"
        )
    if "const" in s or "enum" in s:
        values = [s["const"]] if "const" in s else list(s["enum"])
        texts = [v for v in values if isinstance(v, str)]
        if not texts:
            raise ConstraintError(path, "no string value allowed by enum/const")
        return " | ".join(json.dumps(t) for t in texts)
    parts = []
    if "pattern" in s:
        pattern = str(s["pattern"])
        body = pattern.removeprefix("^").removesuffix("$")
        # JSON Schema patterns are searches: an unanchored side may be preceded/followed by text
        left = "" if pattern.startswith("^") else "(.|\\n)*"
        right = "" if pattern.endswith("$") and not pattern.endswith("\\$") else "(.|\\n)*"
        parts.append("/" + left + "(" + body.replace("/", "\\/") + ")" + right + "/")
    lo, hi = int(s.get("minLength", 0)), s.get("maxLength")
    if lo or hi is not None:
        parts.append(f"/(.|\\n){{{lo},{'' if hi is None else int(hi)}}}/")
    return " & ".join(parts) if parts else "/(.|\\n)*/"
