"""The scheduler's view of one request: two counters and the resources it holds.

    tokens   = prompt + committed output           known    = len(tokens)
    computed = positions whose KV (and state) exist in this sequence's pages / lane

    prompt ████████████████ output ▓▓▓▓▓
           |<------ computed ------>|.|       known - computed == 1: decode-ready
                                      `- last sampled token, fed by the next decode step

Prefill, chunked prefill, prefix hits and replay after a pause are all "advance `computed`
towards `known`"; the last unit of that advance returns logits and samples one new token. A
restore from a host snapshot sets `computed` back to the saved frontier without computing.
`high_water` is the furthest `computed` ever reached: recomputing below it is replay.

No torch import.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ninfer.runtime.logprob_ledger import LogprobLedger
from ninfer.runtime.media_span import MediaSpan
from ninfer.runtime.prefix_cache import CacheNode
from ninfer.runtime.request import (
    FIRST_OUTPUT_PARTS,
    FinishEvent,
    Request,
    ReusePath,
    Timings,
    TokensEvent,
    Usage,
)
from ninfer.runtime.step import SeqChunk
from ninfer.runtime.thinking import ThinkingBudget
from ninfer.runtime.vision.mrope import MRope

if TYPE_CHECKING:
    from ninfer.runtime.preemption import SavedContext


class SeqStatus(enum.Enum):
    WAITING = "waiting"  # not yet admitted (fresh)
    RUNNING = "running"  # resident: holds a lane and pages
    PAUSED = "paused"  # admitted once, evicted under pressure, waits to be restored
    FINISHED = "finished"


@dataclass
class SpecCounts:
    """A request's speculative-decoding counters (the request log's `speculative` object).

    rounds: verify chunks committed; drafted: draft tokens verified; accepted: of those, the
    ones verification accepted; fallback_steps: decode steps it ran without drafts (window 0,
    no draft, no pages); accepted_per_position[i]: rounds whose draft i (0-based) was accepted.
    """

    backend: str
    draft_window: int
    rounds: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    fallback_steps: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "draft_window": self.draft_window,
            "rounds": self.rounds,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "fallback_steps": self.fallback_steps,
            "accepted_per_position": list(self.accepted_per_position),
        }


@dataclass(eq=False)
class Sequence:
    """Mutable per-request state, owned by the scheduler (one thread)."""

    seq_id: int
    request: Request
    max_tokens: int
    arrival_s: float
    deadline_s: float
    tokens: list[int]
    num_prompt: int
    capture_at: list[int]  # page-aligned positions still to checkpoint, ascending
    status: SeqStatus = SeqStatus.WAITING
    computed: int = 0
    high_water: int = 0
    lane: int | None = None
    # its recurrent state's slot (hybrid models): the lane's own, or after a verify round one of
    # the lane's k + 1 round slots (Residency.round_slots); set while resident
    slot: int | None = None
    pages: list[int] = field(default_factory=list)
    nodes: list[CacheNode] = field(default_factory=list)  # cache node of each full page, in order
    rolling_slot: int | None = None  # private checkpoint of the latest page boundary (hybrid)
    rolling_pos: int = 0
    bypassed: int = 0  # times a later request was admitted ahead of this one while it waited
    thinking: ThinkingBudget | None = None  # thinking-budget state (Request.thinking_budget)
    spec: SpecCounts | None = None  # speculative counters (an engine with --spec)
    saved: SavedContext | None = None  # paused with a host snapshot (preemption.py)
    mrope: MRope | None = None  # 3-axis positions of a prompt with media (Request.media)
    # usage and timing
    bound_once: bool = False
    cached_tokens: int = 0
    reuse_path: ReusePath = "root"
    prefill_tokens: int = 0
    replayed_tokens: int = 0
    preemptions: int = 0
    snapshot_restores: int = 0
    replay_restores: int = 0
    # work units of this request (request log: engine_timing, first_output_timing)
    decode_rounds: int = 0  # steps with a decode row of it
    prefill_units: int = 0  # steps with a multi-token chunk of it (prompt, replay, forced suffix)
    replay_units: int = 0  # of those, chunks rebuilding state it had before a pause
    control_units: int = 0  # device operations for it outside a batch: snapshot saves, restores
    transfers: dict[str, dict[str, int]] = field(default_factory=dict)  # resource.direction
    prefill_gpu_s: float | None = None  # device time of its prefill-class steps (CUDA only)
    bind_s: float = 0.0  # its initial binding (prefix match, pages, lane)
    first_output: dict[str, Any] | None = None  # frozen before its first output was published
    admitted_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None  # the latest output commit
    finished_s: float | None = None
    paused_since_s: float | None = None
    pause_route: str | None = None  # the current / last pause cycle's route
    recovering: bool = False  # restored, no fresh unit committed since
    paused_s: float = 0.0
    finish_reason: str | None = None
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.mrope = MRope.of(self.request.media)

    def media_in(self, start: int, end: int) -> tuple[MediaSpan, ...]:
        """The prompt's media spans overlapping positions start..end-1."""
        return tuple(m for m in self.request.media if m.offset < end and m.end > start)

    @property
    def known(self) -> int:
        return len(self.tokens)

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.num_prompt

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.num_prompt :]

    @property
    def outputs(self) -> OutputIds:
        """The output tokens as a view of `tokens` (no copy): what the per-step rows (sampling,
        constraints, verification) read, so a step's host work does not grow with the output."""
        return OutputIds(self.tokens, self.num_prompt)

    @property
    def decode_ready(self) -> bool:
        """Resident and only the last sampled token is left to feed."""
        return (
            self.status is SeqStatus.RUNNING
            and self.known - self.computed == 1
            and (self.num_output > 0)
        )

    @property
    def replaying(self) -> bool:
        """Resident and rebuilding state it had before a pause."""
        return self.status is SeqStatus.RUNNING and self.computed < self.high_water

    @property
    def prefilling(self) -> bool:
        """Resident and computing its prompt for the first time."""
        return (
            self.status is SeqStatus.RUNNING
            and self.num_output == 0
            and self.computed >= self.high_water
        )


def _prefill_s(seq: Sequence) -> float | None:
    """Admission to the first output commit (the prompt time of every timing report)."""
    first, admitted = seq.first_token_s, seq.admitted_s
    return None if first is None or admitted is None else first - admitted


def tokens_event(
    seq: Sequence, tokens: tuple[int, ...], logprobs: LogprobLedger | None = None
) -> TokensEvent:
    """Newly committed output tokens with the request's cumulative timings at the latest, and
    their log probabilities taken from `logprobs` (a request that asks for them)."""
    first, last = seq.first_token_s, seq.last_token_s
    return TokensEvent(
        tokens,
        prompt_s=_prefill_s(seq),
        decode_s=None if first is None or last is None else last - first,
        logprobs=None if logprobs is None else logprobs.take(seq.seq_id, tokens),
    )


def finish_event(seq: Sequence, exposure: dict[str, Any] | None = None) -> FinishEvent:
    """The terminal event of a finished sequence: reason, usage, timings (with the engine's
    host / device exposure of the request, when measured) and the output ids."""
    usage = Usage(
        prompt_tokens=seq.num_prompt,
        completion_tokens=seq.num_output,
        cached_tokens=seq.cached_tokens,
        reuse_path=seq.reuse_path,
        prefill_tokens=seq.prefill_tokens,
        replayed_tokens=seq.replayed_tokens,
        preemptions=seq.preemptions,
        snapshot_restores=seq.snapshot_restores,
        replay_restores=seq.replay_restores,
        thinking_tokens=seq.thinking.used if seq.thinking is not None else 0,
        thinking_forced_tokens=len(seq.thinking.suffix)
        if seq.thinking is not None and seq.thinking.forced
        else 0,
    )
    end = seq.finished_s if seq.finished_s is not None else seq.arrival_s
    first, admitted = seq.first_token_s, seq.admitted_s
    timings = Timings(
        queue_s=None if admitted is None else admitted - seq.arrival_s,
        ttft_s=None if first is None else first - seq.arrival_s,
        prefill_s=_prefill_s(seq),
        decode_s=None if first is None else end - first,
        total_s=end - seq.arrival_s,
        paused_s=seq.paused_s,
        exposure=exposure,
        units=unit_counts(seq),
        first_output=seq.first_output,
        prefill_gpu_s=seq.prefill_gpu_s,
        transfers={k: dict(v) for k, v in seq.transfers.items()},
        speculative=seq.spec.as_dict() if seq.spec is not None else None,
    )
    reason = seq.finish_reason or "error"
    return FinishEvent(reason, usage, timings, tuple(seq.output_ids), seq.error)  # type: ignore[arg-type]


def first_output(seq: Sequence, now: float, exposure: dict[str, Any] | None) -> dict[str, Any]:
    """What the request had been through when its first output is about to be published (at
    engine clock `now`): engine time since submission split into initial queue, initial
    binding, pauses and the resident rest, the worker time it was exposed to (`exposure`), and
    its own prefill / replay work (the request log's first_output_timing)."""
    elapsed = now - seq.arrival_s
    queue = elapsed if seq.admitted_s is None else seq.admitted_s - seq.arrival_s
    resident = max(elapsed - queue - seq.bind_s - seq.paused_s, 0.0)
    return {
        "engine_elapsed_seconds": elapsed,
        **dict(zip(FIRST_OUTPUT_PARTS, (queue, seq.bind_s, seq.paused_s, resident))),
        "exposure": exposure,
        "units": unit_counts(seq),
        "prefill_tokens": seq.prefill_tokens,
        "replayed_tokens": seq.replayed_tokens,
    }


def count_prefill_gpu(
    seqs: Iterable[Sequence], chunks: Iterable[SeqChunk], gpu: float | None
) -> None:
    """Add a finished prefill-class step's device time `gpu` (None: not measured) to each
    request with a prefill-class chunk in it (several tokens, or its first output)."""
    if gpu is None:
        return
    for seq, chunk in zip(seqs, chunks):
        if len(chunk.token_ids) > 1 or seq.num_output == 0:
            seq.prefill_gpu_s = (seq.prefill_gpu_s or 0.0) + gpu


def unit_counts(seq: Sequence) -> dict[str, int]:
    """The request's work units so far: decode rounds, prefill-class chunks (replay among them)
    and control operations (snapshot saves and restores)."""
    return {
        "decode_rounds": seq.decode_rounds,
        "prefill": seq.prefill_units,
        "replay": seq.replay_units,
        "control": seq.control_units,
    }


def count_unit(seq: Sequence, start_pos: int, length: int) -> None:
    """Count a committed chunk of `length` tokens from `start_pos` among the request's units:
    a decode round (one token after its first output), else a prefill-class chunk (prompt,
    forced suffix), replay when it rebuilds positions computed before a pause."""
    if start_pos < seq.high_water:
        seq.prefill_units += 1
        seq.replay_units += 1
    elif length == 1 and seq.num_output > 0:
        seq.decode_rounds += 1
    else:
        seq.prefill_units += 1


class OutputIds(Seq[int]):
    """`tokens[start:]` as a live view: len, indexing, slices (copies of just the slice) and
    iteration without copying the whole output. A step reads it before the tokens it samples
    are committed (the view then grows with them)."""

    __slots__ = ("_start", "_tokens")

    def __init__(self, tokens: list[int], start: int) -> None:
        self._tokens, self._start = tokens, start

    def __len__(self) -> int:
        return len(self._tokens) - self._start

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            a, b, step = i.indices(len(self))
            if step > 0:
                return self._tokens[self._start + a : self._start + b : step]
            return list(self)[i]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("output index out of range")
        return self._tokens[self._start + (i if i >= 0 else n + i)]

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(self._tokens, self._start, None)

    def __eq__(self, other: object) -> bool:
        return list(self) == (list(other) if isinstance(other, Seq) else other)

    def __repr__(self) -> str:
        return f"OutputIds({list(self)!r})"
