"""Building the GenerationRequest of a Responses create from the request and the stored chain:
history replay, instructions for this request only, preserve_thinking inheritance and the
engine session key of a chain (no engine needed: preparation stops before generation)."""

from __future__ import annotations

from typing import Any

import pytest

from ninfer.api.responses.endpoints import list_page, prepare, response_object, response_store
from ninfer.api.responses.request import parse_count_request, parse_create_request
from ninfer.api.responses.store import make_record
from ninfer.api.server.state import ServerState
from ninfer.api.wire.errors import ApiError
from ninfer.runtime.request import SamplingParams
from tests.api.live_app import serve_config

MODEL = "tiny-model"


@pytest.fixture
def state() -> ServerState:
    return ServerState(config=serve_config(max_context=4096), model_id=MODEL)


def turn(state: ServerState, answer: str = "A", **fields: Any):
    """Prepare a create and store its (hand-made) completed result, as the handler does."""
    req = parse_create_request({"model": MODEL, **fields}, model_id=MODEL, vision=False)
    p = prepare(state, req)
    p.record_sampling(SamplingParams())  # as the service does once it has prepared the prompt
    out = [{"id": "msg_out_" + p.response_id, "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": answer, "annotations": []}]}]  # fmt: skip
    obj = response_object(p, 0, "completed", out, model=MODEL)
    if req.store:
        response_store(state).put(
            make_record(
                obj,
                req.input_items,
                p.parent,
                preserve_thinking=p.options.preserve_thinking,
                session_key=p.session_key,
            )
        )
    return p


def test_chain_replays_history_and_instructions_apply_once(state):
    p1 = turn(state, "Hello", input="Hi", instructions="Be brief.", preserve_thinking=True)
    assert p1.generation.messages == [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    p2 = turn(state, input="Again", previous_response_id=p1.response_id)
    assert p2.generation.messages == [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Again"}
    ]  # fmt: skip
    assert p2.generation.protocol == "responses" and p2.generation.cache_points == ()
    # the automatic candidate (end of the last message's text) is the service's to place
    assert p2.generation.implicit_cache_point
    explicit = {"model": MODEL, "input": "x", "prompt_cache_options": {"mode": "explicit"}}
    p3 = prepare(state, parse_create_request(explicit, model_id=MODEL, vision=False))
    assert not p3.generation.implicit_cache_point


def test_empty_instructions_add_no_developer_turn(state):
    p = turn(state, input="Hi", instructions="")
    assert p.generation.messages == [{"role": "user", "content": "Hi"}]


def test_children_inherit_preserve_thinking_unless_they_set_it(state):
    p1 = turn(state, input="Hi", preserve_thinking=True)
    p2 = turn(state, input="more", previous_response_id=p1.response_id)
    assert p2.options.preserve_thinking is True
    p3 = turn(
        state,
        input="more",
        previous_response_id=p2.response_id,
        chat_template_kwargs={"preserve_thinking": False},
    )
    assert p3.options.preserve_thinking is False
    p4 = turn(state, input="more", previous_response_id=p3.response_id)
    assert p4.options.preserve_thinking is False


def test_session_key_follows_the_stored_chain(state):
    root = turn(state, input="Hi")
    assert root.session_key == "resp:" + root.response_id == root.generation.session_key
    child = turn(state, input="x", previous_response_id=root.response_id)
    assert child.session_key == root.session_key
    anon_child = turn(state, input="y", previous_response_id=child.response_id, store=False)
    assert anon_child.generation.session_key is None  # reads the chain but never moves its endpoint
    anon_root = turn(state, input="z", store=False)
    assert anon_root.session_key is None
    with pytest.raises(ApiError) as e:
        turn(state, input="w", previous_response_id=anon_root.response_id)
    assert (e.value.status, e.value.code) == (404, "response_not_found")


def test_input_may_be_empty_only_after_a_user_query(state):
    root = turn(state, input="Hi")
    assert (
        turn(state, input=[], previous_response_id=root.response_id).generation.messages[-1]["role"]
        == "assistant"
    )
    with pytest.raises(ApiError) as e:
        turn(state)
    assert (e.value.code, e.value.param) == ("missing_required_parameter", "input")


def test_replayed_item_ids_may_not_repeat_history(state):
    root = turn(state, input=[{"role": "user", "content": "Hi", "id": "msg_1"}])
    with pytest.raises(ApiError) as e:
        turn(
            state,
            input=[{"role": "user", "content": "x", "id": "msg_1"}],
            previous_response_id=root.response_id,
        )
    assert (e.value.code, e.value.param) == ("duplicate_item_id", "input[0].id")


def test_tool_choice_controls_rendering_and_parsing(state):
    fn = [{"type": "function", "name": "a"}, {"type": "function", "name": "b"}]
    none = prepare(
        state,
        parse_create_request(
            {"model": MODEL, "input": "x", "tools": fn, "tool_choice": "none"},
            model_id=MODEL,
            vision=False,
        ),
    )
    assert [t["function"]["name"] for t in none.generation.tools] == [
        "a",
        "b",
    ] and not none.generation.parse_tools
    allowed = {
        "type": "allowed_tools",
        "mode": "auto",
        "tools": [{"type": "function", "name": "b"}],
    }
    only_b = prepare(
        state,
        parse_create_request(
            {"model": MODEL, "input": "x", "tools": fn, "tool_choice": allowed},
            model_id=MODEL,
            vision=False,
        ),
    )
    # allowed_tools keeps the whole declared list in the prompt; only "b" may become a call
    names = lambda tools: [t["function"]["name"] for t in tools]
    assert names(only_b.generation.tools) == ["a", "b"] and only_b.generation.parse_tools
    assert names(only_b.generation.callable_tools) == ["b"]
    assert none.generation.callable_tools is None


def test_count_request_prepares_the_same_prompt(state):
    body = {
        "model": MODEL,
        "input": "x",
        "instructions": "i",
        "tools": [{"type": "function", "name": "a"}],
    }
    create = prepare(state, parse_create_request(body, model_id=MODEL, vision=False)).generation
    count = prepare(state, parse_count_request(body, model_id=MODEL, vision=False)).generation
    assert (create.messages, create.tools, create.template_options) == (
        count.messages,
        count.tools,
        count.template_options,
    )


def test_list_page():
    items = [{"id": f"i{n}"} for n in range(5)]
    page = list_page(items, after=None, limit=2, order="desc")
    assert (
        [i["id"] for i in page["data"]] == ["i4", "i3"]
        and page["has_more"]
        and page["first_id"] == "i4"
    )
    page = list_page(items, after="i1", limit=20, order="asc")
    assert (
        [i["id"] for i in page["data"]] == ["i2", "i3", "i4"]
        and not page["has_more"]
        and page["last_id"] == "i4"
    )
    with pytest.raises(ApiError):
        list_page(items, after="zz", limit=2, order="asc")
