"""The engine: one worker thread that owns the executor and runs the step loop.

    submit ─▶ inbox ─▶ ┌──────────── worker thread ────────────┐ ─▶ RequestHandle events
    cancel ─▶          │ admit → schedule → execute → sample → │    (AdmittedEvent, progress…,
                       │                                       │     TokensEvent…, FinishEvent)
    finish ─▶          │ commit → publish → snapshot           │
                       └───────────────────────────────────────┘

Callers on any thread (the HTTP event loop, `ninfer.LLM`) talk to the engine only through
`submit`, `cancel`, `finish`, `snapshot`, `prompt_logits` and the handle's event stream, all
plain data. Commands take effect at the next step boundary. The handle lives in handle.py; the
engine is built (plan compiled, executor loaded) by build.py's `build_engine`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

from ninfer.constrain.errors import ConstraintFailed
from ninfer.constrain.state import ConstraintState
from ninfer.errors import ConfigError, NinferError
from ninfer.runtime.choices import row_map
from ninfer.runtime.config import EngineOptions, OutputLimit
from ninfer.runtime.engine_stats import EngineStats, collect_stats
from ninfer.runtime.executor_api import Executor
from ninfer.runtime.executors.sampler import SampledTokens, Sampler, SampleRow
from ninfer.runtime.handle import RequestHandle
from ninfer.runtime.host_work import DEVICE_WAIT, HostWork
from ninfer.runtime.logprob_ledger import LogprobLedger
from ninfer.runtime.media_span import MediaSpan
from ninfer.runtime.request import (
    AdmittedEvent,
    EngineError,
    EngineOverloaded,
    FinishEvent,
    Request,
    RequestError,
    Timings,
    Usage,
)
from ninfer.runtime.scheduler import Scheduler, StepPlan
from ninfer.runtime.sequence import (
    SeqStatus,
    count_prefill_gpu,
    finish_event,
    first_output,
    tokens_event,
)
from ninfer.runtime.step import SeqChunk, StepBatch
from ninfer.runtime.vision.mrope import MRope
from ninfer.runtime.vision.placeholders import check_media

if TYPE_CHECKING:
    from ninfer.ir.plan import Plan
    from ninfer.spec.speculator import Accepted, Speculator

log = logging.getLogger("ninfer.engine")

RUNNING = SeqStatus.RUNNING
_IDLE_WAIT_S = 0.05  # longest sleep while requests wait for admission (pending timeouts)


@dataclass
class _Launched:
    """A step queued on the device and not committed yet."""

    plan: StepPlan
    tokens: SampledTokens | Accepted | None  # Accepted: a speculative step's (speculator.py);
    # None: constrained rows wait for the previous commit
    work_class: str  # host_work.py's class of the time spent on it
    logits: Any = None  # the logits they will sample from then


class Engine:
    """Serves requests with `executor` and `sampler` on one worker thread.

    `eos_ids`: token ids that finish a request with 'stop' (unless it sets ignore_eos).
    `plan`: the compiled plan the executor runs (None for a hand-made executor), kept for
    callers that report it. The worker starts at construction; `close()` (or leaving a `with`
    block) cancels what is outstanding and joins it.
    """

    def __init__(
        self,
        config: EngineOptions,
        executor: Executor,
        sampler: Sampler,
        eos_ids: Iterable[int],
        *,
        clock: Callable[[], float] = time.monotonic,
        plan: Plan | None = None,
        speculator: Speculator | None = None,
    ) -> None:
        if executor.is_hybrid and executor.num_state_slots < config.max_concurrency:
            raise ConfigError(
                f"the executor has {executor.num_state_slots} state slots but"
                f" --max-concurrency {config.max_concurrency} needs one per lane"
            )
        self.config = config
        self.plan = plan
        self._vision = None if plan is None else plan.vision  # the tower media requests need
        self.eos_ids = tuple(eos_ids)
        self._executor = executor
        self._sampler = sampler
        self._clock = clock
        # an executor without snapshot/restore (a wrapper, an old fake) pauses by replay only
        snapshots = callable(getattr(executor, "snapshot", None)) and callable(
            getattr(executor, "restore", None)
        )
        self._sched = Scheduler(
            config,
            num_pages=executor.num_pages,
            page_size=executor.page_size,
            num_state_slots=executor.num_state_slots,
            is_hybrid=executor.is_hybrid,
            eos_ids=frozenset(self.eos_ids),
            page_copies=callable(getattr(executor, "copy_page", None)),
            host_snapshots=snapshots,
            kv_bytes_per_page=int(getattr(executor, "kv_bytes_per_page", 0)) if snapshots else 0,
            state_bytes=int(getattr(executor, "state_bytes", 0)) if snapshots else 0,
        )
        self._wake = threading.Condition()
        self._inbox: list[tuple] = []  # guarded by _wake
        self._outstanding = 0  # guarded by _wake: submitted and not yet finished
        self._next_id = 0  # guarded by _wake
        self._closing = False  # guarded by _wake
        self._handles: dict[int, RequestHandle] = {}  # worker only
        self._logit_jobs: list[tuple[tuple[int, ...], Future]] = []  # worker only
        self._exposure: dict[int, tuple[float, ...]] = {}  # worker only: seq id -> mark
        self._step_failures = 0
        # launch a decode step before the previous one's tokens are read (executors that take
        # their tokens from the device only; not while speculating: drafts need the last commit)
        feeds = bool(getattr(executor, "feeds_tokens", False))
        self._overlap = config.overlap and feeds and speculator is None
        self._spec = speculator  # drafts and verifies decode rows (ninfer/spec/speculator.py)
        self._inflight: _Launched | None = None  # launched ahead, not committed (worker only)
        self._constraints = ConstraintState(config.max_concurrency)  # worker only
        self._work = HostWork()
        self._logprobs = LogprobLedger()  # sampled tokens' entries until published (worker)
        self._ready = True
        self._stats = self._build_stats(idle=True)
        self._thread = threading.Thread(target=self._run, name="ninfer-engine", daemon=True)
        self._thread.start()

    # -- request interface (any thread) ----------------------------------------------------

    def submit(self, request: Request) -> RequestHandle:
        """Queue a request and return its handle (`submit_choices` of one)."""
        return self.submit_choices((request,))[0]

    def submit_choices(self, requests: Sequence[Request]) -> list[RequestHandle]:
        """Queue requests, all or none, and return their handles. Several are choices of one
        prompt (same prompt and media), computed once for all (runtime/choices.py). Raises
        RequestError when one can never be served, EngineOverloaded when max_concurrency +
        max_pending_requests would be exceeded, EngineError when the engine is not running."""
        for request in requests:
            self._sched.validate(request)  # reads only fixed sizes: safe off the worker
            check_media(request.prompt_token_ids, request.media, self._vision)
        now = self._clock()
        requests = [r if r.arrival_s is not None else dataclasses.replace(r, arrival_s=now)
                    for r in requests]  # fmt: skip
        with self._wake:
            if self._closing or not self._ready:
                raise EngineError("the engine is not running")
            if self._outstanding + len(requests) > self._sched.capacity:
                raise EngineOverloaded(
                    f"{self._outstanding} requests are already outstanding (--max-concurrency"
                    " + --max-pending-requests); retry later"
                )
            self._outstanding += len(requests)
            handles = [RequestHandle(self, self._next_id + i, r) for i, r in enumerate(requests)]
            self._next_id += len(requests)
            self._inbox.append(("submit", handles))
            self._wake.notify()
        return handles

    def cancel(self, handle: RequestHandle) -> None:
        """Finish the request with 'cancelled' at the next step boundary (no-op when done)."""
        self._command(("abort", handle.seq_id, "cancelled", None))

    def finish(
        self, handle: RequestHandle, reason: str = "stop", keep_tokens: int | None = None
    ) -> None:
        """Finish the request with `reason` (the caller matched a stop string: 'stop'). With
        `keep_tokens`, only that many output tokens count as accepted (usage, result)."""
        if reason not in ("stop", "length", "cancelled"):
            raise ValueError(f"finish reason must be stop, length or cancelled, not {reason!r}")
        self._command(("abort", handle.seq_id, reason, keep_tokens))

    def prompt_logits(self, token_ids: Iterable[int], media: tuple[MediaSpan, ...] = ()) -> Future:
        """A future of the float32 logits [len(token_ids), vocab] of every position of one
        prefill of `token_ids` with its `media` (as Request.media) (for tests and tools:
        `LLM.logits`). It runs on the worker once no request is outstanding, on pages taken
        from the pool (cached prefixes are evicted as needed) and given back. Its exception:
        RequestError when the pool cannot hold the tokens, EngineError when the engine stops."""
        future: Future = Future()
        ids = tuple(token_ids)
        media = Request(ids, media=media).media if media else ()  # validated as a request's
        check_media(ids, media, self._vision)
        with self._wake:
            if self._closing or not self._ready:
                raise EngineError("the engine is not running")
            self._inbox.append(("logits", ids, media, future))
            self._wake.notify()
        return future

    def output_limit(self, prompt_len: int, max_tokens: int | None) -> OutputLimit:
        """The output limit of a request of `prompt_len` tokens asking for `max_tokens` (None:
        the default) within this engine's KV pool (`EngineOptions.output_limit`)."""
        pool = self._executor.num_pages * self._executor.page_size
        return self.config.output_limit(prompt_len, max_tokens, pool)

    @property
    def speculator(self) -> Speculator | None:
        return self._spec  # its drafter's counters and timings (ninfer bench)

    @property
    def executor(self) -> Executor:
        """The executor this engine drives; only its worker runs steps on it."""
        return self._executor

    def snapshot(self) -> EngineStats:
        """The latest published gauges and counters (updated after every step)."""
        return self._stats

    def close(self, timeout: float | None = 10.0) -> None:
        """Cancel what is outstanding, join the worker, then close an executor that holds
        processes (tensor parallelism: its rank workers)."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join(timeout)
        if callable(close := getattr(self._executor, "close", None)):
            close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _command(self, cmd: tuple) -> None:
        with self._wake:
            self._inbox.append(cmd)
            self._wake.notify()

    # -- worker ------------------------------------------------------------------------------

    def _run(self) -> None:
        busy = False
        try:
            while True:
                with self._wake:
                    if not busy and not self._inbox and not self._closing:
                        self._wake.wait(_IDLE_WAIT_S if self._sched.has_work() else None)
                    commands, self._inbox = self._inbox, []
                    closing = self._closing
                self._work.start()
                self._apply(commands)
                if closing:
                    self._abort_all("cancelled", None)
                    self._fail_logit_jobs(EngineError("the engine closed"))
                    return
                if self._logit_jobs and not self._sched.has_work() and self._inflight is None:
                    self._run_logit_jobs()
                busy = self._step()
        except BaseException as e:  # an engine bug: fail everything, stay observable
            log.exception("engine worker failed")
            self._ready = False
            self._abort_all("error", EngineError(f"the engine failed: {e}"))
            self._fail_logit_jobs(EngineError(f"the engine failed: {e}"))
            with self._wake:
                self._closing = True
                self._inbox.clear()
        finally:
            self._ready = False
            self._stats = self._build_stats(idle=True)

    def _apply(self, commands: list[tuple]) -> None:
        now = self._clock()
        for cmd in commands:
            if cmd[0] == "logits":
                self._logit_jobs.append(cmd[1:])
            elif cmd[0] == "submit":
                for handle in cmd[1]:  # the first, then the other choices of its prompt
                    self._add(handle, now, cmd[1][0].seq_id if handle is not cmd[1][0] else None)
            else:
                _, seq_id, reason, keep = cmd
                self._sched.abort(seq_id, reason, now, keep_tokens=keep)
        self._work.lap("engine_boundary")

    def _add(self, handle: RequestHandle, now: float, leader: int | None) -> None:
        try:
            self._sched.add(handle.request, now, handle.seq_id, leader)
        except NinferError as e:  # checked at submit already; kept for safety
            usage = Usage(len(handle.request.prompt_token_ids), 0)
            handle._push(FinishEvent("error", usage, Timings(None, None, None, None, 0.0), (), e))
            with self._wake:
                self._outstanding -= 1
            return
        self._handles[handle.seq_id] = handle

    def _step(self) -> bool:
        """One iteration; True when a batch ran (so the loop should not sleep).

        A step is launched (queued on the device with its sampling), then committed once its
        tokens reach the host. With overlap, the next decode step is launched *before* that
        wait, fed the sampled tokens on the device (`Scheduler.schedule_ahead`), so the device
        never idles while the host commits, publishes and plans; otherwise (or when the next
        step cannot be planned early) it is scheduled after the commit. Between a step's result
        and the next launch the worker only commits, schedules and fills metadata: publishing
        events (the last commit's tokens, admissions, aborts, timeouts, pressure finishes) runs
        once the next step is queued, or before launching when no step was in flight (the
        device is idle then, and a CPU executor runs the launch synchronously)."""
        current, self._inflight = self._inflight, None
        if current is None:
            plan = self._sched.schedule(self._clock())
            self._work.lap("program_submit")
            self._publish()  # admissions reach their streams before a synchronous launch runs
            if plan is None:
                self._publish_stats(idle=True)
                return False
            current = self._launch(plan)
        elif current.tokens is None:  # launched ahead with constrained rows: sample them now
            current = self._sample(current.plan, current.logits, current.work_class)
        if current is None:
            self._publish()
            return True
        if self._overlap:
            ahead = self._sched.schedule_ahead(current.plan, self._clock())
            self._work.lap("program_submit")
            if ahead is not None:
                self._inflight = self._launch(ahead, current.tokens)
        self._publish()  # while the device runs the step(s)
        self._complete(current)
        self._work.work_class = "control"
        return True

    def _run_logit_jobs(self) -> None:
        """Run the queued `prompt_logits` jobs (no request is outstanding: lane 0's state
        slot is free, and pages come from the pool)."""
        jobs, self._logit_jobs = self._logit_jobs, []
        for ids, media, future in jobs:
            pages = self._sched.lend_pages(len(ids))
            if pages is None:
                need = -(-len(ids) // self._executor.page_size)
                future.set_exception(RequestError(
                    f"{len(ids)} tokens need {need} KV pages, the cache has"
                    f" {self._executor.num_pages}; raise kv_capacity"
                ))  # fmt: skip
                continue
            slot = 0 if self._executor.is_hybrid else None
            try:
                chunk = SeqChunk(-1, ids, 0, tuple(pages), slot, media=media, mrope=MRope.of(media))
                future.set_result(self._executor.run(StepBatch((chunk,)), all_logits=True))
            except Exception as e:
                log.exception("prompt_logits failed")
                future.set_exception(e)
            finally:
                self._sched.pool.release(pages)

    def _fail_logit_jobs(self, error: BaseException) -> None:
        jobs, self._logit_jobs = self._logit_jobs, []
        for *_, future in jobs:
            future.set_exception(error)

    def _publish_stats(self, idle: bool = False) -> None:
        self._stats = self._build_stats(idle)
        self._work.stats(self._work.lap("engine_maintenance"))

    def _launch(self, plan: StepPlan, fed: SampledTokens | None = None) -> _Launched | None:
        """Queue `plan` and the sampling of its logits rows on the device; None when that
        failed (its requests fail, the engine goes on)."""
        decode = all(s.decode_ready for s in plan.chunk_seqs)  # decode rows only: decode work
        self._work.work_class = work_class = "decode" if decode else "prefill"
        try:
            self._publish_stats()  # gauges show the batch while the device runs it
            self._sched.run_transfers(plan, self._executor)  # pause snapshots and restores
            plain = plan.forks or any(s.request.constraint is not None for s in plan.logit_seqs)
            if self._spec is not None and not plain:  # constrained rows, choices: a plain step
                # the plan widened by drafts: commit that one
                plan, tokens = self._spec.launch(self._sched, plan, self._executor, self._sampler)
                self._work.lap("program_submit")
                return _Launched(plan, tokens, work_class)
            if fed is None:
                logits = self._executor.run(plan.batch)  # [rows, vocab]
                if self._spec is not None:  # a plain step of a speculating engine: MTP's rows
                    self._spec.observe(plan.batch, self._executor)
            else:
                logits = self._executor.run(plan.batch, fed=fed.ids)
                if any(s.request.constraint is not None for s in plan.logit_seqs):
                    # its masks need the tokens `fed` holds: sampled once those are committed
                    return _Launched(plan, None, work_class, logits)
        except Exception as e:
            log.exception("step %d failed", plan.batch.step_index)
            self._fail(plan, e)
            return None
        return self._sample(plan, logits, work_class)

    def _sample(self, plan: StepPlan, logits: Any, work_class: str) -> _Launched | None:
        """Queue the sampling of `plan`'s logits rows, constrained rows masked (the mask is
        filled on the host while the device computes the logits); a request whose constraint
        allows no next token fails here."""
        seqs = plan.sample_seqs  # the logits rows, then the forked choices' (choices.py)
        try:
            live = [(s.seq_id, s.request.constraint if s.status is RUNNING else None) for s in seqs]
            mask = self._constraints.step_mask(live)
            for row, why in (mask.dead if mask is not None else {}).items():
                failure = ConstraintFailed(f"{why}, after {seqs[row].num_output} output tokens")
                self._sched.abort(seqs[row].seq_id, "error", self._clock(), failure)
            rows = [SampleRow(s.seq_id, s.request.sampling, s.outputs) for s in seqs]
            tokens = self._sampler.sample_async(logits, rows, mask and mask.apply, row_map(plan))
        except Exception as e:
            log.exception("step %d failed", plan.batch.step_index)
            self._fail(plan, e)
            return None
        self._work.lap("program_submit")
        return _Launched(plan, tokens, work_class)

    def _complete(self, step: _Launched) -> None:
        """Wait for `step`'s tokens and commit them."""
        self._work.work_class = step.work_class
        try:
            sampled = step.tokens.tolist()
        except Exception as e:
            log.exception("step %d failed", step.plan.batch.step_index)
            self._fail(step.plan, e)
            if self._inflight is not None:  # it was fed this step's tokens
                self._fail(self._inflight.plan, e)
                self._inflight = None
            return
        self._work.lap(DEVICE_WAIT)
        if step.work_class == "prefill":
            measure = getattr(self._executor, "step_gpu_seconds", None)  # CUDA executors
            gpu = measure(step.plan.batch.step_index) if measure is not None else None
            count_prefill_gpu(step.plan.chunk_seqs, step.plan.batch.chunks, gpu)
        now = self._clock()
        self._sched.commit(step.plan, sampled, now)
        if step.tokens.logprobs is not None:  # after the commit: only published tokens take one
            seqs = [s.seq_id if s.seq_id in self._handles else -1 for s in step.plan.sample_seqs]
            self._logprobs.record(seqs, step.tokens.logprob_entries())
        live = [(s.seq_id, s.outputs) for s in step.plan.sample_seqs if s.status is RUNNING]
        for seq_id, verdict in self._constraints.advance_all(live):  # constraint complete or broken
            error = None if verdict.error is None else ConstraintFailed(verdict.error)
            self._sched.abort(seq_id, "stop" if error is None else "error", now, error)
        self._work.lap("program_post")

    def _fail(self, plan: StepPlan, e: Exception) -> None:
        self._step_failures += 1
        self._work.lap(DEVICE_WAIT)
        self._sched.fail_step(plan, self._clock(), EngineError(f"the step failed: {e}"))
        self._work.lap("program_post")

    def _publish(self) -> None:
        for seq, tokens, finished, notice in self._sched.drain_updates():
            handle = self._handles.get(seq.seq_id)
            if handle is None:
                continue
            if notice is not None:
                if isinstance(notice, AdmittedEvent):
                    self._exposure[seq.seq_id] = self._work.exposure_mark()
                handle._push(notice)
            if tokens:
                if seq.first_output is None:
                    mark = self._exposure.get(seq.seq_id)
                    exposure = None if mark is None else self._work.exposure_since(mark)
                    seq.first_output = first_output(seq, self._clock(), exposure)
                lp = seq.request.sampling.logprobs is not None
                handle._push(tokens_event(seq, tokens, self._logprobs if lp else None))
            if finished:
                del self._handles[seq.seq_id]
                self._sampler.forget(seq.seq_id)
                self._constraints.forget(seq.seq_id)
                self._logprobs.forget(seq.seq_id)
                if self._spec is not None:
                    self._spec.forget(seq.seq_id)
                mark = self._exposure.pop(seq.seq_id, None)
                exposure = None if mark is None else self._work.exposure_since(mark)
                with self._wake:  # before the push: its reader may submit at once
                    self._outstanding -= 1
                handle._push(finish_event(seq, exposure))
        self._work.lap("engine_commit_output")

    def _abort_all(self, reason: str, error: BaseException | None) -> None:
        now = self._clock()
        for seq_id in list(self._handles):
            self._sched.abort(seq_id, reason, now, error)
        self._publish()

    def _build_stats(self, idle: bool = False) -> EngineStats:
        return collect_stats(
            self._sched, self._work, self._ready, self._step_failures, self._clock(), idle
        )
