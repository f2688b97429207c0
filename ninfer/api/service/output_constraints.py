"""The request fields that constrain the output, read into one `ConstraintSpec` (ninfer.constrain):

    Chat       response_format {type: json_object | json_schema, json_schema: {name, schema,
               strict}}; llama.cpp's top-level json_schema and grammar (GBNF); vLLM's
               structured_outputs {json | regex | choice | grammar} and guided_json /
               guided_regex / guided_choice / guided_grammar
    Responses  text.format {type: json_object | json_schema, name, schema, strict}
    Anthropic  output_config.format / output_format {type: json_schema, schema}
    all three  tool_choice required / a named function (the output is a valid call) and
               strict tools under tool_choice auto (a call's arguments are valid)

A request carries one ConstraintSpec (`combine`): a JSON response format sent with callable
tools under tool_choice auto means "that JSON answer, or tool calls" (agents that declare an
output type and tools send both); under a required tool choice only calls can come, so the
format has nothing to apply to; a grammar with tools, or two formats, are 400
`conflicting_constraints`. The service compiles it against the model's vocabulary
(ModelService.compile_constraint); a schema the grammar engine cannot enforce is a 400 naming
its path (`constraint_error`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ninfer.api.wire import errors
from ninfer.api.wire.errors import ApiError
from ninfer.api.wire.fields import get_bool, get_object, get_str
from ninfer.constrain import ConstraintError
from ninfer.constrain import spec as kinds

ToolMode = Literal["auto", "none", "required"]


def json_format(
    fmt: Mapping[str, Any] | None, param: str, *, nested: bool
) -> kinds.ConstraintSpec | None:
    """A response format object at `param`: None for {"type": "text"}, else kinds.JsonObject or
    kinds.JsonSchema. `nested`: the schema sits under `json_schema` (Chat), else beside `type`
    (Responses' text.format). `strict` defaults to false, as OpenAI's: a keyword the engine
    cannot enforce is then ignored rather than refused."""
    if fmt is None:
        return None
    kind = get_str(fmt, "type", f"{param}.type", required=True)
    if kind == "text":
        return None
    if kind == "json_object":
        return kinds.JsonObject(path=param)
    if kind != "json_schema":
        raise errors.invalid_value(
            f"{param}.type", f"must be 'text', 'json_object' or 'json_schema', got {kind!r}"
        )
    where, holder = param, fmt
    if nested:
        where = f"{param}.json_schema"
        holder = get_object(fmt, "json_schema", where, required=True)  # type: ignore[assignment]
    get_str(holder, "name", f"{where}.name")
    get_str(holder, "description", f"{where}.description")
    strict = bool(get_bool(holder, "strict", f"{where}.strict"))
    schema = holder.get("schema")
    if schema is None:  # OpenAI allows leaving it out: any JSON value
        schema = {}
    if not isinstance(schema, (Mapping, bool)):
        raise errors.invalid_type(f"{where}.schema", "an object", schema)
    return kinds.JsonSchema(schema, strict=strict, path=f"{where}.schema")


def anthropic_format(body: Mapping[str, Any]) -> kinds.ConstraintSpec | None:
    """Anthropic structured outputs: `output_config.format` (and the beta spelling
    `output_format`), {"type": "json_schema", "schema": {...}}; schemas are strict there."""
    cfg = get_object(body, "output_config")
    formats = [
        (param, fmt)
        for param, fmt in (
            ("output_config.format", get_object(cfg, "format", "output_config.format") if cfg else None),
            ("output_format", get_object(body, "output_format")),
        )
        if fmt is not None
    ]  # fmt: skip
    if not formats:
        return None
    if len(formats) > 1:
        raise conflict("output_format", "send output_config.format or output_format, not both")
    param, fmt = formats[0]
    kind = get_str(fmt, "type", f"{param}.type", required=True)
    if kind != "json_schema":
        raise errors.invalid_value(f"{param}.type", f"must be 'json_schema', got {kind!r}")
    schema = fmt.get("schema")
    if not isinstance(schema, Mapping):
        raise errors.invalid_type(f"{param}.schema", "an object", schema)
    return kinds.JsonSchema(schema, strict=True, path=f"{param}.schema")


def llama_fields(body: Mapping[str, Any]) -> kinds.ConstraintSpec | None:
    """llama.cpp's top-level `json_schema` (a schema, enforced best effort as llama.cpp does)
    and `grammar` (GBNF text); at most one of them."""
    specs: list[tuple[str, kinds.ConstraintSpec]] = []
    schema = body.get("json_schema")
    if schema is not None:
        if not isinstance(schema, (Mapping, bool)):
            raise errors.invalid_type("json_schema", "an object", schema)
        specs.append(("json_schema", kinds.JsonSchema(schema, strict=False, path="json_schema")))
    grammar = get_str(body, "grammar")
    if grammar:  # an empty grammar means none, as in llama.cpp
        specs.append(("grammar", kinds.Grammar(grammar, "gbnf", path="grammar")))
    return one_of(specs)


VLLM_KINDS = ("json", "regex", "choice", "grammar")


def vllm_fields(body: Mapping[str, Any]) -> kinds.ConstraintSpec | None:
    """vLLM's `structured_outputs` object (one of json, regex, choice, grammar, json_object) and
    its older top-level spellings guided_json / guided_regex / guided_choice / guided_grammar;
    at most one constraint among them. A JSON schema may be sent as a JSON string, as vLLM
    accepts; its other members (backend options) have no effect."""
    specs: list[tuple[str, kinds.ConstraintSpec]] = []
    so = get_object(body, "structured_outputs")
    if so is not None and so.get("structural_tag") is not None:
        raise errors.unsupported_parameter(
            "structured_outputs.structural_tag", "structural tags (use json, regex or grammar)"
        )
    if so is not None and get_bool(so, "json_object", "structured_outputs.json_object"):
        specs.append(("structured_outputs.json_object", kinds.JsonObject("structured_outputs")))
    for kind in VLLM_KINDS:
        for param, holder, key in (
            (f"structured_outputs.{kind}", so, kind),
            (f"guided_{kind}", body, f"guided_{kind}"),
        ):
            value = holder.get(key) if holder is not None else None
            if value is not None:
                specs.append((param, _vllm_spec(kind, value, param)))
    return one_of(specs)


def _vllm_spec(kind: str, value: Any, param: str) -> kinds.ConstraintSpec:
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise errors.invalid_value(param, f"is not a JSON schema: {e}") from None
        if not isinstance(value, (Mapping, bool)):
            raise errors.invalid_type(param, "an object", value)
        return kinds.JsonSchema(value, strict=False, path=param)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise errors.invalid_value(param, "must be a non-empty array of strings")
        lark = "start: " + " | ".join(json.dumps(v) for v in value)
        return kinds.Grammar(lark, "lark", path=param)
    if not isinstance(value, str) or not value:
        raise errors.invalid_type(param, "a non-empty string", value)
    if kind == "regex":
        return kinds.Regex(value, path=param)
    return kinds.Grammar(value, "gbnf", path=param)  # GBNF, or Lark (EBNF) as vLLM also takes


def tool_constraint(
    mode: ToolMode,
    tools: Sequence[kinds.ToolSpec],
    *,
    parallel: bool,
    single: bool = False,
    answer: kinds.ConstraintSpec | None = None,
) -> kinds.ConstraintSpec | None:
    """The constraint the tool choice asks for over the callable `tools`: "required" forces
    one or more valid calls (exactly one when `single` or not `parallel`), every argument
    valid against its schema; "auto" with a strict tool, or with a JSON `answer` format, lets
    the output be text (that JSON answer when given) or calls whose strict tools' arguments
    are valid; otherwise none (`answer` alone then applies, see `combine`)."""
    if mode == "none" or not tools:
        return None
    if mode == "required":
        forced = tuple(kinds.ToolSpec(t.name, t.parameters, True, t.path) for t in tools)
        return kinds.ForcedToolCall(forced, parallel=parallel and not single)
    if isinstance(answer, (kinds.JsonObject, kinds.JsonSchema)):
        return kinds.StrictTools(tuple(tools), parallel=parallel, answer=answer)
    if any(t.strict for t in tools):
        return kinds.StrictTools(tuple(tools), parallel=parallel)
    return None


def combine(
    answer: tuple[str, kinds.ConstraintSpec | None], tools: kinds.ConstraintSpec | None
) -> kinds.ConstraintSpec | None:
    """The request's one constraint from its answer format (param, spec) and the tool
    constraint `tool_constraint` built with that answer (see the module docstring)."""
    param, spec = answer
    if tools is None or spec is None:
        return spec if tools is None else tools
    if isinstance(tools, kinds.ForcedToolCall) or (
        isinstance(tools, kinds.StrictTools) and tools.answer is spec
    ):
        return tools
    raise conflict(param, f"{param} cannot be combined with tool calls")


def one_of(specs: Sequence[tuple[str, kinds.ConstraintSpec | None]]) -> kinds.ConstraintSpec | None:
    """The one constraint among (param, spec) pairs (None entries ignored), None when there is
    none; 400 conflicting_constraints naming the second when there are several."""
    given = [(p, s) for p, s in specs if s is not None]
    if len(given) > 1:
        raise conflict(
            given[1][0],
            f"{given[0][0]} and {given[1][0]} both constrain the output; ninfer enforces one"
            " constraint per request",
        )
    return given[0][1] if given else None


def conflict(param: str, message: str) -> ApiError:
    return ApiError(400, message, code="conflicting_constraints", param=param)


def constraint_error(e: ConstraintError) -> ApiError:
    """400 for a schema, grammar or tool the grammar engine refused: `param` is the request
    field extended by the path of the offending part (e.g.
    `response_format.json_schema.schema.properties.age.type`)."""
    return ApiError(400, f"invalid {e.path}: {e.reason}", code="invalid_schema", param=e.path)
