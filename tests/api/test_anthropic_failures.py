"""A Messages generation that fails after it started maps its engine cause to the Anthropic
status docs/serving.md gives ("Anthropic Messages": overload 529, queue timeout 504, otherwise
500 engine_error), the same in the aggregate response and in the SSE error event."""

from __future__ import annotations

import json

import pytest

from ninfer.api.anthropic.sse import MessageStreamWriter
from ninfer.api.service.generation import Admitted, Finished, Timings, Usage
from ninfer.api.wire.anthropic_errors import anthropic_error_body, generation_failure
from ninfer.runtime.request import EngineError, EngineOverloaded, QueueTimeout

CASES = [
    (QueueTimeout("waited too long"), 504, "timeout_error", "request_queue_timeout"),
    (EngineOverloaded("full"), 529, "overloaded_error", "server_overloaded"),
    (EngineError("device lost"), 500, "api_error", "engine_error"),
    (None, 500, "api_error", "engine_error"),
]


@pytest.mark.parametrize(("cause", "status", "kind", "code"), CASES)
def test_aggregate_failure_maps_its_cause(cause, status, kind, code):
    err = generation_failure(cause, pending_timeout_ms=250)
    got_status, body = anthropic_error_body(err, "req_1")
    assert got_status == status
    assert body["error"]["type"] == kind and body["error"]["details"]["error_code"] == code


@pytest.mark.parametrize(("cause", "status", "kind", "code"), CASES)
def test_streamed_failure_names_the_same_error(cause, status, kind, code):
    writer = MessageStreamWriter(message_id="msg_1", model="m", pending_timeout_ms=250)
    writer.feed(Admitted(5, 0, "root"))
    finished = Finished(
        "error", "", "", (), Usage(5, 0, 0, 0), Timings(0, 5, 0.0, 0, 0.0), error=cause
    )
    frames = writer.feed(finished)
    event = json.loads(frames[-1].split("data: ", 1)[1])
    assert event["type"] == "error" and writer.ended
    assert event["error"]["type"] == kind and event["error"]["details"]["error_code"] == code
