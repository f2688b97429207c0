"""Readers for JSON request fields that raise field-specific `ApiError`s.

Every protocol (Chat Completions, Responses, Anthropic Messages) validates its decoded JSON
with these. Conventions shared by all readers:

- a missing key and an explicit JSON null both mean "unspecified" and return None (pass
  `required=True` to turn that into 400 missing_required_parameter);
- booleans are never accepted as numbers (JSON `true` is not `1`);
- `param` is the field's path in the request, used verbatim in the error.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ninfer.api.wire import errors, long_text

# The deepest nesting a request body may have. Protocol bodies need a dozen levels (a tool
# schema inside a tool inside the request); deeper input only exercises recursion in the
# template engine and the JSON encoder, whose limits are a RecursionError (a 500), not a 400.
MAX_DEPTH = 64
CHUNKED_BYTES = 256 * 1024  # bodies above this decode through ninfer.api.wire.json_chunked


def parse_json_object(raw: bytes | str) -> dict[str, Any]:
    """Decode a request body that must be one JSON object.

    Member order is kept (Python dicts preserve insertion order; a duplicated member keeps its
    last value). NaN and Infinity are refused: they are not JSON. Raises 400 invalid_json for
    a body that is not JSON, 400 request_too_complex for one too dense to parse within
    `body_cost.MAX_PARSE_FACTOR` times its size, and 400 invalid_value naming the field for
    nesting deeper than MAX_DEPTH or a UTF-16 surrogate (escaped, or as raw UTF-8 bytes, which
    Python's JSON decoder lets through) in any string.
    """
    from ninfer.api.wire.body_cost import check_parse_cost
    from ninfer.api.wire.json_chunked import loads_chunked

    check_parse_cost(raw)

    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        if isinstance(raw, bytes) and len(raw) > CHUNKED_BYTES:  # in short GIL holds
            value = loads_chunked(raw)
        else:
            value = json.loads(raw, parse_constant=no_constants)
    except UnicodeDecodeError:
        raise errors.invalid_json("the body is not UTF-8 text") from None
    except (ValueError, RecursionError) as e:
        raise errors.invalid_json(str(e).split("\n")[0]) from None
    if not isinstance(value, dict):
        raise errors.invalid_json("the body must be a JSON object")
    if isinstance(raw, str):
        surrogates = True
    else:  # the walk looks for surrogates only when the raw bytes can hold one
        surrogates = bool(
            long_text.search(_SURROGATE_ESCAPE, raw, 4)
            or long_text.search(_SURROGATE_BYTES, raw, 2)
        )
    check_tree(value, surrogates=surrogates)
    return value


def parse_json_text(text: str, param: str) -> Any:
    """Decode JSON text held in a request field (tool-call arguments): the value, or
    json.JSONDecodeError when it is not JSON. Raises 400 invalid_value naming `param` when it
    nests deeper than MAX_DEPTH (Python's decoder recurses; templates recurse again)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise errors.invalid_value(param, f"nests JSON deeper than {MAX_DEPTH} levels") from None
    check_tree(value, surrogates=False, root=param)
    return value


def json_object_text(value: Any, param: str, expected: str) -> str:
    """`value` as sent, when it is the JSON text of an object (a tool call's arguments). Raises
    400 invalid_type naming `param` when it is not a string (`expected` says what should have
    come), 400 invalid_value when the text is not a JSON object or nests too deep."""
    if not isinstance(value, str):
        raise errors.invalid_type(param, expected, value)
    try:
        parsed = parse_json_text(value, param)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise errors.invalid_value(param, "must be the JSON text of an object")
    return value


# JSON may escape a UTF-16 surrogate; a pair decodes to one character, a lone one stays a
# surrogate, which is not Unicode text (no tokenizer, encoder or client can take it). Raw
# surrogate bytes (ED A0..BF xx, invalid UTF-8) are decoded to surrogates too by json.loads.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE_BYTES = re.compile(rb"\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_tree(value: Any, *, surrogates: bool = True, root: str = "") -> None:
    """Walk a decoded body without recursion: 400 invalid_value naming the first field nested
    deeper than MAX_DEPTH, or (with `surrogates`) holding a UTF-16 surrogate in a string or a
    member name. Allocates per open container only (paths are built for containers, never for
    scalars), so a walk costs little next to the decoded body itself."""
    if isinstance(value, str):
        _check_text(value, root, surrogates)
        return
    if not isinstance(value, (dict, list)):
        return
    stack: list[tuple[Iterator[tuple[Any, Any]], str]] = [(_members(value), root)]
    while stack:
        members, path = stack[-1]
        for key, child in members:
            if isinstance(child, str):
                _check_text(child, path, surrogates, key)
            elif isinstance(child, (dict, list)):
                here = _join(path, key)
                if surrogates and isinstance(key, str) and _SURROGATE.search(key):
                    raise _surrogate_error(path or "body", "has a member name with")
                if len(stack) >= MAX_DEPTH:
                    raise errors.invalid_value(
                        _clip_path(here), f"is nested deeper than {MAX_DEPTH} levels"
                    )
                stack.append((_members(child), here))
                break
            elif surrogates and isinstance(key, str) and _SURROGATE.search(key):
                raise _surrogate_error(path or "body", "has a member name with")
        else:
            stack.pop()


def _members(container: dict[str, Any] | list[Any]) -> Iterator[tuple[Any, Any]]:
    return iter(container.items()) if isinstance(container, dict) else enumerate(container)


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _check_text(text: str, path: str, surrogates: bool, key: Any = None) -> None:
    if not surrogates:
        return
    if isinstance(key, str) and _SURROGATE.search(key):
        raise _surrogate_error(path or "body", "has a member name with")
    if _has_surrogate(text):
        raise _surrogate_error(_join(path, key) if key is not None else path or "body", "contains")


def _has_surrogate(text: str) -> bool:
    return long_text.search(_SURROGATE, text, 1) is not None


def _surrogate_error(param: str, what: str) -> errors.ApiError:
    return errors.invalid_value(
        _clip_path(param), f"{what} a UTF-16 surrogate code point, which is not Unicode text"
    )


def _clip_path(path: str, limit: int = 120) -> str:
    """A field path of bounded length (a deep path repeats `[0]` hundreds of times)."""
    return path if len(path) <= limit else path[: limit - 3] + "..."


def _present(obj: Mapping[str, Any], key: str, param: str, required: bool) -> Any:
    value = obj.get(key)
    if value is None and required:
        raise errors.missing(param)
    return value


def get_bool(
    obj: Mapping[str, Any], key: str, param: str | None = None, *, required: bool = False
) -> bool | None:
    param = param or key
    value = _present(obj, key, param, required)
    if value is not None and not isinstance(value, bool):
        raise errors.invalid_type(param, "a boolean", value)
    return value


def get_int(
    obj: Mapping[str, Any],
    key: str,
    param: str | None = None,
    *,
    lo: int | None = None,
    hi: int | None = None,
    required: bool = False,
) -> int | None:
    """An integer in [lo, hi] (inclusive; None = unbounded)."""
    param = param or key
    value = _present(obj, key, param, required)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.invalid_type(param, "an integer", value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise errors.invalid_value(param, f"must be {_range(lo, hi)}, got {errors.clip(value)}")
    return value


def get_number(
    obj: Mapping[str, Any],
    key: str,
    param: str | None = None,
    *,
    lo: float | None = None,
    hi: float | None = None,
    required: bool = False,
) -> float | None:
    """A finite number in [lo, hi] (inclusive), returned as float."""
    param = param or key
    value = _present(obj, key, param, required)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise errors.invalid_type(param, "a number", value)
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits: beyond any double
        raise errors.invalid_value(
            param, "must be a finite number, got an integer beyond the float range"
        ) from None
    if not math.isfinite(number):
        raise errors.invalid_value(param, "must be a finite number")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise errors.invalid_value(
            param, f"must be in [{_num(lo, '-inf')}, {_num(hi, 'inf')}], got {errors.clip(value)}"
        )
    return number


def get_str(
    obj: Mapping[str, Any],
    key: str,
    param: str | None = None,
    *,
    required: bool = False,
    nonempty: bool = False,
) -> str | None:
    param = param or key
    value = _present(obj, key, param, required)
    if value is None:
        return None
    if not isinstance(value, str):
        raise errors.invalid_type(param, "a string", value)
    if nonempty and not value:
        raise errors.invalid_value(param, "must not be empty")
    return value


def get_enum(
    obj: Mapping[str, Any],
    key: str,
    choices: tuple[str, ...],
    param: str | None = None,
    *,
    required: bool = False,
) -> str | None:
    param = param or key
    value = get_str(obj, key, param, required=required)
    if value is not None and value not in choices:
        raise errors.invalid_value(
            param, f"must be one of {', '.join(repr(c) for c in choices)}, got {errors.clip(value)}"
        )
    return value


def get_object(
    obj: Mapping[str, Any], key: str, param: str | None = None, *, required: bool = False
) -> dict[str, Any] | None:
    param = param or key
    value = _present(obj, key, param, required)
    if value is not None and not isinstance(value, dict):
        raise errors.invalid_type(param, "an object", value)
    return value


def get_array(
    obj: Mapping[str, Any], key: str, param: str | None = None, *, required: bool = False
) -> list[Any] | None:
    param = param or key
    value = _present(obj, key, param, required)
    if value is not None and not isinstance(value, list):
        raise errors.invalid_type(param, "an array", value)
    return value


def require_object(value: Any, param: str) -> dict[str, Any]:
    """`value` itself must be an object (an array element, say)."""
    if not isinstance(value, dict):
        raise errors.invalid_type(param, "an object", value)
    return value


INT64 = (-(1 << 63), (1 << 63) - 1)
# The sampler request fields in validation order: name -> (reader, lo, hi), OpenAI ranges.
SAMPLING_FIELDS: dict[str, tuple[Callable[..., Any], float | None, float | None]] = {
    "temperature": (get_number, 0.0, 2.0),
    "top_p": (get_number, 0.0, 1.0),
    "top_k": (get_int, 0, 20),
    "min_p": (get_number, 0.0, 1.0),
    "presence_penalty": (get_number, -2.0, 2.0),
    "frequency_penalty": (get_number, -2.0, 2.0),
    "seed": (get_int, INT64[0], INT64[1]),
}


def get_sampling(
    obj: Mapping[str, Any],
    names: tuple[str, ...] = tuple(SAMPLING_FIELDS),
    **ranges: tuple[float | None, float | None],
) -> dict[str, Any]:
    """The sampler fields `names` of a request body, each read (in SAMPLING_FIELDS order) with
    its reader and range; `ranges` overrides a field's (lo, hi) for a protocol that differs.
    Returns {name: value or None}, ready for `SamplingOptions(**...)`."""
    out: dict[str, Any] = {}
    for name, (reader, lo, hi) in SAMPLING_FIELDS.items():
        if name in names:
            lo, hi = ranges.get(name, (lo, hi))
            out[name] = reader(obj, name, lo=lo, hi=hi)
    return out


def _range(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f"in {lo}..{hi}"
    return f">= {lo}" if lo is not None else f"<= {hi}"


def _num(x: float | None, unbounded: str) -> str:
    return unbounded if x is None else f"{x:g}"
