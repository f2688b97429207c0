"""Stop-string matching: held-back partial matches, first-completing match, chunk invariance."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.api.service.stops import StopMatcher, validate_stops
from ninfer.api.wire.errors import ApiError


def run(stops: list[str], chunks: list[str]) -> tuple[list[str], str | None]:
    m = StopMatcher(stops)
    out = []
    for c in chunks:
        r = m.feed(c)
        out.append(r.text)
        if r.match:
            return out, r.match.stop
    out.append(m.finish())
    return out, None


def reference(stops: list[str], text: str) -> tuple[str, str | None]:
    """Truncate at the occurrence with the smallest end (earliest start on ties)."""
    best = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or (i + len(s), i) < (best[0] + len(best[1]), best[0])):
            best = (i, s)
    return (text, None) if best is None else (text[: best[0]], best[1])


def test_holds_only_a_possible_prefix() -> None:
    m = StopMatcher(["</answer>"])
    assert m.feed("Hello </ans").text == "Hello "
    assert m.held == "</ans"
    assert m.feed("wer is").text == "</answer is"  # not a match after all: released
    assert m.feed(" done</answer> tail").text == " done"
    assert m.match is not None and m.match.stop == "</answer>"
    assert m.feed("more").text == ""  # nothing after the stop


def test_match_split_across_many_chunks() -> None:
    out, stop = run(["STOP"], ["aS", "T", "O", "P", "b"])
    assert "".join(out) == "a" and stop == "STOP"


def test_first_completed_stop_wins() -> None:
    # "bc" completes (end 3) before "abcd" (end 4), whatever the chunking.
    assert run(["abcd", "bc"], ["abcd"]) == (["a"], "bc")
    assert "".join(run(["abcd", "bc"], list("abcd"))[0]) == "a"
    # same end: the earlier start (the longer string) wins
    assert run(["xbc", "bc"], ["axbcz"])[1] == "xbc"


def test_no_stops_is_pass_through() -> None:
    m = StopMatcher([])
    assert m.feed("abc").text == "abc" and m.finish() == ""


def test_finish_releases_held_text() -> None:
    m = StopMatcher(["<|end|>"])
    assert m.feed("x<|en").text == "x"
    assert m.finish() == "<|en"


def test_unicode_stops() -> None:
    out, stop = run(["。", "🙂"], ["你好", "世界。", "再见"])
    assert "".join(out) == "你好世界" and stop == "。"


@pytest.mark.parametrize(
    "value, code",
    [("", "invalid_value"), (["a", ""], "invalid_value"), (["a", 1], "invalid_type"),
     (["a", "b", "c", "d", "e"], "invalid_value"), (5, "invalid_type")],
)  # fmt: skip
def test_validate_rejects(value: object, code: str) -> None:
    with pytest.raises(ApiError) as e:
        validate_stops(value)  # type: ignore[arg-type]
    assert e.value.code == code and e.value.status == 400 and e.value.param.startswith("stop")


def test_validate_normalizes() -> None:
    assert validate_stops(None) == ()
    assert validate_stops("x") == ("x",)
    assert validate_stops(["a", "b", "a", "c", "d"]) == ("a", "b", "c", "d")


alphabet = st.sampled_from(list("ab<>/|\n好🙂"))


@settings(max_examples=300, deadline=None)
@given(
    stops=st.lists(st.text(alphabet, min_size=1, max_size=4), min_size=1, max_size=4, unique=True),
    text=st.text(alphabet, max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=10),
)
def test_hypothesis_chunking_does_not_matter(stops: list[str], text: str, cuts: list[int]) -> None:
    bounds = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
    out, stop = run(stops, chunks)
    assert ("".join(out), stop) == reference(stops, text)
