"""OpenAI prompt caching in Chat Completions: the prefix checkpoints a request asks the engine
to keep. Omitted or mode "implicit" prompt_cache_options add the automatic candidate at the end
of the latest message's text, before its closing tokens, so that a later request whose message
grew shares it; mode "explicit" and four explicit markers leave it out. Real template and
tokenizer; preparation stops before the engine."""

from __future__ import annotations

import pytest

from ninfer.api.service.model_service import ModelService
from tests.api.chat_request_helpers import prepare_chat as prepare

MODEL = "tiny-model"
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
QUESTION = "What is the weather in Paris?"


@pytest.fixture
def service(prompt_service) -> ModelService:
    return prompt_service


def decode(service: ModelService, ids: list[int]) -> str:
    return service.tokenizer.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("options", [None, {"mode": "implicit"}])
def test_implicit_candidate_ends_the_latest_message_text(service, options):
    fields = {} if options is None else {"prompt_cache_options": options}
    p = prepare(service, [SYSTEM, {"role": "user", "content": QUESTION}], **fields)
    implicit, end = p.checkpoint_positions  # plus the conversation end before the reply
    assert decode(service, p.prompt_ids[:implicit]).endswith("user\n" + QUESTION)
    assert decode(service, p.prompt_ids[:end]).endswith(QUESTION + "<|im_end|>\n")
    # the same message grown: its earlier tokens are an exact prefix, up to the candidate
    grown = prepare(service, [SYSTEM, {"role": "user", "content": QUESTION + " And Rome?"}])
    assert grown.prompt_ids[:implicit] == p.prompt_ids[:implicit]
    assert grown.prompt_ids[:end] != p.prompt_ids[:end]


def test_explicit_mode_disables_the_implicit_write(service):
    msgs = [SYSTEM, {"role": "user", "content": QUESTION}]
    p = prepare(service, msgs, prompt_cache_options={"mode": "explicit"})
    (end,) = p.checkpoint_positions
    assert decode(service, p.prompt_ids[:end]).endswith("<|im_end|>\n")


def test_four_explicit_markers_leave_no_slot_for_the_implicit_candidate(service):
    marked = {"type": "text", "text": "m", "prompt_cache_breakpoint": {"mode": "explicit"}}
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": [marked]} for i in range(4)]
    three = prepare(service, [*msgs[:3], {"role": "user", "content": QUESTION}])
    four = prepare(service, [*msgs, {"role": "user", "content": QUESTION}])
    ends = [decode(service, three.prompt_ids[:c]) for c in three.checkpoint_positions]
    assert ends[-2].endswith(QUESTION)  # three markers: the implicit candidate still fits
    assert not any(
        decode(service, four.prompt_ids[:c]).endswith(QUESTION) for c in four.checkpoint_positions
    )
