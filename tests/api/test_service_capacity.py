"""The lifetime capacity of generations (docs/serving.md, "Execution and capacity"): max_concurrency +
max_pending_requests counts a generation from its entry, before preparation, until its response
is released, not only while the engine holds it. Beyond it a new one gets 429 server_overloaded
at once, and a released response makes room again."""

from __future__ import annotations

import asyncio

import pytest

from ninfer.api.service.generation import Finished, GenerationRequest
from ninfer.api.wire.errors import ApiError
from ninfer.artifact import Artifact
from ninfer.commands import serve
from tests.api.live_app import serve_config


def test_unreleased_responses_count_against_the_capacity(tiny_agent):
    config = serve_config(artifact=str(tiny_agent), max_context=256, max_concurrency=1,
                         max_pending_requests=1, log_stats_interval_ms=0)  # fmt: skip
    state = serve.build_state(config, Artifact(tiny_agent))
    service, engine = state.extra["service"], state.engine

    def request() -> GenerationRequest:
        return GenerationRequest([{"role": "user", "content": "Hi!"}], max_tokens=2)

    async def finish(gen) -> Finished:
        async for event in gen:
            if isinstance(event, Finished):
                return event  # the generator stays open: its response is not released
        raise AssertionError("no Finished event")

    async def scenario() -> None:
        first, second = service.generate(request()), service.generate(request())
        await finish(first)
        await finish(second)
        for _ in range(500):  # the engine is done with both (its stats publish just after)
            if engine.snapshot().running == engine.snapshot().waiting == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.snapshot().running == 0
        with pytest.raises(ApiError) as refused:
            await anext(service.generate(request()))
        assert (refused.value.status, refused.value.code) == (429, "server_overloaded")
        await first.aclose()  # its response is released: room for one more
        third = service.generate(request())
        assert (await finish(third)).reason in ("stop", "length")
        await third.aclose()
        await second.aclose()
        assert service.alive == 0

    try:
        asyncio.run(scenario())
    finally:
        engine.close()
