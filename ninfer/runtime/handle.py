"""The event stream of one request submitted to the engine (`Engine.submit` returns it).

The engine worker pushes events; one consumer reads them with `for` on any thread or `async for`
on an event loop, or waits for everything with `result()`.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import TYPE_CHECKING

from ninfer.runtime.request import (
    FinishEvent,
    PromptProgressEvent,
    Request,
    RequestEvent,
    RequestOutput,
    TokensEvent,
)

if TYPE_CHECKING:
    from ninfer.runtime.engine import Engine


class RequestHandle:
    """The event stream of one submitted request: `AdmittedEvent`, `PromptProgressEvent`s,
    `TokensEvent`s, then one `FinishEvent` (see ninfer.runtime.request).

    Iterate it with `async for` on an event loop or with a plain `for` on any thread (one
    consumer). Consecutive token events waiting to be read are merged into one, consecutive
    progress events into the latest; no other events are merged. `result()` blocks until the
    request finishes and returns everything.
    """

    def __init__(self, engine: Engine, seq_id: int, request: Request) -> None:
        self.seq_id = seq_id
        self.request = request
        self._engine = engine
        self._cond = threading.Condition()
        self._events: collections.deque[RequestEvent] = collections.deque()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._finish: FinishEvent | None = None
        self._delivered_finish = False
        self._received: list[int] = []

    # -- producer side (engine worker) -------------------------------------------------------

    def _push(self, event: RequestEvent) -> None:
        with self._cond:
            self._events.append(event)
            if isinstance(event, FinishEvent):
                self._finish = event
            self._cond.notify_all()
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # that event loop is closed; nobody is waiting any more
                pass

    # -- consumer side ----------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """True once the engine published the FinishEvent (it may not have been read yet)."""
        return self._finish is not None

    def cancel(self) -> None:
        self._engine.cancel(self)

    def _pop(self) -> RequestEvent | None:
        """Under the lock: the next event with queued token (progress) events merged, or None."""
        if not self._events:
            return None
        event = self._events.popleft()
        if isinstance(event, TokensEvent):
            ids = list(event.token_ids)
            lps = None if event.logprobs is None else list(event.logprobs)
            while self._events and isinstance(self._events[0], TokensEvent):
                event = self._events.popleft()  # type: ignore[assignment]
                ids += event.token_ids
                if lps is not None and event.logprobs is not None:
                    lps += event.logprobs
            logprobs = None if lps is None else tuple(lps)
            # the latest timings
            event = TokensEvent(tuple(ids), event.prompt_s, event.decode_s, logprobs)
        elif isinstance(event, PromptProgressEvent):
            while self._events and isinstance(self._events[0], PromptProgressEvent):
                event = self._events.popleft()  # type: ignore[assignment]
        elif isinstance(event, FinishEvent):
            self._delivered_finish = True
        return event

    def __iter__(self) -> RequestHandle:
        return self

    def __next__(self) -> RequestEvent:
        with self._cond:
            while True:
                event = self._pop()
                if event is not None:
                    return event
                if self._delivered_finish:
                    raise StopIteration
                self._cond.wait()

    def __aiter__(self) -> RequestHandle:
        return self

    async def __anext__(self) -> RequestEvent:
        while True:
            with self._cond:
                event = self._pop()
                if event is not None:
                    return event
                if self._delivered_finish:
                    raise StopAsyncIteration
                loop = asyncio.get_running_loop()
                fut: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, fut))
            await fut

    def result(self, timeout: float | None = None) -> RequestOutput:
        """Block until finished; returns all committed tokens (read or not). Raises the
        request's error (QueueTimeout, EngineError, ...) when it finished with 'error', and
        TimeoutError when `timeout` seconds pass first."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._finish is not None, timeout):
                raise TimeoutError(f"request {self.seq_id} did not finish in {timeout} s")
            fin = self._finish
        assert fin is not None
        if fin.error is not None:
            raise fin.error
        return RequestOutput(fin.token_ids, fin.reason, fin.usage, fin.timings, fin.error)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
