"""Shared helpers of the Chat Completions request tests (tests/api/test_chat_request_* and the
prompt-cache tests): a minimal body, parse/reject against a fixed public model id, two function
tools, and the preparation of a request by a model service."""

from __future__ import annotations

from typing import Any

import pytest

from ninfer.api.chat.endpoints import to_generation_request
from ninfer.api.chat.request import ChatRequest, parse_chat_request
from ninfer.api.server.config import ServeConfig
from ninfer.api.server.state import ServerState
from ninfer.api.wire.errors import ApiError

MODEL = "tiny-model"
USER = {"role": "user", "content": "hi"}
DROP = object()  # a body() value that removes the field


def body(**fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model": MODEL, "messages": [USER]}
    out.update(fields)
    return {k: v for k, v in out.items() if v is not DROP}


def parse(b: dict[str, Any], *, vision: bool = False) -> ChatRequest:
    return parse_chat_request(b, model_id=MODEL, vision=vision)


def prepare_chat(service: Any, messages: list[dict[str, Any]], **fields: Any) -> Any:
    """`service.prepare` of a Chat request with `messages` and `fields`: the rendered prompt,
    its token ids and checkpoints, stopping before the engine."""
    chat = parse(body(messages=messages, **fields))
    return service.prepare(to_generation_request(chat, ServerState(ServeConfig(), MODEL)))


def reject(b: dict[str, Any], *, vision: bool = False) -> ApiError:
    with pytest.raises(ApiError) as e:
        parse(b, vision=vision)
    return e.value


def check_rejection(fields: dict[str, Any], status: int, code: str, param: str) -> None:
    """The request fails with this status, code and param, a one-line message naming the
    field, and the OpenAI error body."""
    err = reject(body(**fields))
    assert (err.status, err.code, err.param) == (status, code, param), err
    assert param.split("[")[0].split(".")[0] in err.message
    assert "\n" not in err.message
    assert err.body() == {
        "error": {"message": err.message, "type": err.type, "param": param, "code": code}
    }


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time"}}
