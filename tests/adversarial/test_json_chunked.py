"""ninfer.api.wire.json_chunked decodes exactly what json.loads decodes (windows shrunk so that every
cut lands somewhere interesting: inside escapes, between escaped surrogate halves, in runs of
backslashes), and refuses what it refuses."""

from __future__ import annotations

import json
import random

import pytest

from ninfer.api.wire import json_chunked

PIECES = ["a", " ", '"', "\\", "\\\\", "\n", "é", "😀", "\ud83d", "\udc00", "\x7f", "/", "u",
          "\\u", "D8", "\u2028"]  # fmt: skip


@pytest.mark.parametrize("window", [13, 14, 37, 100])
def test_same_value_as_json_loads(monkeypatch, window):
    monkeypatch.setattr(json_chunked, "STRING_WINDOW", window)
    rng = random.Random(window)
    for _ in range(1500):
        s = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 300)))
        value = {"messages": [{"role": "user", "content": s}], "n": [1, -2.5e3, None, True],
                 "deep": {"a": [{"b": [s[:7]]}]}, "s": s, "": {}}  # fmt: skip
        raw = json.dumps(value, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
        assert json_chunked.loads_chunked(raw) == json.loads(raw)


def test_a_utf8_bom_is_skipped_as_json_loads_skips_it():
    assert json_chunked.loads_chunked(b'\xef\xbb\xbf{"a": 1}') == json.loads(
        b'\xef\xbb\xbf{"a": 1}'
    )


def test_member_order_and_duplicates_as_json_loads():
    raw = b'{"b": 1, "a": [2, {"y": 1, "x": 2, "y": 3}], "b": 4}'
    got = json_chunked.loads_chunked(raw)
    assert got == json.loads(raw) and list(got) == ["b", "a"] and list(got["a"][1]) == ["y", "x"]


@pytest.mark.parametrize(
    "raw",
    [b'{"a":1,}', b'{"a" 1}', b"[1,2", b'{"a":1} x', b'{"a":NaN}', b"", b'{"a":"\x01"}',
     b'{"a":tru}', b'{"a":"x', b"{1:2}", b'{"a":[1 2]}'],
)  # fmt: skip
def test_refuses_what_json_loads_refuses(raw):
    with pytest.raises(ValueError):
        json.loads(raw, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    with pytest.raises(ValueError):  # JSONDecodeError is a ValueError
        json_chunked.loads_chunked(raw)
