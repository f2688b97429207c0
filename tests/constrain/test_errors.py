"""Invalid or unenforceable constraints raise ConstraintError naming the request path (what the
API returns as a 400); a non-strict schema drops what cannot be enforced instead."""

from __future__ import annotations

import pytest

from ninfer.constrain import (
    ConstraintError,
    ForcedToolCall,
    Grammar,
    JsonSchema,
    Regex,
    ToolSpec,
    compile_constraint,
)
from ninfer.errors import NinferError
from tests.constrain.helpers import Vocab

ROOT = "response_format.json_schema.schema"


def obj(**props: object) -> dict:
    return {"type": "object", "properties": props}


@pytest.mark.parametrize(
    ("schema", "path", "reason"),
    [
        (obj(age={"type": "integre"}), f"{ROOT}.properties.age.type", "integre"),
        (obj(a={"type": "array", "uniqueItems": True}), f"{ROOT}.properties.a.uniqueItems", "uniqueItems"),
        ({**obj(a={**obj(b={"type": "integer", "minimum": 5, "maximum": 2}), "required": ["b"]}), "required": ["a"]}, f"{ROOT}.properties.a.properties.b.minimum", "minimum"),
        (obj(a={"$ref": "#/$defs/missing"}), f"{ROOT}.properties.a.$ref", "missing"),
        (obj(a={"type": "string", "pattern": "(["}), f"{ROOT}.properties.a.pattern", "regex"),
        (obj(a={"anyOf": [{"type": "string"}, {"type": "string", "format": "weird"}]}), f"{ROOT}.properties.a.anyOf[1].format", "weird"),
        ({"type": "object", "required": "name"}, f"{ROOT}.required", "not of type 'array'"),
    ],
)  # fmt: skip
def test_invalid_schema_names_its_path(smol: Vocab, schema: dict, path: str, reason: str) -> None:
    with pytest.raises(ConstraintError) as e:
        compile_constraint(JsonSchema(schema), smol.info)
    assert e.value.path == path
    assert reason in e.value.reason
    assert isinstance(e.value, NinferError)  # a user error: the API answers 400


def test_boolean_schemas(tiny: Vocab) -> None:
    m = compile_constraint(JsonSchema(True), tiny.info).matcher()
    assert all(m.advance(t) for t in tiny.encode('[1, "a"]')) and m.is_accepting()
    with pytest.raises(ConstraintError, match="admits no value"):
        compile_constraint(JsonSchema(False), tiny.info)


def test_non_strict_schema_ignores_what_it_cannot_enforce(smol: Vocab) -> None:
    schema = obj(a={"type": "array", "uniqueItems": True})
    m = compile_constraint(JsonSchema(schema, strict=False), smol.info).matcher()
    assert all(m.advance(t) for t in smol.encode('{"a": [1, 1]}')), m.error


def test_tool_schema_error_names_the_tool(tiny: Vocab) -> None:
    good = ToolSpec("ok", obj(x={"type": "integer"}), path="tools[0].function.parameters")
    bad = ToolSpec("bad", obj(x={"type": "strin"}), path="tools[1].function.parameters")
    with pytest.raises(ConstraintError) as e:
        compile_constraint(ForcedToolCall((good, bad)), tiny.info)
    assert e.value.path == "tools[1].function.parameters.properties.x.type"


def test_unsupported_string_parameter_format_is_refused(tiny: Vocab) -> None:
    tool = ToolSpec(
        "t",
        obj(when={"type": "string", "format": "date-time"}),
        path="tools[0].function.parameters",
    )
    with pytest.raises(ConstraintError) as e:
        compile_constraint(ForcedToolCall((tool,)), tiny.info)
    assert e.value.path == "tools[0].function.parameters.properties.when.format"


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        (Grammar("root ::= foo", syntax="gbnf"), "grammar"),
        (Grammar("start: undefined_rule", syntax="lark", path="grammar"), "grammar"),
        (Regex("([", path="regex"), "regex"),
    ],
)
def test_invalid_grammar_or_regex(tiny: Vocab, spec: object, path: str) -> None:
    with pytest.raises(ConstraintError) as e:
        compile_constraint(spec, tiny.info)  # type: ignore[arg-type]
    assert e.value.path == path and e.value.reason


def test_gbnf_lark_and_regex_constrain(smol: Vocab) -> None:
    gbnf = 'root ::= "yes" | "no" | num\nnum ::= [0-9]+'
    lark = 'start: "a" B\nB: /[xy]{2}/'
    # llama.cpp's grammars/list.gbnf: comments, negated classes with escapes, repetition
    listing = (
        "root ::= item+\n# Excludes various line break characters\n"
        'item ::= "- " [^\\r\\n\\x0b\\x0c\\x85\\u2028\\u2029]+ "\\n"\n'
    )
    for spec, good, bad in [
        (Grammar(gbnf), "42", "maybe"),
        (Grammar(listing), "- milk\n- eggs\n", "- milk\n\n"),
        (Grammar(lark, syntax="lark"), "axy", "axz"),
        (Regex(r"[A-Z][a-z]+ [0-9]{2}"), "Paris 75", "paris 75"),
    ]:
        c = compile_constraint(spec, smol.info)
        m = c.matcher()
        assert all(m.advance(t) for t in smol.encode(good)) and m.is_accepting(), spec
        m = c.matcher()
        assert not (all(m.advance(t) for t in smol.encode(bad)) and m.is_accepting()), spec
