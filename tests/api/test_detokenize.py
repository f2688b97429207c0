"""Incremental detokenization: exact concatenation, no split UTF-8, bounded decode windows."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from ninfer.api.service.detokenize import IncrementalDetokenizer

TEXTS = [
    "Hello world, how are you?",
    "你好，世界。今天天气很好。",
    "Emoji 🙂🚀👍🏽 family 👨‍👩‍👧 flag 🇫🇷 end",
    "語😀🐍 mixed Café naïve Zürich こんにちは 안녕하세요",
    "  leading spaces and\nnew\nlines\t\ttabs  ",
    "<think>\nreasoning\n</think>\n\n<tool_call>\n<function=f>\n</function>\n</tool_call>",
]

text_st = st.text(
    alphabet=st.sampled_from(list("ab c\n.你好語日本😀🐍🙂é€ſ👍🏽\u200d")), min_size=0, max_size=40
)


def stream(tok: Tokenizer, ids: list[int], chunks: list[int] | None = None, **kw) -> list[str]:
    """Feed `ids` (in chunks of the given sizes, else one by one); return all deltas."""
    d = IncrementalDetokenizer(tok, **kw)
    out: list[str] = []
    i = 0
    sizes = chunks or [1] * len(ids)
    for n in sizes:
        if i >= len(ids):
            break
        out.append(d.add(ids[i : i + n]))
        i += n
    if i < len(ids):
        out.append(d.add(ids[i:]))
    out.append(d.finish())
    return out


@pytest.fixture(params=["qwen", "sp"])
def tok(request, qwen_tokenizer: Tokenizer, sp_tokenizer: Tokenizer) -> Tokenizer:
    return qwen_tokenizer if request.param == "qwen" else sp_tokenizer


@pytest.mark.parametrize("text", TEXTS)
def test_concatenation_equals_full_decode(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text, add_special_tokens=False).ids
    deltas = stream(tok, ids)
    assert "".join(deltas) == tok.decode(ids)
    assert all("\ufffd" not in d for d in deltas)


def test_multibyte_characters_are_held_until_complete(sp_tokenizer: Tokenizer) -> None:
    # 😀 is four <0xXX> byte tokens in the SentencePiece-style tokenizer.
    ids = sp_tokenizer.encode("x😀y", add_special_tokens=False).ids
    pieces = [sp_tokenizer.id_to_token(i) for i in ids]
    assert pieces.count("<0xF0>") == 1 and len([p for p in pieces if p.startswith("<0x")]) >= 4
    d = IncrementalDetokenizer(sp_tokenizer)
    seen = [d.add(i) for i in ids] + [d.finish()]
    assert "😀" in seen  # released in one piece, as soon as its last byte arrived
    assert "".join(seen) == "x😀y"


def test_byte_level_emoji_split_across_tokens(qwen_tokenizer: Tokenizer) -> None:
    ids = qwen_tokenizer.encode("🐍", add_special_tokens=False).ids
    assert len(ids) > 1  # not in the tiny vocabulary: split into byte symbols
    d = IncrementalDetokenizer(qwen_tokenizer)
    seen = [d.add(i) for i in ids]
    assert seen[:-1] == [""] * (len(ids) - 1) and seen[-1] == "🐍"


def test_leading_space_kept_across_window_slides(sp_tokenizer: Tokenizer) -> None:
    # Llama-style decoders strip the first space of a decode; sliding must not drop real spaces.
    text = " ".join(["word", "the", "dog", "fox"] * 30)
    ids = sp_tokenizer.encode(text, add_special_tokens=False).ids
    assert "".join(stream(sp_tokenizer, ids, window=4)) == sp_tokenizer.decode(ids)


def test_special_tokens_follow_skip_flag(qwen_tokenizer: Tokenizer) -> None:
    ids = qwen_tokenizer.encode(
        "<|im_start|>hi<think>x</think><|im_end|>", add_special_tokens=False
    ).ids
    assert "".join(stream(qwen_tokenizer, ids)) == "hi<think>x</think>"
    kept = "".join(stream(qwen_tokenizer, ids, skip_special_tokens=False))
    assert kept == "<|im_start|>hi<think>x</think><|im_end|>"


class _CountingTokenizer:
    """Wraps the real tokenizer to record how many ids each decode call receives."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.lengths: list[int] = []

    def __getattr__(self, name: str):
        return getattr(self.tok, name)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.lengths.append(len(ids))
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


def test_decode_window_stays_bounded(tok: Tokenizer) -> None:
    ids = tok.encode(
        "The quick brown fox jumps over the lazy dog. 你好🙂 " * 40, add_special_tokens=False
    ).ids
    assert len(ids) > 400
    counting = _CountingTokenizer(tok)
    d = IncrementalDetokenizer(counting, window=16)  # type: ignore[arg-type]
    out = "".join(d.add(i) for i in ids) + d.finish()
    assert out == tok.decode(ids)
    assert max(counting.lengths) <= 16 + 8
    assert sum(counting.lengths) < 40 * len(ids)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=text_st, chunks=st.lists(st.integers(1, 5), max_size=60), window=st.integers(1, 12))
def test_hypothesis_any_chunking(tok: Tokenizer, text: str, chunks: list[int], window: int) -> None:
    ids = tok.encode(text, add_special_tokens=False).ids
    deltas = stream(tok, ids, chunks, window=window)
    assert "".join(deltas) == tok.decode(ids)
    if "\ufffd" not in text:
        assert all("\ufffd" not in d for d in deltas)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_hypothesis_arbitrary_ids(tok: Tokenizer, data: st.DataObject) -> None:
    # Random ids include broken byte sequences. Byte-level decoding is local, so deltas (which
    # may then carry U+FFFD) still concatenate to the full decode. SentencePiece byte fallback
    # renders a whole run of byte tokens as U+FFFD when any byte in it is invalid, so there the
    # guarantee holds for outputs that decode cleanly.
    ids = data.draw(st.lists(st.integers(0, tok.get_vocab_size() - 1), max_size=40))
    chunks = data.draw(st.lists(st.integers(1, 4), max_size=40))
    deltas = stream(tok, ids, chunks, window=6)
    full = tok.decode(ids)
    # a character the output was cut off inside (incomplete UTF-8 at the very end) is dropped
    # at finish instead of being shown as U+FFFD
    expected = full[:-1] if full.endswith("\ufffd") and _ends_incomplete(tok, ids) else full
    if tok.decoder.__class__.__name__ == "ByteLevel" or "\ufffd" not in full:
        assert "".join(deltas) == expected
    if "\ufffd" not in full:
        assert all("\ufffd" not in d for d in deltas)


def _ends_incomplete(tok: Tokenizer, ids: list[int]) -> bool:
    from ninfer.api.service.detokenize import _incomplete_utf8, _token_bytes

    to_bytes = _token_bytes(tok)
    return to_bytes is not None and _incomplete_utf8(b"".join(to_bytes(i) for i in ids))


def test_invalid_byte_is_released_once_it_cannot_complete(qwen_tokenizer: Tokenizer) -> None:
    lead = qwen_tokenizer.token_to_id("æ")  # the byte symbol of 0xE6, a UTF-8 lead byte
    a = qwen_tokenizer.token_to_id("a")
    d = IncrementalDetokenizer(qwen_tokenizer)
    assert d.add(lead) == ""  # may still become a character
    assert d.add(a) == "\ufffda"  # cannot any more: released at once
    assert d.add(lead) == ""
    assert d.finish() == ""  # cut off inside a character: dropped, never U+FFFD


def test_output_cut_inside_a_character_drops_it_instead_of_emitting_replacement(qwen_tokenizer):
    from ninfer.api.service.detokenize import IncrementalDetokenizer

    ids = qwen_tokenizer.encode("ok 😀", add_special_tokens=False).ids
    full = qwen_tokenizer.decode(ids)
    assert full == "ok 😀"
    # find a cut that ends inside the emoji's bytes (a length limit can stop there)
    for cut in range(1, len(ids)):
        partial = qwen_tokenizer.decode(ids[:cut])
        if partial.endswith("\ufffd"):
            d = IncrementalDetokenizer(qwen_tokenizer)
            text = "".join(d.add(t) for t in ids[:cut]) + d.finish()
            assert "\ufffd" not in text and full.startswith(text)
            break
    else:
        pytest.skip("the tokenizer never splits the emoji")
