"""A Response echoes the sampling values the engine actually used (OpenResponses requires
temperature, top_p, presence_penalty and frequency_penalty as numbers, never null): the
request's field, else the server's process flag, else the artifact's default; --greedy forces
temperature 0. Checked on the real in-process server with the official openai types, in the
JSON body, the streamed lifecycle events and the stored object."""

from __future__ import annotations

import json

import pytest
from openai.types.responses import Response

from ninfer.artifact import Artifact
from tests.api.live_app import app_client

NUMBERS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")


def validate(obj: dict) -> None:
    """Strict validation with the official type. The one tolerated difference: ninfer does not
    account prompt-cache writes, which this SDK version's usage requires (as in the e2e schema
    tests)."""
    data = json.loads(json.dumps(obj))
    if data.get("usage") is not None:
        data["usage"]["input_tokens_details"].setdefault("cache_write_tokens", 0)
    Response.model_validate(data, strict=True)


def sse_responses(text: str) -> list[dict]:
    """The `response` objects of a Responses SSE body, in order."""
    out = []
    for frame in text.split("\n\n"):
        for line in frame.splitlines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if "response" in event:
                    out.append(event["response"])
    return out


def create(client, **fields) -> dict:
    body = {"model": "tiny-agent", "input": "Hi!", "max_output_tokens": 3, **fields}
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def flagged(tiny_agent):
    """A server started with --temperature 0.4 --presence-penalty 0.25."""
    with app_client(
        tiny_agent, max_context=512, thinking=False, temperature=0.4, presence_penalty=0.25
    ) as c:
        yield c


def test_the_effective_values_are_echoed_and_validate(flagged, tiny_agent):
    obj = create(flagged)  # nothing given: process flags, then the artifact's defaults
    validate(obj)
    assert all(isinstance(obj[k], float) for k in NUMBERS), {k: obj[k] for k in NUMBERS}
    assert obj["temperature"] == 0.4 and obj["presence_penalty"] == 0.25
    artifact_top_p = Artifact(tiny_agent).generation["top_p"]  # recorded at convert time
    assert artifact_top_p != 1.0 and obj["top_p"] == artifact_top_p
    assert obj["frequency_penalty"] == 0.0
    given = create(flagged, temperature=0.9, top_p=0.5)  # the request's own values win
    assert (given["temperature"], given["top_p"], given["presence_penalty"]) == (0.9, 0.5, 0.25)
    stored = flagged.get(f"/v1/responses/{given['id']}").json()
    assert {k: stored[k] for k in NUMBERS} == {k: given[k] for k in NUMBERS}


def test_top_p_zero_echoes_the_argmax_it_became(flagged):
    obj = create(flagged, top_p=0, temperature=0.7)
    assert (obj["temperature"], obj["top_p"]) == (0.0, 1.0)


def test_the_streamed_lifecycle_echoes_the_same_numbers(flagged):
    body = {"model": "tiny-agent", "input": "Hi!", "max_output_tokens": 3, "stream": True,
            "top_p": 0.75}  # fmt: skip
    with flagged.stream("POST", "/v1/responses", json=body) as r:
        text = "".join(r.iter_text())
    objects = sse_responses(text)
    assert [o["status"] for o in objects][:2] == ["in_progress", "in_progress"]
    assert objects[-1]["status"] in ("completed", "incomplete")
    for obj in objects:
        validate(obj)
        assert {k: obj[k] for k in NUMBERS} == {
            "temperature": 0.4, "top_p": 0.75, "presence_penalty": 0.25, "frequency_penalty": 0.0
        }  # fmt: skip


def test_greedy_echoes_temperature_zero(tiny_agent):
    with app_client(tiny_agent, max_context=512, thinking=False, greedy=True) as c:
        obj = create(c, temperature=1.3)
    assert obj["temperature"] == 0.0
