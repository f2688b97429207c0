"""`LLM.chat`: messages rendered with the artifact's chat template (the server's renderer), then
generated as `generate` does; on the trained tiny model and on the demo model."""

from __future__ import annotations

import functools

import pytest

from ninfer import LLM, SamplingParams
from ninfer.errors import ConvertError

pytestmark = pytest.mark.usefixtures("one_thread")

GREEDY = SamplingParams(max_tokens=96, temperature=0.0)


@functools.cache
def _agent(path: str) -> LLM:
    return LLM(path, max_concurrency=2, kv_capacity=2048, max_context=2048)


@pytest.mark.parametrize("name", ["capital", "sum_think", "weather_paris", "alarm_result"])
def test_chat_renders_the_template_and_answers(tiny_agent, tiny_agent_prompts, name) -> None:
    """The prompt is the template's rendering of the messages (tools, thinking switch and tool
    results included), and the trained model's greedy reply is the scripted one, ended by
    <|im_end|>."""
    llm = _agent(str(tiny_agent))
    case = next(p for p in tiny_agent_prompts if p["name"] == name)
    (out,) = llm.chat(
        case["messages"],
        GREEDY,
        tools=case["tools"] or None,
        chat_template_kwargs={"enable_thinking": case["enable_thinking"]},
    )
    assert out.prompt_token_ids == llm.tokenizer.encode(case["prompt"], add_special_tokens=False)
    assert out.finish_reason == "stop" and out.token_ids[-1] in llm.engine.eos_ids
    assert out.text == case["reply"].removesuffix("<|im_end|>")


def test_chat_takes_a_list_of_conversations(tiny_agent, tiny_agent_prompts) -> None:
    llm = _agent(str(tiny_agent))
    cases = [p for p in tiny_agent_prompts if p["name"] in ("hello", "capital", "pirate")]
    off = {"enable_thinking": False}
    outs = llm.chat([c["messages"] for c in cases], GREEDY, chat_template_kwargs=off)
    assert [o.text for o in outs] == [c["reply"].removesuffix("<|im_end|>") for c in cases]
    with pytest.raises(TypeError, match="list of messages"):
        llm.chat({"role": "user", "content": "Hi"})  # type: ignore[arg-type]


def test_a_prefilled_assistant_turn_is_continued(tiny_agent) -> None:
    """continue_final_message leaves the last (assistant) message open, as the server does for
    an Anthropic prefill: the reply continues its text."""
    llm = _agent(str(tiny_agent))
    messages = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France"},
    ]
    (out,) = llm.chat(
        messages,
        GREEDY,
        continue_final_message=True,
        chat_template_kwargs={"enable_thinking": False},
    )
    prompt = llm.tokenizer.decode(out.prompt_token_ids, skip_special_tokens=False)
    assert prompt.endswith("The capital of France")
    assert out.text.startswith(" is Paris")


@pytest.mark.slow
def test_chat_on_the_demo_model() -> None:
    """SmolLM2-135M-Instruct answers through `chat` with the prompt its own template renders
    (the ids transformers' `apply_chat_template` would give) and says Paris."""
    import jinja2

    from ninfer.artifact.demo import demo_artifact_path

    try:
        path = demo_artifact_path()
    except ConvertError as e:
        pytest.skip(str(e))
    llm = LLM(path, max_concurrency=1, kv_capacity=1024)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    (out,) = llm.chat(messages, SamplingParams(max_tokens=16, temperature=0.0))
    text = jinja2.Environment().from_string(llm.artifact.chat_template)
    rendered = text.render(messages=messages, add_generation_prompt=True)
    assert out.prompt_token_ids == llm.tokenizer.encode(rendered)
    assert "Paris" in out.text
    (same,) = llm.generate([out.prompt_token_ids], SamplingParams(max_tokens=16, temperature=0.0))
    assert same.token_ids == out.token_ids
