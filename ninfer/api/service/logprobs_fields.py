"""Request fields that ask for log probabilities or for several choices.

- Chat Completions: `logprobs` (bool) and `top_logprobs` (0..20, needs `logprobs: true` when
  above 0, as OpenAI requires), llama.cpp's `n_probs` (0..20: logprobs with that many
  alternatives); `n` (1..MAX_CHOICES).
- Responses: `top_logprobs` (0..20) and `include: ["message.output_text.logprobs"]`; either
  one asks for the output_text parts' `logprobs` (top_logprobs alone sets how many
  alternatives, include alone gives none).

Each reader returns the engine's `SamplingParams.logprobs` value: None (not asked) or the number
of alternatives per token. Anthropic Messages has no log probabilities and no `n`.
"""

from __future__ import annotations

from typing import Any

from ninfer.api.wire import errors
from ninfer.api.wire.fields import get_bool, get_int
from ninfer.runtime.request import MAX_TOP_LOGPROBS

MAX_CHOICES = 16  # most choices one Chat Completions request may ask for (`n`)
INCLUDE_LOGPROBS = "message.output_text.logprobs"


def chat_logprobs(body: dict[str, Any]) -> int | None:
    """None, or the number of alternatives per token a Chat request asks for."""
    asked = get_bool(body, "logprobs")
    top = get_int(body, "top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
    n_probs = get_int(body, "n_probs", lo=0, hi=MAX_TOP_LOGPROBS)
    if top and not asked:
        raise errors.invalid_value(
            "top_logprobs", "needs logprobs: true (top_logprobs adds alternatives to logprobs)"
        )
    if asked:
        return top or 0
    if n_probs:  # llama.cpp: n_probs > 0 turns probabilities on
        return n_probs
    return None


def chat_choices(body: dict[str, Any]) -> int:
    """The `n` of a Chat request: how many choices to generate (1 when omitted)."""
    n = get_int(body, "n", lo=1, hi=MAX_CHOICES)
    return 1 if n is None else n


def responses_logprobs(body: dict[str, Any], include: list[Any]) -> int | None:
    """None, or the number of alternatives per output_text token a Responses request asks
    for (`include` already checked to hold strings)."""
    top = get_int(body, "top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
    if INCLUDE_LOGPROBS in include or top:
        return top or 0
    return None
