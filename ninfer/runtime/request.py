"""Plain data that crosses the engine's request interface.

A caller (the HTTP layer, `ninfer.LLM`) builds a `Request` of token ids and `SamplingParams`,
submits it, and reads back its events::

    AdmittedEvent → PromptProgressEvent… → TokensEvent… → FinishEvent

`AdmittedEvent` and the progress events come only once the request was admitted; a request
that never was (queue timeout, cancelled while waiting) sees only its `FinishEvent`.

Nothing here holds a tensor or a reference into the engine, so the engine core can later move
into another process without changing this contract.

No torch import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from ninfer.errors import NinferError
from ninfer.runtime.media_span import MediaSpan

FinishReason = Literal["stop", "length", "cancelled", "error"]
ReusePath = Literal["root", "checkpoint"]
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "cancelled", "error")
MAX_TOP_LOGPROBS = 20  # most alternatives a sampled token reports (OpenAI's bound)


class RequestError(NinferError):
    """A request the engine can never serve as given (empty prompt, prompt longer than the
    context, invalid sampling value). Maps to HTTP 400."""


class EngineOverloaded(NinferError):
    """max_concurrency + max_pending_requests requests are already outstanding. Maps to HTTP 429
    `server_overloaded`; the client should retry later."""


class QueueTimeout(NinferError):
    """The request was not admitted within pending_timeout_ms of its arrival. Maps to HTTP 503
    `request_queue_timeout`."""


class EngineError(NinferError):
    """The executor or sampler failed while running this request's step."""


@dataclass(frozen=True)
class SamplingParams:
    """How to choose each next token; the same meanings as the HTTP fields.

    temperature 0 is greedy (exact argmax). top_k <= 0, top_p 1.0 and min_p 0.0 disable those
    filters. Presence/frequency penalties apply to tokens generated so far (OpenAI semantics).
    `seed` None means a fresh random seed. `stop` strings are matched by the caller, which then
    calls `Engine.finish(handle, "stop", ...)`; the engine never looks at them.

    `logprobs` None: no log probabilities; k (0..20): each sampled token's TokensEvent carries a
    `TokenLogprob` with its log probability and the k most likely tokens (runtime/executors/logprobs.py
    says which distribution they describe).
    """

    max_tokens: int | None = None  # None: the engine's default_max_tokens
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and (
            isinstance(self.max_tokens, bool)
            or not isinstance(self.max_tokens, int)
            or self.max_tokens < 1
        ):
            raise RequestError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        _check_float("temperature", self.temperature, 0.0, 100.0)
        _check_float("top_p", self.top_p, 0.0, 1.0)
        if self.top_p == 0.0:  # keeps only the most likely token: argmax, as over HTTP
            object.__setattr__(self, "temperature", 0.0)
            object.__setattr__(self, "top_p", 1.0)
        _check_float("min_p", self.min_p, 0.0, 1.0)
        _check_float("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_float("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise RequestError(f"top_k must be an integer >= 0 (0 or -1: off), got {self.top_k!r}")
        if self.seed is not None and (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or not -(1 << 63) <= self.seed < 1 << 63
        ):
            raise RequestError(f"seed must be a signed 64-bit integer, got {self.seed!r}")
        if not isinstance(self.ignore_eos, bool):
            raise RequestError(f"ignore_eos must be true or false, got {self.ignore_eos!r}")
        lp = self.logprobs
        if lp is not None and (
            isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= MAX_TOP_LOGPROBS
        ):
            raise RequestError(
                f"logprobs must be None or an integer in [0, {MAX_TOP_LOGPROBS}], got {lp!r}"
            )
        stop = (
            () if self.stop is None else (self.stop,) if isinstance(self.stop, str) else self.stop
        )
        try:  # a lone string is one stop sequence, not characters
            stop = tuple(stop)
        except TypeError:
            raise RequestError(
                f"stop must be a string or a list of strings, got {stop!r}"
            ) from None
        for s in stop:
            if not isinstance(s, str) or not s:
                raise RequestError(f"stop strings must be non-empty strings, got {s!r}")
        object.__setattr__(self, "stop", stop)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Request:
    """One generation request, as token ids.

    `checkpoint_positions`: token counts (prefix lengths) after which the engine should keep a
    reusable checkpoint for later requests — the caller marks semantic boundaries such as the
    end of the conversation before the assistant turn. Hybrid (recurrent) models can only reuse
    a prefix at such a checkpoint or at the retained end of a finished request; attention-only
    models reuse any matching full KV page. Positions are rounded down to a page boundary.

    `session_key`: a bounded key shared by a conversation chain; the engine keeps one retained
    endpoint per key, replacing the previous one when a later request of the chain finishes.

    `arrival_s`: `time.monotonic()` at submission (None: the engine's clock then); the
    request's timings count from it. `prepared_from_s`: when the caller began preparing it
    (rendering, tokenising, media); the pending timeout counts from it, so that preparation
    spends the same admission deadline (None: from `arrival_s`).

    Thinking budget: with `thinking_budget` set, the output starts inside an open thinking block.
    The engine counts output tokens while thinking is open; a sampled token in
    `thinking_close_ids` (`</think>`) closes it naturally. When `thinking_budget` tokens were
    written and thinking is still open (and the request did not just finish), the engine appends
    `thinking_suffix_ids` (the early-close guidance ending with `</think>`) to the sequence
    without sampling, publishes them as ordinary output tokens (they count in usage and in
    max_tokens) and generation continues after them. When the suffix plus one more token no
    longer fits max_tokens or the context, the request finishes with 'length' instead of
    inserting part of it (callers check that capacity up front).

    `prompt_only`: process the prompt (prefill, checkpoints, prefix publication) and finish with
    'length' without committing an output token (an HTTP max_tokens of 0).

    `media`: the prompt's images and videos, in prompt order, non-overlapping, each inside the
    prompt (see media_span.py).

    `constraint`: a compiled output constraint (`ninfer.constrain.Constraint`: JSON schema,
    grammar, forced tool call) or None. Opaque to the scheduler; the engine masks each sampled
    token with it and advances it by every committed output token, thinking-budget suffix
    included. The request finishes with 'stop' once the constraint is complete (nothing but
    the end may follow), and with 'error' when it allows no next token.
    """

    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    checkpoint_positions: tuple[int, ...] = ()
    session_key: str | None = None
    arrival_s: float | None = None
    prepared_from_s: float | None = None
    thinking_budget: int | None = None
    thinking_close_ids: tuple[int, ...] = ()
    thinking_suffix_ids: tuple[int, ...] = ()
    prompt_only: bool = False
    media: tuple[MediaSpan, ...] = ()
    constraint: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_token_ids", tuple(int(t) for t in self.prompt_token_ids))
        object.__setattr__(
            self, "checkpoint_positions", tuple(int(p) for p in self.checkpoint_positions)
        )
        if not self.prompt_token_ids:
            raise RequestError("the prompt is empty; send at least one token")
        if min(self.prompt_token_ids) < 0:
            raise RequestError("prompt token ids must be non-negative")
        for name in ("thinking_close_ids", "thinking_suffix_ids"):
            object.__setattr__(self, name, tuple(int(t) for t in getattr(self, name)))
        object.__setattr__(self, "media", tuple(self.media))
        end = 0
        for span in self.media:
            if span.offset < end or span.end > len(self.prompt_token_ids):
                raise RequestError(
                    f"media span at {span.offset}..{span.end} overlaps another or leaves the prompt"
                )
            end = span.end
        budget = self.thinking_budget
        if budget is not None:
            if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
                raise RequestError(f"thinking_budget must be a positive integer, got {budget!r}")
            if not self.thinking_suffix_ids:
                raise RequestError("a thinking budget needs the suffix that closes thinking")


@dataclass(frozen=True)
class Usage:
    """Token accounting of one request (final values in `FinishEvent`).

    cached_tokens: prompt tokens reused from the prefix cache on initial binding.
    reuse_path: 'checkpoint' when initial binding resumed from a retained prefix (KV pages, plus
    a recurrent-state checkpoint on hybrid models), 'root' when it prefilled from the start.
    prefill_tokens: prompt tokens actually computed by the initial prefill.
    replayed_tokens: tokens recomputed to rebuild state after pauses (not new output).
    thinking_tokens: output tokens counted against the thinking budget (0 without a budget).
    thinking_forced_tokens: closing-suffix tokens committed unsampled because the budget ran out.
    """

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reuse_path: ReusePath = "root"
    prefill_tokens: int = 0
    replayed_tokens: int = 0
    preemptions: int = 0
    snapshot_restores: int = 0  # pauses recovered from a host snapshot
    replay_restores: int = 0  # pauses recovered by recomputation
    thinking_tokens: int = 0
    thinking_forced_tokens: int = 0


# Timings.first_output: the parts `engine_elapsed_seconds` splits into (they add up to it)
FIRST_OUTPUT_PARTS = (
    "initial_queue_seconds", "initial_binding_seconds", "paused_seconds", "resident_seconds",
)  # fmt: skip


@dataclass(frozen=True)
class Timings:
    """Seconds, measured on the engine worker from the request's arrival.

    queue_s: arrival -> first admission. ttft_s: arrival -> first committed token.
    prefill_s: admission -> first token. decode_s: first token -> finish. paused_s: total time
    spent paused for resource pressure. None where the request never reached that point.
    exposure: engine worker wall time from initial admission to the finish (every resident
    request sees a whole shared step): {"host": {phase: s}, "device_wait": s, "decode_host": s,
    "decode_device_wait": s} (ninfer.runtime.host_work); None when never admitted.
    units: the request's work units (`decode_rounds`, `prefill` chunks, `replay` among them,
    `control`: snapshot saves and restores). first_output: observations frozen right before
    its first output tokens were published (None without output). prefill_gpu_s: device time
    of the steps it had a prefill-class chunk in (None without one, or off CUDA). transfers:
    its snapshot copies per "resource.direction": {"bytes", "operations"}. speculative: the
    request's speculative counters (runtime/sequence.py `SpecCounts.as_dict`), None without
    --spec.
    """

    queue_s: float | None
    ttft_s: float | None
    prefill_s: float | None
    decode_s: float | None
    total_s: float
    paused_s: float = 0.0
    exposure: dict[str, Any] | None = None
    units: dict[str, int] = field(default_factory=dict)
    first_output: dict[str, Any] | None = None
    prefill_gpu_s: float | None = None
    transfers: dict[str, dict[str, int]] = field(default_factory=dict)
    speculative: dict[str, Any] | None = None


@dataclass(frozen=True)
class AdmittedEvent:
    """Initial binding committed: the exact reused prompt prefix is known. Published once,
    before any progress or token event. `cached_tokens` + the tokens the prefill computes =
    `prompt_tokens`; `reuse_path` as in `Usage`."""

    prompt_tokens: int
    cached_tokens: int
    reuse_path: ReusePath


@dataclass(frozen=True)
class PromptProgressEvent:
    """A prefill chunk of the initial prefill committed (never sent for replay after a pause).

    `processed` (prompt tokens whose KV exist, counting the `cache` reused ones) only grows; the
    last event has processed == total and precedes the first TokensEvent. `elapsed_s`: engine
    clock seconds from admission to this commit. Consecutive unread progress events are
    coalesced into the latest one."""

    total: int
    cache: int
    processed: int
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class SchedulingEvent:
    """A pause-cycle boundary of a request paused under resource pressure (the request log's
    request_scheduling): `boundary` one of SCHEDULING_BOUNDARIES, `preemption_index` the cycle
    (1 for the first pause), `route` "snapshot" | "replay" (None while a pause has not chosen
    one), `steady_ns` the engine clock on the worker, `elapsed_ns` since submission, `progress`
    {"global": ..., "request": ...} prefill / decode / replayed token counters at that moment."""

    boundary: str
    preemption_index: int
    route: str | None
    steady_ns: int
    elapsed_ns: int
    progress: dict[str, dict[str, int]]


# the order of one pause cycle; replay_complete only when it had positions to recompute; a
# preempted request's last event is "terminal", at its finish (whichever cycle it is in)
SCHEDULING_BOUNDARIES = (
    "pause_started", "paused", "restore_started", "restored", "replay_complete",
    "recovery_complete", "terminal",
)  # fmt: skip


@dataclass(frozen=True)
class TokenLogprob:
    """The log probability of one sampled token and of the `top` most likely tokens at its
    position ((token id, logprob) pairs, most likely first, as many as the request's
    `SamplingParams.logprobs`). Values are natural logs, -inf for a token the distribution
    excludes (top-k, top-p, min-p)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class TokensEvent:
    """Newly committed output token ids, in order. Never republished (replay after a pause
    rebuilds state without emitting). May include EOS; the caller withholds it from text.
    Includes a thinking-budget suffix the engine committed without sampling. `prompt_s` and
    `decode_s`: the request's cumulative engine-clock prompt time (admission to the first output
    commit) and generation time (first to latest output commit) at this event's last token, as
    the FinishEvent's `Timings` measure them (None when not measured). `logprobs`: for a request
    that set `SamplingParams.logprobs`, one entry per token id (None for a token committed
    without sampling, such as a thinking-budget suffix); None otherwise."""

    token_ids: tuple[int, ...]
    prompt_s: float | None = None
    decode_s: float | None = None
    logprobs: tuple[TokenLogprob | None, ...] | None = None


@dataclass(frozen=True)
class FinishEvent:
    """The last event of every request. `error` is set when reason is 'error' (QueueTimeout,
    EngineError, ...). `token_ids` holds every committed output token (truncated to what the
    caller kept when it called `finish(..., keep_tokens=N)`)."""

    reason: FinishReason
    usage: Usage
    timings: Timings
    token_ids: tuple[int, ...] = ()
    error: BaseException | None = None


RequestEvent = AdmittedEvent | PromptProgressEvent | SchedulingEvent | TokensEvent | FinishEvent


def _check_float(name: str, value: object, lo: float, hi: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise RequestError(f"{name} must be a number, got {value!r}")
    if not lo <= value <= hi:
        raise RequestError(f"{name} must be in [{lo}, {hi}], got {value}")


@dataclass(frozen=True)
class RequestOutput:
    """The collected result of one request (`RequestHandle.result()`)."""

    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    error: BaseException | None = None
