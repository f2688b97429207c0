"""Incremental detokenization: token ids in, text deltas out.

Works with any `tokenizers.Tokenizer` whose decoder is prefix-stable (byte-level BPE as in
GPT-2/Qwen/SmolLM, and SentencePiece-style Metaspace + ByteFallback + Fuse + Strip as in Llama).

Contract of `IncrementalDetokenizer`:

- The concatenation of every delta returned by `add` and `finish` equals
  `tokenizer.decode(all_ids, skip_special_tokens=...)`. (Exception: with SentencePiece byte
  fallback, an invalid byte turns the *whole* run of adjacent byte tokens into U+FFFD, including
  characters completed and returned earlier; such output is garbage either way.)
- A delta never ends in the middle of a character: a UTF-8 sequence split across tokens (which
  the decoder renders as one or more U+FFFD) is held back until it completes. Whether the bytes
  end inside a character is read from the tokens' bytes (byte-level symbols or `<0xXX>` pieces),
  so a genuinely invalid byte is released at once.
- Each step decodes only a window of recent tokens, never the whole sequence.

How: the window `ids[start:]` always begins at a *clean boundary* (a token index where all
earlier bytes formed complete characters). `emitted` counts the characters of
`decode(ids[start:])` already returned. Because the window begins at a clean boundary, the
decoder's start-of-text handling (e.g. Llama's leading-space strip) affects only text that was
already emitted, and later tokens only append. When everything decoded so far was clean and the
window has grown past `window`, it slides forward to the previous clean boundary (one that
is already emitted, so a stripped leading space cannot be lost). The window only grows while the
text keeps ending inside a character, which for real text lasts a token or two.

    ids:   ... | t_start ... t_clean | ... t_last
               ^ window start          ^ pending (maybe an incomplete character)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from tokenizers import Tokenizer, decoders, pre_tokenizers

REPLACEMENT = "\ufffd"
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_table() -> dict[str, int]:
    """Inverse of the GPT-2 byte-to-symbol map: printable Latin-1 bytes stand for themselves,
    the other bytes, in order, for U+0100 onwards."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(0x100 + extra)] = b
            extra += 1
    return table


_BYTE_LEVEL = _byte_level_table()
assert set(_BYTE_LEVEL) == set(pre_tokenizers.ByteLevel.alphabet())


def _token_bytes(tokenizer: Tokenizer) -> Callable[[int], bytes] | None:
    """A function giving the UTF-8 bytes a token contributes, or None if the tokenizer is of
    neither supported family. Added tokens contribute their (complete) text."""
    added = {i: t.content.encode() for i, t in tokenizer.get_added_tokens_decoder().items()}
    if tokenizer.token_to_id("<0xE2>") is not None:

        def sp(tid: int) -> bytes:
            if tid in added:
                return added[tid]
            piece = tokenizer.id_to_token(tid) or ""
            m = _BYTE_PIECE.fullmatch(piece)
            return bytes([int(m.group(1), 16)]) if m else piece.encode()

        return sp
    if isinstance(tokenizer.decoder, decoders.ByteLevel):

        def bl(tid: int) -> bytes:
            if tid in added:
                return added[tid]
            piece = tokenizer.id_to_token(tid) or ""
            return bytes(_BYTE_LEVEL.get(c, 0x20) for c in piece)

        return bl
    return None


def _incomplete_utf8(tail: bytes) -> bool:
    """True when `tail` ends with a lead byte followed by fewer continuation bytes than it needs."""
    for back in range(1, min(4, len(tail)) + 1):
        b = tail[-back]
        if 0x80 <= b <= 0xBF:
            continue  # continuation byte: look further back for its lead
        need = 2 if 0xC2 <= b <= 0xDF else 3 if 0xE0 <= b <= 0xEF else 4 if 0xF0 <= b <= 0xF4 else 0
        return need > back
    return False


class IncrementalDetokenizer:
    """Streaming decoder for one generated sequence (see module docstring).

    Args:
        tokenizer: the model tokenizer.
        skip_special_tokens: forwarded to `Tokenizer.decode`.
        window: slide the decode window once it holds more than this many tokens.
        max_pending: for tokenizers whose token bytes are unknown (neither byte-level nor byte
            fallback), release a trailing U+FFFD after this many steps of holding it.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        skip_special_tokens: bool = True,
        window: int = 24,
        max_pending: int = 8,
    ) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._window = window
        self._max_pending = max_pending
        self.ids: list[int] = []
        self._start = 0  # window start: a clean boundary
        self._clean = 0  # newest clean boundary (all ids[:clean] decode to complete characters)
        self._prev_clean = 0  # the clean boundary before `_clean`
        self._steps_held = 0  # consecutive steps that held text back
        self._bytes = _token_bytes(tokenizer)
        self._emitted = 0  # characters of decode(ids[start:]) already returned

    def _decode(self, lo: int) -> str:
        return self._tok.decode(self.ids[lo:], skip_special_tokens=self._skip)

    def add(self, token_ids: int | Iterable[int]) -> str:
        """Append one or more token ids and return the newly complete text (may be empty)."""
        if isinstance(token_ids, int):
            self.ids.append(token_ids)
        else:
            self.ids.extend(token_ids)
        text = self._decode(self._start)
        tail = len(text) - len(text.rstrip(REPLACEMENT))
        if tail and self._ends_inside_character():
            safe = len(text) - tail
            delta = text[self._emitted : safe] if safe > self._emitted else ""
            self._emitted = max(self._emitted, safe)
            self._steps_held += 1
            return delta
        self._steps_held = 0
        delta = text[self._emitted :]
        self._emitted = len(text)
        if tail == 0 and len(self.ids) > self._clean:
            self._prev_clean, self._clean = self._clean, len(self.ids)
            if self._clean - self._start > self._window and self._prev_clean > self._start:
                # Slide to an already-emitted clean boundary: start-of-text rules (a stripped
                # leading space) then only touch text that was returned before.
                self._start = self._prev_clean
                self._emitted = len(self._decode(self._start))
        return delta

    def _ends_inside_character(self) -> bool:
        """Whether the byte stream ends with an incomplete (but so far valid) UTF-8 sequence."""
        if self._bytes is None:
            # Unknown byte mapping: trust the trailing U+FFFD for a few steps.
            return self._steps_held < self._max_pending
        tail = b""
        for tid in reversed(self.ids[max(0, len(self.ids) - 4) :]):
            tail = self._bytes(tid) + tail
            if len(tail) >= 4:
                break
        return _incomplete_utf8(tail[-4:])

    def finish(self) -> str:
        """Return whatever is still held back (including any genuinely invalid bytes), except a
        character the output was cut off in the middle of (a length limit can end generation
        between the bytes of one character): it is dropped rather than shown as U+FFFD."""
        text = self._decode(self._start)
        if text.endswith("\ufffd") and self._bytes is not None:
            tail = b"".join(self._bytes(t) for t in self.ids[self._start :])
            if _incomplete_utf8(tail):
                text = text[:-1]
        delta = text[self._emitted :]
        self._emitted = len(text)
        return delta
