"""Prompt encoding: rendered prompt text plus control-token spans -> token ids.

`encode_prompt` (and `PromptEncoder`, which it caches per tokenizer) encodes the text a
`ChatTemplate` rendered (ninfer.api.service.template): the `RenderedPrompt.special_spans` become their
control-token ids, and everything else - including control-token spellings quoted in message
content, tool data or kwargs - is encoded as ordinary text. `control_token_spellings` names the
tokenizer's control tokens, which the template keeps out of content.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from tokenizers import Tokenizer


def control_token_spellings(tokenizer: Tokenizer) -> tuple[str, ...]:
    """Spellings of the tokenizer's control tokens: added tokens that are special or matched
    before normalization (Qwen's `<think>`, `<tool_call>` are non-special but unnormalized)."""
    added = tokenizer.get_added_tokens_decoder()
    return tuple(t.content for _, t in sorted(added.items()) if t.special or not t.normalized)


COUNT_CHUNK_CHARS = 16384  # characters per tokenizer call when counting a long prompt
BOUNDARY_SLACK = 4  # tokens a cut between chunks may add to their summed count

_SENTINEL_MARK = "\U0010fffd"
_SENTINEL_BASE = 0xF0000  # plane-15 private use: index characters of sentinels


class PromptEncoder:
    """Encodes prompt text where only given spans are control tokens.

    It holds a clone of the tokenizer in which each control token is renamed to a sentinel
    string (same flags, same position in the added vocabulary), so the control spellings become
    plain text. Encoding substitutes the markup spans by sentinels and runs the clone once over
    the whole text, which reproduces exactly how the original tokenizer would split and
    pre-tokenize around those tokens; sentinel ids are then mapped back to the real ids. Text
    that itself contains the sentinel character is encoded piece by piece with a second clone
    that has no control tokens at all.
    """

    def __init__(self, tokenizer: Tokenizer, control_tokens: Sequence[str] | None = None) -> None:
        self.tokenizer = tokenizer
        controls = set(
            control_token_spellings(tokenizer) if control_tokens is None else control_tokens
        )
        spec = json.loads(tokenizer.to_str())
        spec["post_processor"] = None
        spec["truncation"] = None
        spec["padding"] = None
        bare = dict(
            spec,
            added_tokens=[a for a in spec.get("added_tokens", []) if a["content"] not in controls],
        )
        self._bare = Tokenizer.from_str(json.dumps(bare))
        self._sentinel: dict[str, str] = {}
        for i, entry in enumerate(spec.get("added_tokens", [])):
            if entry["content"] in controls:
                s = f"{_SENTINEL_MARK}{chr(_SENTINEL_BASE + i)}{_SENTINEL_MARK}"
                self._sentinel[entry["content"]] = s
                entry["content"] = s
        missing = controls - set(self._sentinel)
        if missing:
            raise ValueError(f"not added tokens of this tokenizer: {sorted(missing)}")
        self._plain = Tokenizer.from_str(json.dumps(spec))
        self._remap: dict[int, int] = {}
        for content, s in self._sentinel.items():
            sid, oid = self._plain.token_to_id(s), tokenizer.token_to_id(content)
            assert sid is not None and oid is not None
            self._remap[sid] = oid

    def encode_text(self, text: str) -> list[int]:
        """Ordinary text encoding: no control token (and no sentinel) is recognised."""
        return _ids(self._bare, text) if text else []

    def control_positions(self, ids: Sequence[int]) -> list[int]:
        """Indexes of the control-token ids in `ids` (an `encode` result): the i-th is the
        token of the i-th special span, since control spellings outside spans encode as text."""
        control = set(self._remap.values())
        return [i for i, t in enumerate(ids) if t in control]

    def encode(self, text: str, special_spans: Sequence[tuple[int, int]] = ()) -> list[int]:
        """Token ids of `text` with `special_spans` as control tokens and the rest as text."""
        spans = sorted(special_spans)
        for a, b in spans:
            if text[a:b] not in self._sentinel:
                raise ValueError(f"span {a}:{b} is not a control token: {text[a:b]!r}")
        if _SENTINEL_MARK in text:
            return self._encode_pieces(text, spans)
        parts, pos = [], 0
        for a, b in spans:
            parts.append(text[pos:a])
            parts.append(self._sentinel[text[a:b]])
            pos = b
        parts.append(text[pos:])
        ids = _ids(self._plain, "".join(parts))
        out = [self._remap.get(i, i) for i in ids]
        assert sum(i in self._remap for i in ids) == len(spans), "control span lost in encoding"
        return out

    def count_at_least(
        self,
        text: str,
        special_spans: Sequence[tuple[int, int]],
        stop_at: int,
        chunk_chars: int = COUNT_CHUNK_CHARS,
    ) -> int:
        """A lower bound of `len(self.encode(text, special_spans))`, computed chunk by chunk and
        stopping once it reaches `stop_at`.

        Why: one tokenizer call holds the GIL for its whole run (~1 s per 300k characters on a
        small vocabulary), so encoding a multi-megabyte prompt at once stalls the event loop
        for seconds, only to find it far over the context. Chunks of `chunk_chars` end at
        whitespace; each chunk's count can exceed its share of the whole by a few tokens (a
        word-start marker, a merge across the cut), so BOUNDARY_SLACK tokens per cut are taken
        off, which keeps the result a lower bound. Texts up to `chunk_chars` return 0 (encode
        them whole)."""
        if len(text) <= chunk_chars:
            return 0
        spans = sorted(special_spans)
        total, pos, cuts = 0, 0, 0
        while pos < len(text):
            end = min(len(text), pos + chunk_chars)
            if end < len(text):
                ws = text.rfind(" ", pos + chunk_chars // 2, end)
                end = ws if ws > pos else end
            end = _outside_spans(end, spans)
            piece_spans = [(a - pos, b - pos) for a, b in spans if pos <= a and b <= end]
            total += len(self.encode(text[pos:end], piece_spans))
            cuts += 1
            pos = end
            if total - BOUNDARY_SLACK * cuts >= stop_at:
                break
        return max(0, total - BOUNDARY_SLACK * cuts)

    def _encode_pieces(self, text: str, spans: Sequence[tuple[int, int]]) -> list[int]:
        # The text itself contains the sentinel character: encode the pieces separately so it
        # can never be read as a control token.
        out: list[int] = []
        pos = 0
        for a, b in spans:
            out += self.encode_text(text[pos:a])
            out.append(self.tokenizer.token_to_id(text[a:b]))
            pos = b
        out += self.encode_text(text[pos:])
        return out


def _ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """`tokenizer.encode(text, add_special_tokens=False).ids`, with the GIL released while the
    tokenizer runs: `encode` holds it throughout (785 ms for 262k characters on the tiny model's
    vocabulary, a stall of the server's event loop), `encode_batch` releases it (the same
    tokenization; the GIL is held only to read the text and to build the id list)."""
    return tokenizer.encode_batch([text], add_special_tokens=False)[0].ids  # type: ignore[no-any-return]


def _outside_spans(pos: int, spans: Sequence[tuple[int, int]]) -> int:
    """`pos`, moved to the end of the control span it would cut."""
    for a, b in spans:
        if a < pos < b:
            return b
    return pos


_ENCODERS: dict[int, PromptEncoder] = {}


def encode_prompt(
    tokenizer: Tokenizer | PromptEncoder,
    text: str,
    special_token_spans: Sequence[tuple[int, int]] = (),
) -> list[int]:
    """Encode rendered prompt text: `special_token_spans` (from `RenderedPrompt.special_spans`)
    become control-token ids, all other text - control spellings included - ordinary tokens.

    Encoders are cached per tokenizer object."""
    if isinstance(tokenizer, PromptEncoder):
        return tokenizer.encode(text, special_token_spans)
    enc = _ENCODERS.get(id(tokenizer))
    if enc is None or enc.tokenizer is not tokenizer:
        enc = _ENCODERS[id(tokenizer)] = PromptEncoder(tokenizer)
    return enc.encode(text, special_token_spans)
