"""Where explicit prompt-cache breakpoints put their checkpoints (docs/serving.md, "Prompt
caching hints", and the Anthropic cache_control rules): at the end of the marked part itself -
a content part, a system block, a tool definition, a tool call, a tool result - never after the
rest of its message or its closing tokens. Real tokenizer and template; preparation stops
before the engine. A boundary inside a token is ignored, and locating boundaries never encodes
the whole prompt again."""

from __future__ import annotations

from typing import Any

import pytest

from ninfer.api.anthropic.request import parse_messages_request
from ninfer.api.service.model_service import ModelService
from tests.api.chat_request_helpers import prepare_chat
from tests.api.test_anthropic_request import EPHEMERAL, WEATHER, assistant, result, text, user

MODEL = "tiny-model"
BP = {"mode": "explicit"}
DOC = "You are a helpful assistant. It is sunny and warm."
QUESTION = " What is the weather in Paris?"


@pytest.fixture
def service(prompt_service) -> ModelService:
    return prompt_service


def chat(service: ModelService, messages: list[dict[str, Any]], **fields: Any):
    return prepare_chat(service, messages, **({"prompt_cache_options": BP} | fields))


def anthropic(service: ModelService, body: dict[str, Any]):
    req = parse_messages_request(
        {"model": "claude-local", **body}, vision=False, default_max_tokens=16
    )
    return service.prepare(req.generation_request())


def ends(service: ModelService, prepared) -> list[str]:
    """The prompt text up to each checkpoint."""
    return [
        service.tokenizer.decode(prepared.prompt_ids[:c], skip_special_tokens=False)
        for c in prepared.checkpoint_positions
    ]


def test_chat_breakpoint_ends_the_marked_part_not_its_message(service):
    marked = {"type": "text", "text": DOC, "prompt_cache_breakpoint": BP}
    messages = [{"role": "user", "content": [marked, {"type": "text", "text": QUESTION}]}]
    p = chat(service, messages)
    (at_doc,) = ends(service, p)  # one message: no conversation-end candidate
    assert at_doc == "<|im_start|>user\n" + DOC
    # a later request with another question shares the prompt up to the checkpoint
    other = [{"role": "user", "content": [marked, {"type": "text", "text": " And Rome?"}]}]
    q = chat(service, other)
    c = p.checkpoint_positions[0]
    assert q.prompt_ids[:c] == p.prompt_ids[:c] and q.checkpoint_positions == (c,)


def test_chat_breakpoint_on_an_earlier_message_precedes_its_closing_tokens(service):
    marked = {"type": "text", "text": DOC, "prompt_cache_breakpoint": BP}
    messages = [
        {"role": "system", "content": [marked]},
        {"role": "user", "content": QUESTION},
    ]
    at_doc, conversation_end = ends(service, chat(service, messages))
    assert at_doc == "<|im_start|>system\n" + DOC
    assert conversation_end.endswith(QUESTION + "<|im_end|>\n")


def test_chat_breakpoint_inside_a_token_is_ignored(service):
    split = [
        {"type": "text", "text": "wea", "prompt_cache_breakpoint": BP},
        {"type": "text", "text": "ther"},
    ]
    plain = chat(service, [{"role": "user", "content": "weather"}])
    p = chat(service, [{"role": "user", "content": split}])
    assert p.prompt_ids == plain.prompt_ids and p.checkpoint_positions == ()


def test_anthropic_breakpoints_end_their_blocks(service):
    body = {
        "tools": [{**WEATHER, "cache_control": EPHEMERAL}],
        "system": [text(DOC, cache_control=EPHEMERAL), text(" Be brief.")],
        "messages": [
            user([text("Weather?"), text(QUESTION)]),
            assistant(
                [
                    text("Let me check."),
                    {
                        "type": "tool_use",
                        "id": "t1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                        "cache_control": EPHEMERAL,
                    },
                ]
            ),
            user([result("t1", "It is sunny.", cache_control=EPHEMERAL)]),
        ],
    }
    got = ends(service, anthropic(service, body))
    assert got[0] == "<|im_start|>system\n" + DOC  # the first system block
    assert got[1].endswith('"required": ["city"]}}}')  # the tool's definition
    assert got[1].count("get_weather") == 1
    assert got[2].endswith("Paris\n</parameter>\n</function>\n</tool_call>")  # the tool_use
    assert got[3].endswith("<tool_response>\nIt is sunny.")  # the tool_result
    assert got[4].endswith("</tool_response><|im_end|>\n")  # the conversation end
    assert len(got) == 5
    # a user block followed by more of its turn
    body["messages"][0] = user([text("Weather?", cache_control=EPHEMERAL), text(QUESTION)])
    del body["tools"][0]["cache_control"]
    got = ends(service, anthropic(service, body))
    assert got[1].endswith("<|im_start|>user\nWeather?")


def test_locating_breakpoints_encodes_only_the_marked_pieces(service):
    long_system = " ".join([DOC] * 60)  # ~3,000 characters before the marked message
    marked = {"type": "text", "text": DOC, "prompt_cache_breakpoint": BP}
    messages = [
        {"role": "system", "content": long_system},
        {"role": "user", "content": [marked, {"type": "text", "text": QUESTION}]},
    ]
    encoded: list[int] = []
    encode = service.encoder.encode

    def counting(text: str, spans=()):  # the real encoder, measured
        encoded.append(len(text))
        return encode(text, spans)

    service.encoder.encode = counting  # type: ignore[method-assign]
    p = chat(service, messages)
    at_doc, _ = ends(service, p)
    assert at_doc.endswith("<|im_start|>user\n" + DOC)
    assert encoded[0] > len(long_system)  # the prompt itself, once
    assert max(encoded[1:]) <= len(DOC) + len(QUESTION) + len("<|im_end|>\n")
