"""JSON decoding in bounded steps, for large request bodies decoded in a worker thread.

`json.loads` is one C call: it holds the GIL for the whole body (~100 ms for 7.5 MiB of text,
~500 ms for 5 MiB of small messages), and the event loop, /health included, waits that long.
`loads_chunked` produces the same value through many short C calls: the body is decoded from
UTF-8 in 256 KiB slices, the outer containers (the body object, its arrays such as `messages`,
their elements) are walked here, and only their members go to the C scanner; a long string is
decoded window by window (256k characters: ~1 ms a call; 1 MiB windows took 4-8 ms, 15+ on
the loaded 2-core test machine). Between two calls the thread gives the GIL back when asked
(sys.getswitchinterval, 5 ms).

Same semantics as `json.loads(raw)` with `parse_constant` refusing NaN/Infinity: member order
kept, last duplicate wins, surrogates passed through (`surrogatepass`, as json.loads decodes
bytes), strict control characters; malformed input raises json.JSONDecodeError.
"""

from __future__ import annotations

import codecs
import json
import re
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

SLICE_BYTES = 1 << 18  # UTF-8 decoded per call
STRING_WINDOW = 1 << 18  # characters of one long string decoded per call
SPLIT_DEPTH = 3  # containers above this depth are walked here; deeper ones go to C whole
_WS = re.compile(r"[ \t\n\r]*")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_constant=_no_constants)
_SCAN = _DECODER.scan_once


def decode_text(raw: bytes) -> str:
    """`raw` as text, decoded slice by slice (surrogates passed through, as json.loads does).
    ASCII is decoded at once: that is a copy, at memory speed."""
    if raw.isascii():
        return raw.decode("ascii")
    decoder = codecs.getincrementaldecoder("utf-8")("surrogatepass")
    parts = [
        decoder.decode(raw[i : i + SLICE_BYTES], final=i + SLICE_BYTES >= len(raw))
        for i in range(0, len(raw), SLICE_BYTES)
    ]
    return "".join(parts)


def loads_chunked(raw: bytes) -> Any:
    """The JSON value of `raw` (see the module docstring). Raises json.JSONDecodeError,
    UnicodeDecodeError, ValueError (NaN, Infinity), RecursionError as json.loads would."""
    raw = raw.removeprefix(codecs.BOM_UTF8)  # json.loads of bytes skips it (utf-8-sig)
    text = decode_text(raw)
    idx = _ws(text, 0)
    value, idx = _value(text, idx, 0)
    idx = _ws(text, idx)
    if idx != len(text):
        raise json.JSONDecodeError("Extra data", text, idx)
    return value


def _ws(text: str, idx: int) -> int:
    return _WS.match(text, idx).end()  # type: ignore[union-attr]


def _value(text: str, idx: int, depth: int) -> tuple[Any, int]:
    ch = text[idx : idx + 1]
    if depth < SPLIT_DEPTH and ch == "{":
        return _object(text, idx + 1, depth)
    if depth < SPLIT_DEPTH and ch == "[":
        return _array(text, idx + 1, depth)
    if ch == '"':
        return _string(text, idx + 1)
    try:
        return _SCAN(text, idx)
    except StopIteration as e:
        raise json.JSONDecodeError("Expecting value", text, e.value) from None


def _object(text: str, idx: int, depth: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    idx = _ws(text, idx)
    if text[idx : idx + 1] == "}":
        return out, idx + 1
    while True:
        if text[idx : idx + 1] != '"':
            raise json.JSONDecodeError(
                "Expecting property name enclosed in double quotes", text, idx
            )
        key, idx = _string(text, idx + 1)
        idx = _ws(text, idx)
        if text[idx : idx + 1] != ":":
            raise json.JSONDecodeError("Expecting ':' delimiter", text, idx)
        idx = _ws(text, idx + 1)
        out[key], idx = _value(text, idx, depth + 1)
        closed, idx = _next_member(text, idx, "}")
        if closed:
            return out, idx


def _array(text: str, idx: int, depth: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    idx = _ws(text, idx)
    if text[idx : idx + 1] == "]":
        return out, idx + 1
    while True:
        value, idx = _value(text, idx, depth + 1)
        out.append(value)
        closed, idx = _next_member(text, idx, "]")
        if closed:
            return out, idx


def _next_member(text: str, idx: int, close: str) -> tuple[bool, int]:
    """After a member of an object or array: (True, the index after `close`) when it ends the
    container, else (False, the start of the next member after the comma)."""
    idx = _ws(text, idx)
    ch = text[idx : idx + 1]
    if ch == close:
        return True, idx + 1
    if ch != ",":
        raise json.JSONDecodeError("Expecting ',' delimiter", text, idx)
    return False, _ws(text, idx + 1)


def _string(text: str, start: int) -> tuple[str, int]:
    """The string whose opening quote is at start - 1, and the index after its closing quote.
    A long one is decoded STRING_WINDOW characters at a time, each window ending where no
    escape (nor an escaped surrogate pair, which decodes to one character) is cut. (A long
    string with a quote in its first window, escaped or not, is decoded in one call.)"""
    if text.find('"', start, start + STRING_WINDOW) >= 0:
        return scanstring(text, start, True)  # type: ignore[no-any-return]
    parts: list[str] = []
    pos = start
    while True:
        cut = pos + STRING_WINDOW
        if cut >= len(text):
            return _finish(parts, *scanstring(text, pos, True))
        cut = _safe_cut(text, pos, cut)
        if cut <= pos:  # cannot happen for windows longer than an escape; be safe anyway
            return _finish(parts, *scanstring(text, pos, True))
        window = text[pos:cut]
        # the closing quote inside the window? (a quote in the window may be escaped: let
        # scanstring judge by decoding the window as a string of its own)
        piece, end = scanstring(window + '"', 0, True)
        if end < len(window) + 1:  # it ended inside the window
            return _finish(parts, piece, pos + end)
        parts.append(piece)
        pos = cut


def _safe_cut(text: str, pos: int, cut: int) -> int:
    """The greatest c <= cut (and > pos, else pos) that no escape sequence spans. `pos` is an
    escape boundary, so the parity of a backslash run tells which backslashes start escapes."""
    while cut > pos and _inside_escape(text, pos, cut):
        cut -= 1
    return cut


def _inside_escape(text: str, pos: int, c: int) -> bool:
    for s in range(max(pos, c - 11), c):  # an escape is at most 12 characters (a pair)
        if text[s] == "\\" and _starts_escape(text, pos, s) and s + _escape_len(text, s) > c:
            return True
    return False


def _starts_escape(text: str, pos: int, s: int) -> bool:
    run, j = 0, s - 1
    while j >= pos and text[j] == "\\":
        run, j = run + 1, j - 1
    return run % 2 == 0


def _escape_len(text: str, s: int) -> int:
    if text[s + 1 : s + 2] != "u":
        return 2
    high = text[s + 2 : s + 4].lower()
    if high[:1] == "d" and high[1:2] in ("8", "9", "a", "b") and text[s + 6 : s + 8] == "\\u":
        return 12  # a high surrogate escape followed by another: scanstring may pair them
    return 6


def _finish(parts: list[str], last: str, end: int) -> tuple[str, int]:
    parts.append(last)
    return "".join(parts), end
