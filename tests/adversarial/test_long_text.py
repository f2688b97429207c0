"""Windowed searches (ninfer.api.wire.long_text) find exactly what one-call searches find, with
matches across window boundaries, overlapping candidates and alternations whose first
alternative is a prefix of a later one (the order the regex engine prefers must be kept)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.api.wire import long_text

ALPHABET = "ab<|>\ue000x"
PATTERNS = [
    re.compile(r"<\|im_end\|>|<\|im_start\|>|<\|"),  # control spellings, a prefix last
    re.compile(r"<\||<\|im_end\|>"),  # a prefix first: the regex engine keeps it
    re.compile("\ue000(.)\ue000|ab|<|>", re.DOTALL),  # a placeholder or a spelling
    re.compile("[\ue000-\ue0ff]"),
    re.compile("aab|ab"),
]
LONGEST = [12, 12, 3, 1, 3]


def spans(matches) -> list[tuple[int, int, str]]:
    return [(m.start(), m.end(), m.group()) for m in matches]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    text=st.text(alphabet=ALPHABET, max_size=80),
    which=st.integers(0, len(PATTERNS) - 1),
    window=st.integers(1, 9),
    start=st.integers(0, 10),
)
def test_finditer_and_search_equal_the_one_call_forms(text, which, window, start):
    pattern, longest = PATTERNS[which], LONGEST[which]
    expected = spans(pattern.finditer(text, start))
    assert spans(long_text.finditer(pattern, text, longest, start, window)) == expected
    first = long_text.search(pattern, text, longest, start, window)
    assert spans([first] if first else []) == expected[:1]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    text=st.text(alphabet=ALPHABET, max_size=60),
    sub=st.text(alphabet=ALPHABET, min_size=1, max_size=4),
    window=st.integers(1, 7),
)
def test_find_equals_str_find(text, sub, window):
    assert long_text.find(text, sub, window) == text.find(sub)
    assert long_text.find(text.encode(), sub.encode(), window) == text.encode().find(sub.encode())


def test_bytes_patterns_and_a_long_text():
    raw = b"x" * 300_000 + b'"\\ud83d"' + b"y" * 100
    pattern = re.compile(rb"\\u[dD][89a-fA-F]")
    m = long_text.search(pattern, raw, 4)
    assert m is not None and m.start() == 300_001
    assert long_text.search(pattern, raw[:300_003], 4) is None  # cut inside the escape


def test_a_pattern_that_matches_the_empty_string_is_refused():
    with pytest.raises(ValueError, match="empty string"):
        list(long_text.finditer(re.compile("a*"), "bbb", 3))
