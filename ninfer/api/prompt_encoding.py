"""Prompt encoding: rendered prompt text plus control-token spans -> token ids.

`encode_prompt` (and `PromptEncoder`, which it caches per tokenizer) encodes the text a
`ChatTemplate` rendered (ninfer.api.template): the `RenderedPrompt.special_spans` become their
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
        return self._bare.encode(text, add_special_tokens=False).ids if text else []

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
        ids = self._plain.encode("".join(parts), add_special_tokens=False).ids
        out = [self._remap.get(i, i) for i in ids]
        assert sum(i in self._remap for i in ids) == len(spans), "control span lost in encoding"
        return out

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
