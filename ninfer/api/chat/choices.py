"""`n` > 1 on Chat Completions: several choices of one prompt, the prompt computed once.

Choice i is its own generation of the same `GenerationRequest`, with seed `s + i` when the
request gives seed s (wrapped into the signed 64-bit range), so choice i equals a separate
request with seed s + i; without a seed every choice draws its own random seed. Stop strings,
finish reasons and usage are per choice.

Choice 0 is submitted first. The others are submitted once its prompt is computed (its last
prompt-progress event, or its first output): by then the engine's prefix cache holds the
prompt, so each further choice reuses it and computes only what the cache cannot give (the
prompt's last, partial KV page; on hybrid models the tokens after its last state checkpoint),
as vLLM serves `n`. Submitted earlier, they would have computed the same prompt again beside it.

    fan_out ─▶ choice 0: Admitted, PromptProgress… (prompt done) ─▶ submit choices 1..n-1
            ─▶ ChoiceEvent(index, event) of every choice, interleaved as they arrive
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from ninfer.api.service.generation import (
    Admitted,
    GenerationEvent,
    GenerationRequest,
    PromptProgress,
)

_I64 = 1 << 64


@dataclass(frozen=True)
class ChoiceEvent:
    """An event of choice `index`."""

    index: int
    event: GenerationEvent


def choice_request(gen: GenerationRequest, index: int) -> GenerationRequest:
    """The generation of choice `index`: `gen` with its seed advanced by `index`."""
    seed = gen.sampling.seed
    if seed is None or index == 0:
        return gen
    wrapped = (seed + index + _I64 // 2) % _I64 - _I64 // 2
    return dataclasses.replace(gen, sampling=dataclasses.replace(gen.sampling, seed=wrapped))


def _prompt_done(e: GenerationEvent) -> bool:
    if isinstance(e, PromptProgress):
        return e.processed >= e.total
    return not isinstance(e, Admitted)  # output or the finish: the prompt was computed


async def fan_out(
    start: Callable[[int], AsyncIterator[GenerationEvent]], n: int
) -> AsyncIterator[ChoiceEvent]:
    """The events of `n` generations, `start(i)` making choice i's (see the module docstring),
    until every one has ended. An exception a generation raises (a refusal before its first
    event) is raised here. Closing this iterator closes every generation, which cancels their
    engine requests."""
    queue: asyncio.Queue[tuple[int, GenerationEvent | None, BaseException | None]]
    queue = asyncio.Queue()
    iters: list[AsyncIterator[GenerationEvent]] = []
    tasks: list[asyncio.Task[None]] = []

    async def pump(i: int, events: AsyncIterator[GenerationEvent]) -> None:
        try:
            async for e in events:
                queue.put_nowait((i, e, None))
        except Exception as exc:  # noqa: BLE001 - the consumer re-raises it
            queue.put_nowait((i, None, exc))
            return
        queue.put_nowait((i, None, None))

    def launch(i: int) -> None:
        events = start(i)
        iters.append(events)
        tasks.append(asyncio.ensure_future(pump(i, events)))

    launch(0)
    ended = 0
    try:
        while ended < n:
            i, e, exc = await queue.get()
            if exc is not None:
                raise exc
            if i == 0 and len(tasks) == 1 and (e is None or _prompt_done(e)):
                for j in range(1, n):
                    launch(j)
            if e is None:
                ended += 1
                continue
            yield ChoiceEvent(i, e)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for events in iters:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
