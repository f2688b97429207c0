"""Submitting the engine requests of several choices of one prompt together (Chat `n` > 1).

Each choice is its own generation (its own seed, stop strings, post-processing and track).
For the engine to compute their prompt once (ninfer/runtime/choices.py) it must receive them in
one `Engine.submit_choices`: each generation prepares its request, hands it to the group and
waits; the last one in submits them all, and each gets its own handle, or the submission's
error (overloaded, unservable, engine down), as a lone `Engine.submit` would have raised it.

    choice 0 ─prepare─▶ submit(0, r0) ┐
    choice 1 ─prepare─▶ submit(1, r1) ┼─ all in ─▶ engine.submit_choices([r0, r1, r2])
    choice 2 ─prepare─▶ submit(2, r2) ┘             ─▶ handle i to choice i
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from ninfer.runtime.request import Request


@dataclass(eq=False)
class ChoiceGroup:
    """The `n` choices of one request; `Choice(group, i)` is choice i's part."""

    n: int
    _requests: dict[int, Request] = field(default_factory=dict)
    _handles: asyncio.Future[list[Any]] | None = None

    async def submit(
        self, engine: Any, index: int, request: Request
    ) -> Any:  # the engine's RequestHandle
        """Choice `index`'s handle once all `n` requests are in (see the module docstring).
        Raises the submission's error in every choice. A choice cancelled while it waits
        cancels its own engine request if the submission happened."""
        if self._handles is None:
            self._handles = asyncio.get_running_loop().create_future()
        handles = self._handles
        self._requests[index] = request
        if len(self._requests) == self.n:
            try:
                handles.set_result(
                    engine.submit_choices([self._requests[i] for i in range(self.n)])
                )
            except Exception as e:  # noqa: BLE001 - every choice raises it
                handles.set_exception(e)
        try:
            return (await asyncio.shield(handles))[index]
        except asyncio.CancelledError:
            if handles.done() and not handles.cancelled() and handles.exception() is None:
                engine.cancel(handles.result()[index])
            raise


@dataclass(frozen=True)
class Choice:
    """Choice `index` of `group`: what `ModelService.generate` submits through."""

    group: ChoiceGroup
    index: int

    async def submit(self, engine: Any, request: Request) -> Any:  # the engine's RequestHandle
        return await self.group.submit(engine, self.index, request)
