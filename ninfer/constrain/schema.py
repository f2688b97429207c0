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
    if schema is False:
        raise ConstraintError(path, "the schema false admits no value")
    if schema is True:
        schema = {}
    options = {**JSON_OPTIONS, "lenient": not strict}
    grammar = llguidance.LLMatcher.grammar_from_json_schema(_plain(schema), overrides=options)
    message = llguidance.LLMatcher.validate_grammar(grammar, info.ll_tokenizer)
    if message:
        parts, reason = locate(schema, message, info, options)
        raise ConstraintError(join_path(path, parts), reason)
    return grammar


def check_schema(schema: Any, path: str) -> None:
    """Meta-schema check (JSON Schema 2020-12): raises ConstraintError at the failing location."""
    if not isinstance(schema, (Mapping, bool)):
        raise ConstraintError(path, "a JSON schema must be an object (or a boolean)")
    try:
        jsonschema.Draft202012Validator.check_schema(_plain(schema))
    except jsonschema.SchemaError as e:
        raise ConstraintError(join_path(path, e.path), _first_line(e.message)) from None


def children(schema: Any) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """The immediate subschemas of `schema`, with their path parts relative to it."""
    if not isinstance(schema, Mapping):
        return
    for key in _CHILD_MAPS:
        kids = schema.get(key)
        if isinstance(kids, Mapping):
            for name, child in kids.items():
                yield (key, name), child
    for key in _CHILD_LISTS:
        kids = schema.get(key)
        if isinstance(kids, list):
            for i, child in enumerate(kids):
                yield (key, i), child
    for key in _CHILD_ONE:
        if key in schema and isinstance(schema[key], (Mapping, bool)):
            yield (key,), schema[key]


def locate(
    schema: Any, message: str, info: TokenizerInfo, options: Mapping[str, Any]
) -> tuple[tuple[Any, ...], str]:
    """Where llguidance's `message` about `schema` comes from: follows, from the root, a child
    that fails on its own as long as there is one; returns its path parts (plus the keyword its
    message names, e.g. `minimum`) and that message (the most specific)."""
    defs = {
        k: schema[k]
        for k in ("$defs", "definitions")
        if isinstance(schema, Mapping) and k in schema
    }
    parts: tuple[Any, ...] = ()
    node = schema
    while True:
        for rel, child in children(node):
            if not isinstance(child, Mapping) or rel[0] in ("$defs", "definitions"):
                continue  # a definition fails where it is used (its $ref), not where it sits
            alone = {**defs, **child} if "$ref" in str(child) else dict(child)
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                _plain(alone), overrides=dict(options)
            )
            failure = llguidance.LLMatcher.validate_grammar(grammar, info.ll_tokenizer)
            if failure:
                parts, node, message = (*parts, *rel), child, failure
                break
        else:
            break
    first = _first_line(message)
    if isinstance(node, Mapping):
        # the keyword the message names, or whose value it quotes (a `$ref` target)
        named = [
            k
            for k, v in node.items()
            if isinstance(k, str)
            and (k in first or (isinstance(v, str) and v.lstrip("#") in first))
        ]
        if named:
            return (*parts, max(named, key=len)), first
    return parts, first


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
