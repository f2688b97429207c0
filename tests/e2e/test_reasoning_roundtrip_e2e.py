"""Reasoning round trip for stateless Responses clients (Codex CLI's way), against the real
`ninfer serve` on the tiny trained agent with the official `openai` client.

Turn 1 asks for `include: ["reasoning.encrypted_content"]`; turn 2 sends the reasoning Item
back with only its token (store false, no previous_response_id). The prompt ninfer renders must
be the one the same conversation renders with raw reasoning content.
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.e2e.conftest import TINY_AGENT

PROMPTS = {
    p["name"]: p
    for p in json.loads((TINY_AGENT.parent / "tiny-agent.prompts.json").read_text())["prompts"]
}
MODEL = "tiny-agent"
FIRST = PROMPTS["weather_paris"]
QUESTION = FIRST["messages"][0]["content"]
TOOLS = [
    {
        "type": "function",
        "strict": False,
        **{k: t["function"][k] for k in ("name", "description", "parameters")},
    }
    for t in FIRST["tools"]
]
RESULT = PROMPTS["weather_paris_result"]["messages"][2]["content"]
INCLUDE = ["reasoning.encrypted_content"]


def client_of(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def client(live_server) -> openai.OpenAI:
    return client_of(live_server)


def turn1(client: openai.OpenAI, *, stream: bool, store: bool):
    args = {
        "model": MODEL, "input": QUESTION, "tools": TOOLS, "temperature": 0, "max_output_tokens": 200,
        "include": INCLUDE, "store": store,
    }  # fmt: skip
    if not stream:
        return client.responses.create(**args)
    events = list(client.responses.create(stream=True, **args))
    done = [e.item for e in events if e.type == "response.output_item.done"]
    final = events[-1].response
    assert events[-1].type == "response.completed"
    # the streamed done Item and the terminal Response carry the same token
    assert done[0].encrypted_content == final.output[0].encrypted_content
    return final


def replay(r1, *, raw: bool) -> list[dict]:
    """Turn 2's stateless input: the question, turn 1's output Items (the reasoning Item with
    only its token, or only its raw content) and the tool result."""
    items: list[dict] = [{"role": "user", "content": QUESTION}]
    for o in r1.output:
        d = o.model_dump(exclude_none=True)
        if d["type"] == "reasoning":
            d.pop("encrypted_content" if raw else "content")
        items.append(d)
    call = r1.output[-1]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": RESULT})
    return items


@pytest.mark.parametrize(
    "stream, store", [(False, False), (True, False), (False, True), (True, True)]
)
def test_token_round_trip_renders_the_raw_reasoning_prompt(client, stream, store):
    r1 = turn1(client, stream=stream, store=store)
    reasoning = r1.output[0]
    assert reasoning.type == "reasoning"
    assert reasoning.content[0].text == FIRST["expected"]["reasoning"]
    token = reasoning.encrypted_content
    assert token and token.startswith("nrs1.") and "Paris" not in token

    sealed, raw = replay(r1, raw=False), replay(r1, raw=True)
    assert "content" not in sealed[1] and sealed[1]["encrypted_content"] == token
    count = client.responses.input_tokens.count
    n_sealed = count(model=MODEL, input=sealed, tools=TOOLS).input_tokens
    n_raw = count(model=MODEL, input=raw, tools=TOOLS).input_tokens
    without = [it for it in raw if it.get("type") != "reasoning"]
    n_without = count(model=MODEL, input=without, tools=TOOLS).input_tokens
    assert n_sealed == n_raw > n_without  # the reasoning is rendered, and rendered the same

    r2 = client.responses.create(
        model=MODEL, input=sealed, tools=TOOLS, temperature=0, max_output_tokens=200, store=False
    )
    assert r2.usage.input_tokens == n_raw
    assert r2.output_text == PROMPTS["weather_paris_result"]["expected"]["content"]


def test_without_include_no_token(client):
    r = client.responses.create(
        model=MODEL, input=QUESTION, tools=TOOLS, temperature=0, max_output_tokens=200
    )
    assert r.output[0].type == "reasoning" and r.output[0].encrypted_content is None


def error_of(call) -> tuple[int, str, str]:
    with pytest.raises(openai.BadRequestError) as e:
        call()
    err = e.value.response.json()["error"]
    return e.value.status_code, err["code"], err["param"]


def test_tampered_and_foreign_tokens_are_400_naming_the_field(client, server_factory, tmp_path):
    r1 = turn1(client, stream=False, store=False)
    sealed = replay(r1, raw=False)
    token = sealed[1]["encrypted_content"]
    middle = len(token) // 2
    tampered = token[:middle] + ("A" if token[middle] != "A" else "B") + token[middle + 1 :]
    bad = [*sealed[:1], {**sealed[1], "encrypted_content": tampered}, *sealed[2:]]

    def create(c, items):
        return lambda: c.responses.create(model=MODEL, input=items, tools=TOOLS, store=False)

    assert error_of(create(client, bad)) == (
        400,
        "invalid_encrypted_content",
        "input[1].encrypted_content",
    )
    # another server (its own key file) refuses this server's token, accepts its own
    key = tmp_path / "reasoning.key"
    key.write_bytes(bytes(range(32)))
    other = client_of(server_factory("--max-context", "2048", "--reasoning-key-file", str(key)))
    assert error_of(create(other, sealed)) == (
        400,
        "invalid_encrypted_content",
        "input[1].encrypted_content",
    )
    own = replay(turn1(other, stream=False, store=False), raw=False)
    count = other.responses.input_tokens.count(model=MODEL, input=own, tools=TOOLS)
    assert (
        count.input_tokens
        == client.responses.input_tokens.count(
            model=MODEL, input=replay(r1, raw=True), tools=TOOLS
        ).input_tokens
    )


def test_other_include_values_are_still_refused(client):
    got = error_of(
        lambda: client.responses.create(
            model=MODEL, input="Hi!", include=[*INCLUDE, "file_search_call.results"]
        )
    )
    assert got == (400, "unsupported_value", "include[1]")
