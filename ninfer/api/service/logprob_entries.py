"""Engine `TokenLogprob`s as the OpenAI wire entries, handed out with the answer text.

An entry is the shape Chat Completions (`choices[].logprobs.content[]`) and Responses
(`output_text.logprobs[]`) share::

    {"token": str, "logprob": float, "bytes": [int], "top_logprobs": [{"token", "logprob", "bytes"}]}

`token` is the token's text; a token that holds only part of a UTF-8 character shows its bytes
as `\\xNN` escapes (its `bytes` are exact). A logprob of -inf (a token the sampling filters
removed) is written -9999.0, the value OpenAI documents for "very unlikely".

`ContentLogprobs` decides which output tokens are answer tokens and when each entry goes out.
A token is an answer token unless it was read inside a reasoning block (the same count as
`reasoning_tokens`, plus a token that opens one) or is an end-of-sequence token withheld from
the text. Its entry is released with the content delta that completes the token's text, so
that a streamed delta carries the entries of the tokens it shows (a delta held back for a stop
string or a tool-call marker releases them later). At the end of the output the entries still
held are released too, except when the output ended in tool calls: those are the call's
markup, which is not answer text. The entries of a stream therefore concatenate to the
aggregate response's list.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from tokenizers import Tokenizer

from ninfer.api.service.detokenize import _token_bytes
from ninfer.runtime.request import TokenLogprob

UNLIKELY = -9999.0  # OpenAI's value for a logprob too small to report


class EntryFormatter:
    """`TokenLogprob` -> wire entry, token texts cached per id."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._bytes_of = _token_bytes(tokenizer)
        self._cache: dict[int, tuple[str, tuple[int, ...]]] = {}  # at most the vocabulary

    def _token(self, tid: int) -> tuple[str, tuple[int, ...]]:
        hit = self._cache.get(tid)
        if hit is not None:
            return hit
        if self._bytes_of is not None:
            raw = self._bytes_of(tid)
        else:  # a tokenizer of another family: its decoded text
            raw = self._tok.decode([tid], skip_special_tokens=False).encode()
        hit = self._cache[tid] = (raw.decode("utf-8", errors="backslashreplace"), tuple(raw))
        return hit

    def _one(self, tid: int, logprob: float) -> dict[str, Any]:
        text, raw = self._token(tid)
        value = logprob if math.isfinite(logprob) else UNLIKELY
        return {"token": text, "logprob": max(value, UNLIKELY), "bytes": list(raw)}

    def entry(self, lp: TokenLogprob) -> dict[str, Any]:
        out = self._one(lp.token_id, lp.logprob)
        out["top_logprobs"] = [self._one(t, v) for t, v in lp.top]
        return out


class ContentLogprobs:
    """The answer tokens' entries of one generation (see the module docstring).

    Call `add` once per output token read, `release` with each content delta in output order,
    then `finish`. `entries` is every entry released so far."""

    def __init__(self, formatter: EntryFormatter) -> None:
        self._fmt = formatter
        self._held: deque[tuple[int, dict[str, Any]]] = deque()  # (text end, entry)
        self._answer_chars = 0  # characters of the answer tokens' text so far
        self._content_chars = 0  # characters of content deltas released so far
        self.entries: list[dict[str, Any]] = []

    def add(self, lp: TokenLogprob | None, chars: int, answer: bool) -> None:
        """A token was read: `chars` characters of detokenized text; `answer` False for a
        reasoning or withheld end-of-sequence token. A token committed without sampling
        (`lp` None) has no entry."""
        if not answer:
            return
        self._answer_chars += chars
        if lp is not None:
            self._held.append((self._answer_chars, self._fmt.entry(lp)))

    def release(self, content: str) -> list[dict[str, Any]]:
        """The entries whose token text `content` (the next content delta) completes."""
        self._content_chars += len(content)
        out: list[dict[str, Any]] = []
        while self._held and self._held[0][0] <= self._content_chars:
            out.append(self._held.popleft()[1])
        self.entries += out
        return out

    def finish(self, tool_calls: bool) -> list[dict[str, Any]]:
        """The entries still held at the end of the output: all of them, or none when the
        output ended in tool calls."""
        out = [] if tool_calls else [e for _, e in self._held]
        self._held.clear()
        self.entries += out
        return out
