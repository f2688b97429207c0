"""JSON Schema -> llguidance grammar, with errors that name the schema path.

A schema is checked twice before it is used: against the JSON-Schema meta-schema (`jsonschema`,
which reports the failing location), then by llguidance's compiler (which refuses what it cannot
enforce: unknown keywords in strict mode, unsatisfiable bounds, bad patterns, dangling `$ref`).
llguidance's messages carry no location, so `locate` finds the deepest subschema that fails on its
own and the keyword the message names.

Output layout is fixed: `", "` between items, `": "` after keys, no other whitespace (the layout
of `json.dumps`, which chat models write), so a model cannot loop on whitespace.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import llguidance

from ninfer.constrain.errors import ConstraintError, join_path
from ninfer.constrain.tokenizer_info import TokenizerInfo

JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
_CHILD_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_CHILD_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_CHILD_ONE = (
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
)


def json_schema_grammar(
    schema: Mapping[str, Any] | bool, info: TokenizerInfo, *, strict: bool, path: str
) -> str:
    """The llguidance grammar of `schema`; raises ConstraintError naming `path` + the schema
    path of the first problem. Not strict: keywords the engine does not implement are ignored."""
    check_schema(schema, path)
    options = {**JSON_OPTIONS, "lenient": not strict}
    grammar = llguidance.LLMatcher.grammar_from_json_schema(_plain(schema), overrides=options)
    message = llguidance.LLMatcher.validate_grammar(grammar, info.ll_tokenizer)
    if message:
        parts = locate(schema, message, info, options)
        raise ConstraintError(join_path(path, parts), _first_line(message))
    return grammar


def check_schema(schema: Any, path: str) -> None:
    """Meta-schema check (JSON Schema 2020-12): raises ConstraintError at the failing location."""
    if not isinstance(schema, (Mapping, bool)):
        raise ConstraintError(path, "a JSON schema must be an object (or a boolean)")
    try:
        jsonschema.Draft202012Validator.check_schema(_plain(schema))
    except jsonschema.SchemaError as e:
        raise ConstraintError(join_path(path, e.path), _first_line(e.message)) from None


def subschemas(schema: Any, parts: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every subschema reachable through schema keywords, with its path parts (root first)."""
    yield parts, schema
    if not isinstance(schema, Mapping):
        return
    for key in _CHILD_MAPS:
        children = schema.get(key)
        if isinstance(children, Mapping):
            for name, child in children.items():
                yield from subschemas(child, (*parts, key, name))
    for key in _CHILD_LISTS:
        children = schema.get(key)
        if isinstance(children, list):
            for i, child in enumerate(children):
                yield from subschemas(child, (*parts, key, i))
    for key in _CHILD_ONE:
        child = schema.get(key)
        if isinstance(child, (Mapping, bool)) and key in schema:
            yield from subschemas(child, (*parts, key))


def locate(
    schema: Any, message: str, info: TokenizerInfo, options: Mapping[str, Any]
) -> tuple[Any, ...]:
    """Path parts of the deepest subschema that fails alone with the same first message line,
    plus the keyword of that subschema the message names (e.g. `minimum`); () if none does."""
    first = _first_line(message)
    defs = {
        k: schema[k]
        for k in ("$defs", "definitions")
        if isinstance(schema, Mapping) and k in schema
    }
    found: tuple[Any, ...] = ()
    for parts, sub in sorted(subschemas(schema), key=lambda ps: -len(ps[0])):
        if not parts or not isinstance(sub, Mapping):
            continue
        alone = {**defs, **sub} if "$ref" in str(sub) else dict(sub)
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            _plain(alone), overrides=dict(options)
        )
        if _first_line(llguidance.LLMatcher.validate_grammar(grammar, info.ll_tokenizer)) == first:
            found = parts
            break
    sub = _at(schema, found)
    if isinstance(sub, Mapping):
        named = [k for k in sub if isinstance(k, str) and k in first]
        if named:
            return (*found, max(named, key=len))
    return found


def _at(schema: Any, parts: tuple[Any, ...]) -> Any:
    for p in parts:
        schema = schema[p]
    return schema


def _plain(value: Any) -> Any:
    """Mappings and tuples as dicts and lists (what the JSON encoders accept)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else ""
