"""`n` > 1 on Chat Completions: several choices of one prompt, the prompt computed once.

Choice i is its own generation of the same `GenerationRequest`, with seed `s + i` when the
request gives seed s (wrapped into the signed 64-bit range), so choice i equals a separate
request with seed s + i; without a seed every choice draws its own random seed. Stop strings,
finish reasons and usage are per choice.

The n generations start together and hand their engine requests to one `ChoiceGroup`, which
submits them at once (ninfer/api/service/choice_group.py): the engine computes the prompt for
choice 0 only, and every other choice takes its KV (full pages shared, the last partial page
copied), its recurrent state and its first token's logits from that computation, sampling
with its own seed (ninfer/runtime/choices.py). When the engine has no lane or page for a
choice at that moment, the choice is queued as an ordinary request, which reuses the cached
prompt and computes only its last partial page.

    fan_out ─▶ choices 0..n-1 ─▶ ChoiceGroup ─▶ Engine.submit_choices
            ─▶ ChoiceEvent(index, event) of every choice, interleaved as they arrive
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from ninfer.api.service.choice_group import Choice, ChoiceGroup
from ninfer.api.service.generation import GenerationEvent, GenerationRequest

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


async def fan_out(
    start: Callable[[Choice], AsyncIterator[GenerationEvent]], n: int
) -> AsyncIterator[ChoiceEvent]:
    """The events of `n` generations, `start(choice)` making choice `choice.index`'s, which
    submits through `choice` (see the module docstring), until every one has ended. An
    exception a generation raises (a refusal before its first event) is raised here. Closing
    this iterator closes every generation, which cancels their engine requests."""
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

    group = ChoiceGroup(n)
    for i in range(n):
        events = start(Choice(group, i))
        iters.append(events)
        tasks.append(asyncio.ensure_future(pump(i, events)))
    ended = 0
    try:
        while ended < n:
            i, e, exc = await queue.get()
            if exc is not None:
                raise exc
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
