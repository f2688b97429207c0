"""The committed trained fixture (artifacts/fixtures/tiny-agent.ninfer) still does its job:
greedy decoding of each scripted prompt reasons inside <think>…</think> when thinking is on and
emits the scripted Qwen XML tool calls. transformers' Qwen3ForCausalLM, loaded with the
artifact's weights, is the reference that runs it."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import torch

from artifacts.train_tiny import greedy
from ninfer.artifact import Artifact

CALL = re.compile(r"<tool_call>\n<function=([^>\n]+)>\n(.*?)</function>\n</tool_call>", re.DOTALL)
PARAM = re.compile(r"<parameter=([^>\n]+)>\n(.*?)\n</parameter>\n", re.DOTALL)


def parse_reply(text: str, thinking: bool, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """Split a reply (generated after the generation prompt) into reasoning, content, tool calls."""
    assert text.endswith("<|im_end|>"), text
    text = text[: -len("<|im_end|>")]
    reasoning = None
    if thinking:
        reasoning, sep, text = text.partition("\n</think>\n\n")
        assert sep, f"no </think> in {text!r}"
    assert "<think>" not in text and "</think>" not in text
    content, _, calls_text = text.partition("<tool_call>")
    types = {
        t["function"]["name"]: {
            p: s["type"] for p, s in t["function"]["parameters"]["properties"].items()
        }
        for t in tools
    }
    calls = []
    for name, body in CALL.findall("<tool_call>" + calls_text if calls_text else ""):
        args = {}
        for key, raw in PARAM.findall(body):
            args[key] = raw if types[name][key] == "string" else json.loads(raw)
        calls.append({"name": name, "arguments": args})
    return {"reasoning": reasoning, "content": content.strip(), "tool_calls": calls}


@pytest.fixture(scope="module")
def agent(tiny_agent):
    from tokenizers import Tokenizer
    from transformers import Qwen3Config, Qwen3ForCausalLM

    art = Artifact(tiny_agent)
    art.verify()
    cfg = Qwen3Config(
        **{
            k: v
            for k, v in art.config.items()
            if k not in ("architectures", "transformers_version")
        }
    )
    model = Qwen3ForCausalLM(cfg).float().eval()
    state = {name: torch.from_numpy(art.dense(name).copy()) for name in art}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert unexpected == [] and missing == (["lm_head.weight"] if cfg.tie_word_embeddings else [])
    model.tie_weights()
    return art, model, Tokenizer.from_str(art.tokenizer_json)


def test_artifact_header(agent):
    art, _, tok = agent
    assert (art.architecture, art.name) == ("qwen3", "tiny-agent")
    assert art.path.stat().st_size < 8 << 20  # a few MB, fit to commit
    assert art.special_tokens["eos_token"] == "<|im_end|>"
    assert art.special_tokens["eos_token_ids"][0] == tok.token_to_id("<|im_end|>")
    assert "<tool_call>" in art.chat_template and "<think>" in art.chat_template


def test_prompts_render_with_the_embedded_template(agent, tiny_agent_prompts):
    from transformers import PreTrainedTokenizerFast

    art, _, tok = agent
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")
    hf.chat_template = art.chat_template
    for p in tiny_agent_prompts:
        text = hf.apply_chat_template(
            p["messages"], tools=p["tools"] or None, tokenize=False, add_generation_prompt=True,
            enable_thinking=p["enable_thinking"],
        )  # fmt: skip
        assert text == p["prompt"], p["name"]


def test_committed_prompts_match_the_training_script(agent, tiny_agent_prompts):
    """artifacts/agent_corpus.py, rendered with the artifact's template, gives the committed
    prompts and replies: the script and the committed files have not drifted apart."""
    from transformers import PreTrainedTokenizerFast

    from artifacts.agent_corpus import examples
    from artifacts.train_tiny import render

    art, _, tok = agent
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")
    hf.chat_template = art.chat_template
    exs = examples()
    assert [e.name for e in exs] == [p["name"] for p in tiny_agent_prompts]
    for e, p in zip(exs, tiny_agent_prompts, strict=True):
        assert json.loads(json.dumps(e.messages)) == p["messages"], e.name
        assert json.loads(json.dumps(e.tools)) == p["tools"], e.name
        assert render(e, hf) == (p["prompt"], p["reply"]), e.name


def test_server_renderer_encodes_prompts_as_trained(agent, tiny_agent_prompts):
    """ninfer's own template renderer and prompt encoder give the ids the model was trained on."""
    template = pytest.importorskip("ninfer.api.service.template")
    from ninfer.api.service.prompt_encoding import encode_prompt

    art, _, tok = agent
    chat = template.chat_template_for(art.chat_template, tok)
    for p in tiny_agent_prompts:
        options = template.TemplateOptions(enable_thinking=p["enable_thinking"])
        rendered = chat.render(p["messages"], tools=p["tools"] or None, options=options)
        assert rendered.text == p["prompt"], p["name"]
        ids = encode_prompt(tok, rendered.text, rendered.special_spans)
        assert ids == tok.encode(p["prompt"]).ids, p["name"]


def test_scripted_turns_cover_reasoning_and_tool_calls(tiny_agent_prompts):
    """The corpus the e2e tests rely on: both thinking modes, every parameter type, parallel
    calls, content before a call, tool results, multi-turn history and a system prompt."""
    ps = tiny_agent_prompts
    assert 20 <= len(ps) <= 40
    assert {p["enable_thinking"] for p in ps} == {True, False}
    calls = [c for p in ps for c in p["expected"]["tool_calls"]]
    kinds = {type(v).__name__ for c in calls for v in c["arguments"].values()}
    assert {"str", "int", "float", "bool", "dict"} <= kinds
    assert any(
        isinstance(v, list)
        for c in calls
        for a in c["arguments"].values()
        if isinstance(a, dict)
        for v in a.values()
    )
    assert any(len(p["expected"]["tool_calls"]) == 2 for p in ps)
    assert any(p["expected"]["tool_calls"] and p["expected"]["content"] for p in ps)
    assert any(p["messages"][-1]["role"] == "tool" for p in ps)
    assert any(sum(m["role"] == "user" for m in p["messages"]) >= 2 for p in ps)
    assert any(p["messages"][0]["role"] == "system" for p in ps)
    assert any(p["expected"]["reasoning"] and not p["expected"]["tool_calls"] for p in ps)


def test_greedy_decoding_thinks_and_calls_tools(agent, tiny_agent_prompts):
    """Teacher-forced: at each reply position, the argmax given the reply so far is the next reply
    token - exactly the condition for greedy decoding to reproduce the reply - with a margin."""
    _, model, tok = agent
    thought = called = 0
    for p in tiny_agent_prompts:
        prompt, reply = tok.encode(p["prompt"]).ids, tok.encode(p["reply"]).ids
        with torch.no_grad():
            logits = model(torch.tensor([prompt + reply])).logits[0, len(prompt) - 1 : -1]  # [R, V]
        top2 = logits.topk(2, dim=-1)
        out = tok.decode(top2.indices[:, 0].tolist(), skip_special_tokens=False)
        got = parse_reply(out, p["enable_thinking"], p["tools"])
        assert got == p["expected"], p["name"]
        assert out == p["reply"], p["name"]
        assert float((top2.values[:, 0] - top2.values[:, 1]).min()) > 1.0, p["name"]
        thought += bool(got["reasoning"])
        called += bool(got["tool_calls"])
    assert thought >= 10 and called >= 10


@pytest.mark.parametrize("name", ["weather_two", "search_recipes", "multi_rome"])
def test_generate_replays_reply(name, agent, tiny_agent_prompts):
    _, model, tok = agent
    p = next(p for p in tiny_agent_prompts if p["name"] == name)
    ids = greedy(model, tok.encode(p["prompt"]).ids, 200, tok.token_to_id("<|im_end|>"))
    out = tok.decode(ids, skip_special_tokens=False)
    assert out == p["reply"]
    assert parse_reply(out, p["enable_thinking"], p["tools"]) == p["expected"]


def test_the_recorded_sampling_defaults_replay_every_turn(agent, tiny_agent_prompts):
    """A client that sends no sampling field is served with the artifact's recorded defaults
    (Qwen3's generation_config: temperature 0.6, top_p 0.95, top_k 20). The training margin makes
    that distribution keep the reply token alone at every reply position (top-p drops every
    rival: artifacts/train_tiny.py, `replay_margin`), so an agent run with its defaults, such as
    the openai-agents SDK's in tests/e2e, follows the scripted turns whatever the seed."""
    from ninfer.api.service.sampling import FIELDS, SamplerPolicy
    from ninfer.runtime.executors.sampler import Sampler
    from ninfer.runtime.request import SamplingParams

    art, model, tok = agent
    policy = SamplerPolicy(art.architecture, art.generation)
    for p in tiny_agent_prompts:
        r = policy.resolve(p["enable_thinking"], dict.fromkeys((*FIELDS, "seed")))
        params = SamplingParams(**{k: r[k] for k in ("temperature", "top_p", "top_k", "min_p")})
        assert params.temperature > 0 and params.top_p < 1  # sampled, not greedy
        prompt, reply = tok.encode(p["prompt"]).ids, tok.encode(p["reply"]).ids
        with torch.no_grad():
            logits = model(torch.tensor([prompt + reply])).logits[0, len(prompt) - 1 : -1]
        probs = Sampler.probabilities(logits.float(), [params] * len(reply))  # [R, V]
        kept = (probs > 0).sum(dim=-1)
        assert kept.max() == 1 and probs.argmax(-1).tolist() == reply, p["name"]
