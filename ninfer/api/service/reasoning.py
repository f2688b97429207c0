"""Splitting Qwen-style model output into reasoning and answer text, incrementally.

The model thinks inside `<think>` ... `</think>` before answering. Either the prompt already
opened the block (Qwen3.5/3.6 templates end the generation prompt with `<think>\\n`, so the
output starts inside thinking: `starts_in_thinking=True`), or the model may open it itself as the
very first thing it writes (older Qwen3 templates).

`ReasoningParser` contract:

- `feed(text)` returns a `ReasoningDelta(reasoning, content)`; within one delta the reasoning
  precedes the content (reasoning never resumes once content has begun).
- Held back: only a possible partial tag at the end of the stream, plus newlines at the end of the
  reasoning (they may be the separator before `</think>`).
- Formatting newlines are dropped the way the Qwen templates re-create them on replay
  (`<think>\\n` + reasoning.strip("\\n") + `\\n</think>\\n\\n` + content.lstrip("\\n")): newlines
  right after `<think>`, right before `</think>`, and right after `</think>`.
- `<think>` is recognised only at the start of the output (after optional whitespace) and only
  when the prompt did not open the block; a later `<think>` or a stray `</think>` in the answer is
  ordinary content.
- `finish()` flushes what was held: a partial tag inside reasoning stays reasoning text.
- The result does not depend on how the stream is chunked.

Also here: detecting whether a rendered prompt starts the response in thinking mode, and the
thinking-budget helpers (`--default-thinking-budget`, Anthropic `budget_tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from tokenizers import Tokenizer

from ninfer.api.service.prompt_encoding import encode_prompt

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# Qwen's canonical early-close guidance, committed when the thinking budget runs out.
THINKING_BUDGET_GUIDANCE = (
    "\n\nConsidering the limited time by the user, I have to give the solution based on the "
    "thinking directly now.\n"
)
THINKING_BUDGET_SUFFIX = THINKING_BUDGET_GUIDANCE + THINK_CLOSE


@dataclass(frozen=True)
class ReasoningDelta:
    """Text produced by one step: reasoning first, then answer content."""

    reasoning: str = ""
    content: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)


class _Mode(Enum):
    START = "start"  # nothing decided yet: the output may open <think>
    REASONING = "reasoning"
    AFTER_CLOSE = "after_close"  # just closed: drop leading newlines of the answer
    CONTENT = "content"


def _partial_suffix(buf: str, tag: str) -> int:
    """Length of the longest suffix of `buf` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(buf)), 0, -1):
        if buf.endswith(tag[:n]):
            return n
    return 0


class ReasoningParser:
    """Incremental reasoning/content splitter (see module docstring)."""

    def __init__(
        self,
        starts_in_thinking: bool,
        *,
        open_tag: str = THINK_OPEN,
        close_tag: str = THINK_CLOSE,
    ) -> None:
        self.open_tag = open_tag
        self.close_tag = close_tag
        self._mode = _Mode.REASONING if starts_in_thinking else _Mode.START
        self._buf = ""  # held text, meaning depends on the mode
        self._reasoning_started = False  # some reasoning text was emitted (leading \n dropped)

    @property
    def in_reasoning(self) -> bool:
        """True while the model is (or may still be) writing reasoning; used to count
        reasoning tokens as they are accepted."""
        return self._mode is _Mode.REASONING

    @property
    def reasoning_closed(self) -> bool:
        """True once `</think>` was seen (or the output started without thinking)."""
        return self._mode in (_Mode.AFTER_CLOSE, _Mode.CONTENT)

    def feed(self, text: str) -> ReasoningDelta:
        """Consume the next piece of model text."""
        reasoning: list[str] = []
        content: list[str] = []
        buf = self._buf + text
        self._buf = ""
        while buf:
            if self._mode is _Mode.START:
                stripped = buf.lstrip()
                if stripped.startswith(self.open_tag):
                    self._mode = _Mode.REASONING
                    buf = stripped[len(self.open_tag) :]
                    continue
                if self.open_tag.startswith(stripped):
                    self._buf = buf  # whitespace and/or a partial "<think>": undecided
                    break
                self._mode = _Mode.CONTENT
            elif self._mode is _Mode.REASONING:
                if not self._reasoning_started:
                    buf = buf.lstrip("\n")
                    if not buf:
                        break
                i = buf.find(self.close_tag)
                if i >= 0:
                    body = buf[:i].rstrip("\n")
                    if body:
                        reasoning.append(body)
                        self._reasoning_started = True
                    buf = buf[i + len(self.close_tag) :]
                    self._mode = _Mode.AFTER_CLOSE
                    continue
                keep = _partial_suffix(buf, self.close_tag)
                body = buf[: len(buf) - keep]
                stripped = body.rstrip("\n")
                keep += len(body) - len(stripped)
                if stripped:
                    reasoning.append(stripped)
                    self._reasoning_started = True
                self._buf = buf[len(buf) - keep :]
                break
            elif self._mode is _Mode.AFTER_CLOSE:
                buf = buf.lstrip("\n")
                if buf:
                    self._mode = _Mode.CONTENT
            else:
                content.append(buf)
                break
        return ReasoningDelta("".join(reasoning), "".join(content))

    def finish(self) -> ReasoningDelta:
        """End of output: release held text."""
        buf, self._buf = self._buf, ""
        if self._mode is _Mode.REASONING:
            # Trailing newlines of unclosed reasoning are formatting; a partial tag is text.
            body = buf.rstrip("\n")
            if body and not self._reasoning_started:
                body = body.lstrip("\n")
            return ReasoningDelta(reasoning=body)
        if self._mode is _Mode.START:
            self._mode = _Mode.CONTENT
            return ReasoningDelta(content=buf)
        return ReasoningDelta()


def split_reasoning(text: str, starts_in_thinking: bool) -> ReasoningDelta:
    """Non-streaming convenience: split a complete output."""
    p = ReasoningParser(starts_in_thinking)
    a = p.feed(text)
    b = p.finish()
    return ReasoningDelta(a.reasoning + b.reasoning, a.content + b.content)


def prompt_starts_in_thinking(
    prompt: str,
    special_spans: Sequence[tuple[int, int]] | None = None,
    open_tag: str = THINK_OPEN,
) -> bool:
    """True when a rendered prompt ends (ignoring trailing whitespace) with an opened thinking
    block, i.e. the template put the response in thinking mode.

    With `special_spans` (from `RenderedPrompt`), the tag must be template markup: a `<think>`
    quoted at the end of an assistant prefill does not count.
    """
    end = len(prompt.rstrip())
    if not prompt[:end].endswith(open_tag):
        return False
    if special_spans is None:
        return True
    return (end - len(open_tag), end) in set(special_spans)


def resolve_thinking_budget(
    starts_in_thinking: bool,
    request_budget: int | None = None,
    default_budget: int | None = None,
) -> int | None:
    """Thinking-token cap for one request: none for non-thinking requests; otherwise the
    request's own budget (Anthropic `budget_tokens`) or the server default."""
    if not starts_in_thinking:
        return None
    if request_budget is not None:
        return request_budget
    return default_budget


def thinking_budget_suffix_ids(tokenizer: Tokenizer) -> list[int]:
    """Token ids of the early-close guidance plus `</think>` (the close marker encoded as its
    control token, the guidance as text), committed when a thinking budget is exhausted."""
    start = len(THINKING_BUDGET_GUIDANCE)
    spans = ((start, start + len(THINK_CLOSE)),)
    return encode_prompt(tokenizer, THINKING_BUDGET_SUFFIX, spans)
