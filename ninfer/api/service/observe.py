"""Request observation: the lifecycle of one generation as `ModelService.generate` reports it.

    generate() entry ──▶ track = observer.track(req, http id)       request id assigned
      preparation + submit ok ──▶ track.started(prepared, request)  ─▶ sinks.request_start
      preparation/submit raises ──▶ track.raised(ApiError)          ─▶ sinks.request_rejected
      engine AdmittedEvent ──▶ track.admitted()                        (queue time)
      engine SchedulingEvent ──▶ track.scheduling(event)            ─▶ sinks.request_scheduling
      first committed token ──▶ track.first_token()                 ─▶ sinks.first_token
      engine FinishEvent ──▶ track.engine_finished(event)              (kept for the terminal)
      Finished yielded ──▶ track.finished(finished)                 ─▶ sinks.request_done
      ApiError after the engine outcome (queue timeout, ...) ──▶       sinks.request_done
      consumer closed / task cancelled before an outcome ──▶        ─▶ sinks.request_error
      any other exception before an outcome ──▶                     ─▶ sinks.request_error

`RequestTrack` is the state machine that guarantees the log contract: a started request gets
exactly one terminal (`request_done` or `request_error`), a request that failed preparation gets
`request_rejected` and no start. Sinks (metrics, the JSONL request log, stderr records) only
format; a sink that raises is logged and ignored, so observation never breaks a request.
Records carry no prompt text, generated text or client strings (stop sequences, tool arguments).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ninfer.api.service.generation import Finished, GenerationRequest
from ninfer.api.wire import errors
from ninfer.api.wire.anthropic_errors import as_sent
from ninfer.api.wire.errors import ApiError
from ninfer.runtime.request import FinishEvent, Request, SchedulingEvent

log = logging.getLogger("ninfer.api")

# Values of ninfer_requests_total{outcome} (bounded): engine finish reasons of settled requests,
# then the ways a request ends without a generated outcome.
SETTLED_OUTCOMES = ("stop", "length", "tool_calls", "cancelled", "timeout")
OUTCOMES = (*SETTLED_OUTCOMES, "error", "rejected", "overloaded")


@dataclass
class RequestRecord:
    """What is known about one generation request. Times are `time.monotonic()` seconds.

    request_id: monotonic within the server instance. http_request_id: the x-request-id /
    request-id the client saw. `engine` is the engine's FinishEvent once it arrived; `outcome`
    one of OUTCOMES once the request ended.
    """

    request_id: int
    http_request_id: str
    protocol: str
    request: GenerationRequest
    start_s: float
    prepare_s: float | None = None
    prompt_tokens: int | None = None
    engine_request: Request | None = None
    starts_in_thinking: bool | None = None
    media: dict[str, Any] | None = None  # the prepared prompt's media fields (Prepared.media_log)
    admitted_s: float | None = None
    first_token_s: float | None = None
    engine: FinishEvent | None = None
    end_s: float | None = None
    outcome: str | None = None

    @property
    def arrival_s(self) -> float:
        """When the engine's clock for this request starts (just after preparation)."""
        r = self.engine_request
        return r.arrival_s if r is not None and r.arrival_s is not None else self.start_s

    @property
    def total_s(self) -> float:
        return (self.end_s if self.end_s is not None else time.monotonic()) - self.start_s

    @property
    def ttft_s(self) -> float | None:
        """Preparation entry → first committed output token (engine clock when known)."""
        if self.engine is not None and self.engine.timings.ttft_s is not None:
            return self.arrival_s + self.engine.timings.ttft_s - self.start_s
        return None if self.first_token_s is None else self.first_token_s - self.start_s

    @property
    def queue_s(self) -> float:
        """Preparation entry → initial admission (engine clock when known, else when the HTTP
        side saw the admission); never admitted: the whole lifetime."""
        if self.engine is not None and self.engine.timings.queue_s is not None:
            return self.arrival_s + self.engine.timings.queue_s - self.start_s
        if self.admitted_s is not None:
            return self.admitted_s - self.start_s
        return self.total_s


class Sink:
    """Receives request lifecycle records; every method defaults to doing nothing. Called on the
    HTTP event loop: a sink must not block on the engine."""

    def request_start(self, rec: RequestRecord) -> None:
        pass

    def request_rejected(self, rec: RequestRecord, err: ApiError) -> None:
        pass

    def first_token(self, rec: RequestRecord) -> None:
        pass

    def request_scheduling(self, rec: RequestRecord, event: SchedulingEvent) -> None:
        """A pause-cycle boundary the engine published for the request."""

    def request_done(
        self, rec: RequestRecord, finished: Finished | None, err: ApiError | None
    ) -> None:
        """The engine returned an outcome (`rec.engine`). `finished` is None when it was an error
        before admission (e.g. request_queue_timeout; `err` is then what the client received)
        or when the client left while it was being delivered (`err` None)."""

    def request_error(self, rec: RequestRecord, kind: str, detail: str) -> None:
        """Generation ended without an engine outcome. kind: "cancelled" | "error"; `detail`
        a server-side description (exception class and message), never client text."""

    def response_failed(self, rec: RequestRecord, kind: str) -> None:
        """A failure after the terminal record (rendering, storage, transport)."""


class Observer:
    """Hands out one `RequestTrack` per generation and fans records out to `sinks`."""

    def __init__(self, sinks: Sequence[Sink]) -> None:
        self.sinks = list(sinks)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def track(self, req: GenerationRequest, http_request_id: str) -> RequestTrack:
        with self._lock:
            rid = next(self._ids)
        rec = RequestRecord(rid, http_request_id, req.protocol, req, time.monotonic())
        return RequestTrack(self, rec)

    def emit(self, method: str, *args: Any) -> None:
        for sink in self.sinks:
            try:
                getattr(sink, method)(*args)
            except Exception:  # observation must never fail a request
                log.exception("request observation (%s) failed in %s", method, type(sink).__name__)


class RequestTrack:
    """One request's lifecycle (see the module docstring for the order of calls)."""

    def __init__(self, observer: Observer | None, rec: RequestRecord) -> None:
        self.observer = observer
        self.rec = rec
        self.terminal = False

    def _emit(self, method: str, *args: Any) -> None:
        if self.observer is None:
            return
        if self.rec.protocol == "anthropic":  # record the status and type the client received
            args = tuple(as_sent(a) if isinstance(a, ApiError) else a for a in args)
        self.observer.emit(method, self.rec, *args)

    def started(self, prepared: Any, request: Request) -> None:
        """Preparation succeeded and the engine accepted `request`. `prepared` is the service's
        Prepared (its prompt text is never recorded)."""
        r = self.rec
        r.prepare_s = time.monotonic() - r.start_s
        r.prompt_tokens = len(prepared.prompt_ids)
        r.starts_in_thinking = bool(prepared.starts_in_thinking)
        r.media = getattr(prepared, "media_log", None)
        r.engine_request = request
        self._emit("request_start")

    def admitted(self) -> None:
        """The engine committed the initial binding (AdmittedEvent)."""
        if self.rec.admitted_s is None:
            self.rec.admitted_s = time.monotonic()

    def first_token(self) -> None:
        if self.rec.first_token_s is None:
            self.rec.first_token_s = time.monotonic()
            self._emit("first_token")

    def scheduling(self, event: SchedulingEvent) -> None:
        self._emit("request_scheduling", event)

    def engine_finished(self, event: FinishEvent) -> None:
        self.rec.engine = event

    def finished(self, finished: Finished) -> None:
        if self.terminal:
            return
        self._end(finished.reason if finished.reason in OUTCOMES else "error")
        self._emit("request_done", finished, None)

    def raised(self, exc: BaseException) -> None:
        """An exception leaves generate(): classify it into the one terminal record."""
        if self.terminal:
            if not isinstance(exc, (GeneratorExit, asyncio.CancelledError)):
                self._emit("response_failed", type(exc).__name__)
            return
        err = exc if isinstance(exc, ApiError) else None
        left = isinstance(exc, (GeneratorExit, asyncio.CancelledError))
        if self.rec.engine_request is None and left:  # the client left during preparation
            self._end("cancelled")
            self._emit("request_rejected", errors.client_closed())
        elif self.rec.engine_request is None:  # preparation or submission failed
            err = err or errors.internal_error()
            self._end("overloaded" if err.status == 429 else "rejected")
            self._emit("request_rejected", err)
        elif self.rec.engine is not None and isinstance(
            exc, (GeneratorExit, asyncio.CancelledError)
        ):
            reason = self.rec.engine.reason  # the client left while the outcome was delivered
            self._end(reason if reason in OUTCOMES else "error")
            self._emit("request_done", None, None)
        elif self.rec.engine is not None:  # the engine's outcome was an error before admission
            err = err or errors.internal_error()
            self._end("timeout" if err.code == "request_queue_timeout" else "error")
            self._emit("request_done", None, err)
        elif isinstance(exc, (GeneratorExit, asyncio.CancelledError)):
            self._end("cancelled")
            self._emit(
                "request_error", "cancelled", "the client closed the request before it finished"
            )
        else:
            self._end("error")
            self._emit("request_error", "error", f"{type(exc).__name__}: {exc}")

    def _end(self, outcome: str) -> None:
        self.terminal = True
        self.rec.outcome = outcome
        self.rec.end_s = time.monotonic()


class NullTrack(RequestTrack):
    """The tracker of a service without an observer: every call does nothing."""

    def __init__(self) -> None:
        pass

    def started(self, prepared: Any, request: Request) -> None:
        pass

    def admitted(self) -> None:
        pass

    def first_token(self) -> None:
        pass

    def scheduling(self, event: SchedulingEvent) -> None:
        pass

    def engine_finished(self, event: FinishEvent) -> None:
        pass

    def finished(self, finished: Finished) -> None:
        pass

    def raised(self, exc: BaseException) -> None:
        pass


NO_TRACK = NullTrack()
