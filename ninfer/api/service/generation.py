"""The protocol-independent generation contract shared by every HTTP protocol.

Chat Completions, Responses and Anthropic Messages each parse their wire request into one
`GenerationRequest` (normalised messages in template form, tools, options, sampling) and
serialise the `GenerationEvent`s that `ModelService.generate()` yields (see service.py):

    Admitted → [PromptProgress…] → (ReasoningText | ContentText | ToolCallStart |
    ToolCallArgs | ToolCallDone)* → Finished

Text events are already split: reasoning vs content, tool-call markup parsed out, stop strings
removed, UTF-8 never split. Concatenating every delta of one kind gives exactly the final
value of that kind in `Finished`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ninfer.api.service.template_options import TemplateOptions

# The tool-call events are the parser's own (toolcalls.py is their source); the generation
# contract names them ToolCallStart / ToolCallArgs / ToolCallDone.
from ninfer.api.service.toolcalls import ToolCall, ToolCallStart
from ninfer.api.service.toolcalls import ToolCallArgumentsDelta as ToolCallArgs
from ninfer.api.service.toolcalls import ToolCallEnd as ToolCallDone
from ninfer.constrain import ConstraintSpec

__all__ = [
    "Admitted", "CachePoint", "ContentText", "FinishReason", "Finished", "GenerationEvent",
    "GenerationRequest", "PromptProgress", "ReasoningText", "SamplingOptions", "Timings",
    "ToolCall", "ToolCallArgs", "ToolCallDone", "ToolCallStart", "Usage", "content_units",
]  # fmt: skip

FinishReason = Literal["stop", "length", "tool_calls", "cancelled", "error"]


@dataclass(frozen=True)
class SamplingOptions:
    """Request-level sampling fields; None means "not given" (server flags, then the artifact's
    generation defaults apply, then --greedy forces temperature 0)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None


@dataclass(frozen=True)
class CachePoint:
    """An explicit prompt-cache breakpoint: the engine should keep a prefix checkpoint where the
    marked part ends in the rendered prompt (docs/serving.md, "Prompt caching hints", and the
    Anthropic cache_control rules). Exactly one form:

    - `CachePoint(message=i, offset=k)`: after the first k content units of template message i,
      the end of a marked text or media part. A text character is one unit and a media item
      (image, video) one unit, so k counts the same way over a string content and over a list
      of text/media items (`content_units`).
    - `CachePoint(message=i, tool_call=j)`: after message i's j-th tool call (Anthropic tool_use).
    - `CachePoint(tool=j)`: after the definition of tool j.

    The service keeps the checkpoint only where that boundary is an exact token frontier of the
    prompt; otherwise the hint is ignored (the prompt never changes).
    """

    message: int | None = None
    offset: int | None = None
    tool_call: int | None = None
    tool: int | None = None


def content_units(content: Any) -> int:
    """Length of a template message content in `CachePoint.offset` units: characters of a
    string, or over a list of items the characters of text items plus one per media item."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(
            len(it.get("text") or "") if it.get("type") == "text" else 1
            for it in content
            if isinstance(it, dict)
        )
    return 0


@dataclass(frozen=True)
class GenerationRequest:
    """One generation, protocol-free.

    messages: template-form dicts in input order — {"role": "system"|"developer"|"user"|
      "assistant"|"tool", "content": str, optional "reasoning_content": str, optional
      "tool_calls": [{"id", "type": "function", "function": {"name", "arguments": str|dict}}],
      optional "tool_call_id" on tool results}.
    tools: OpenAI-style function tools [{"type": "function", "function": {"name",
      "description", "parameters"}}] (member order preserved) or None.
    parse_tools: parse tool calls (the chat template's format) out of the output (False when
      tool_choice is none).
    callable_tools: the subset of `tools` whose calls the output may make (allowed_tools);
      None means all of `tools`. Calls of any other tool stay ordinary text.
    max_tokens: output cap; None = --default-max-tokens; 0 = prompt processing only.
    continue_final_message: the last message is an assistant prefill to continue (Anthropic).
    thinking_budget: explicit per-request thinking cap (Anthropic budget_tokens), else the
      server default applies to thinking-mode requests.
    cache_points: explicit cache breakpoints (`CachePoint`), at most four, in input order.
    implicit_cache_point: also want one at the end of the last message's text, before its
      closing tokens (OpenAI prompt caching's automatic candidate), when a write slot is left.
    session_key: engine session key of a conversation chain (Responses previous_response_id).
    stream: the client asked for a streamed response (recorded in the request log's shape).
    semantic_change: a Responses continuation whose explicit preserve_thinking differs from its
      parent's resolved value, so the history renders differently (request_start log flag).
    logprobs: None, or the number of alternatives per answer token whose log probabilities
      the content events and Finished carry (logprob_entries.py).
    constraint: what the output must follow (ninfer.constrain spec: JSON schema, grammar,
      forced or strict tool calls), enforced by constrained decoding after any thinking.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    parse_tools: bool = True
    callable_tools: list[dict[str, Any]] | None = None
    template_options: TemplateOptions = field(default_factory=TemplateOptions)
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    continue_final_message: bool = False
    thinking_budget: int | None = None
    cache_points: tuple[CachePoint, ...] = ()
    implicit_cache_point: bool = False
    session_key: str | None = None
    protocol: str = "chat"
    stream: bool = False
    ignore_eos: bool = False
    semantic_change: bool = False
    logprobs: int | None = None
    constraint: ConstraintSpec | None = None


@dataclass(frozen=True)
class Admitted:
    """The engine committed admission: the exact prompt split is known."""

    prompt_tokens: int
    cached_tokens: int
    reuse_path: str  # "root" | "checkpoint"


@dataclass(frozen=True)
class PromptProgress:
    total: int
    cache: int
    processed: int
    time_ms: float


@dataclass(frozen=True)
class Timings:
    """llama.cpp-compatible timings (milliseconds), as docs/serving.md ("Timings and progress") defines them."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    # terminal timings of a request that ran speculative rounds: draft tokens verified and
    # accepted (None: no draft work, and the fields are left out)
    draft_n: int | None = None
    draft_n_accepted: int | None = None

    def as_dict(self) -> dict[str, float | int]:
        def per(n: int, ms: float) -> tuple[float, float]:
            if n <= 0 or ms <= 0:
                return 0.0, 0.0
            return ms / n, 1000.0 * n / ms

        p_tok, p_sec = per(self.prompt_n, self.prompt_ms)
        d_n = max(self.predicted_n - 1, 0)
        d_tok, d_sec = per(d_n, self.predicted_ms)
        out: dict[str, float | int] = {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": p_tok,
            "prompt_per_second": p_sec,
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": d_tok,
            "predicted_per_second": d_sec,
        }
        if self.draft_n is not None and self.draft_n_accepted is not None:
            out["draft_n"] = self.draft_n
            out["draft_n_accepted"] = self.draft_n_accepted
        return out


@dataclass(frozen=True)
class ReasoningText:
    text: str
    timings: Timings | None = None  # cumulative snapshot at this delta (timings_per_token)


@dataclass(frozen=True)
class ContentText:
    """An answer delta; `logprobs` the wire entries of the tokens it completes (a request that
    asked; may come with empty text at the end of the output), else None."""

    text: str
    timings: Timings | None = None
    logprobs: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Finished:
    """The last event. `reason`: stop (EOS or stop string), length (max_tokens or context),
    tool_calls (the output ended in parsed tool calls), cancelled, error."""

    reason: FinishReason
    content: str
    reasoning: str
    tool_calls: tuple[ToolCall, ...]
    usage: Usage
    timings: Timings
    stop_sequence: str | None = None
    length_cause: str | None = None  # "max_tokens" | "context" when reason is length
    tool_parse: dict[str, Any] = field(default_factory=dict)
    generated_token_ids: tuple[int, ...] = ()
    error: BaseException | None = None
    logprobs: tuple[dict[str, Any], ...] | None = None  # every ContentText's entries, in order


GenerationEvent = (
    Admitted
    | PromptProgress
    | ReasoningText
    | ContentText
    | ToolCallStart
    | ToolCallArgs
    | ToolCallDone
    | Finished
)
