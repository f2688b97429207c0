"""JSON mode and JSON Schema: random decoding under the mask always yields valid JSON."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from ninfer.constrain import JsonObject, JsonSchema, compile_constraint
from tests.constrain.helpers import Vocab, decode_random

NESTED = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 10**6},
        "status": {"enum": ["open", "closed", "pending"]},
        "owner": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 16},
                "role": {"enum": ["admin", "user"]},
                "address": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "minLength": 1, "maxLength": 12},
                        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                    },
                    "required": ["city", "zip"],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "role", "address"],
            "additionalProperties": False,
        },
        "tags": {
            "type": "array",
            "items": {"type": "string", "maxLength": 8},
            "minItems": 1,
            "maxItems": 3,
        },
        "score": {"type": "number", "minimum": 0, "maximum": 100},
        "done": {"type": "boolean"},
    },
    "required": ["id", "status", "owner", "tags", "done"],
    "additionalProperties": False,
}


def test_nested_schema_random_decoding_always_validates(vocab: Vocab) -> None:
    constraint = compile_constraint(JsonSchema(NESTED), vocab.info)
    results = decode_random(constraint, seeds=range(24))
    for seed, (ids, matcher) in enumerate(results):
        assert matcher.is_terminated(), f"seed {seed} did not finish: {vocab.decode(ids)!r}"
        text = vocab.decode(ids)
        value = json.loads(text)
        jsonschema.validate(value, NESTED)
        # the fixed layout: json.dumps' separators, no other whitespace outside strings
        skeleton = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
        assert not re.search(r"\s", re.sub(r"[,:] ", "", skeleton)), text


def test_json_object_mode_yields_an_object(smol: Vocab) -> None:
    constraint = compile_constraint(JsonObject(), smol.info)
    for ids, matcher in decode_random(constraint, seeds=range(20), max_tokens=400):
        if matcher.is_terminated():  # an unbounded object may still be open at the cap
            assert isinstance(json.loads(smol.decode(ids)), dict)
        else:
            assert not matcher.is_accepting()


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        ({"$defs": {"p": {"type": "integer", "minimum": 0}}, "$ref": "#/$defs/p"}, 3, -1),
        ({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]}, "ab", True),
        ({"enum": ["red", "green"]}, "green", "blue"),
        ({"const": "x"}, "x", "y"),
        ({"type": "string", "pattern": "^[a-z]{3}-[0-9]{2}$"}, "abc-12", "abc-1x"),
        ({"type": "string", "minLength": 2, "maxLength": 4}, "abc", "abcdef"),
        ({"type": "array", "items": {"type": "integer"}, "maxItems": 2}, [1, 2], [1, 2, 3]),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "additionalProperties": False,
            },
            {"a": 1},
            {"a": 1, "b": 2},
        ),
        ({"type": "number", "minimum": 0, "maximum": 10}, 3.5, 11),
        ({"type": "string", "format": "date"}, "2024-01-02", "2024-1-2"),
    ],
)
def test_schema_features_accept_valid_and_refuse_invalid(
    smol: Vocab, schema: dict, good: object, bad: object
) -> None:
    constraint = compile_constraint(JsonSchema(schema), smol.info)

    def accepts(value: object) -> bool:
        m = constraint.matcher()
        ids = smol.encode(json.dumps(value)) + [smol.info.eos_token_ids[0]]
        return all(m.advance(t) for t in ids) and m.is_terminated()

    assert accepts(good)
    assert not accepts(bad)


def test_refused_token_leaves_the_state_unchanged(tiny: Vocab) -> None:
    m = compile_constraint(JsonSchema({"type": "boolean"}), tiny.info).matcher()
    (x,) = tiny.encode("x")
    assert x not in m.allowed_token_ids()
    assert not m.advance(x)
    assert "not allowed" in m.error
    for t in tiny.encode("true"):  # still at the start: a valid value goes through
        assert m.advance(t), m.error
    assert m.is_accepting()
    assert set(m.allowed_token_ids()) == set(tiny.info.eos_token_ids)
