"""The demo model (SmolLM2-135M-Instruct, GGUF Q4_1 layers and a Q8_0 tied embedding) on CPU:
the default packed weights (kernels/cpu_quant.py) against the float32 reference
(`cpu_weights="float32"`, the weights dequantised at load: LLM's choice when dtype="float32" is
asked for).

The packed GEMMs compute in bf16 (the error bound is in kernels/cpu_quant.py), so the logits
are not bit-equal: they stay within a few percent of the logit range. The greedy answers to the
chat prompts below are the float32 reference's tokens up to the first near-tie: a bf16 GEMM can
reorder two tokens whose float32 logits are closer than its error, and which prompts hit such a
tie within 32 tokens depends on the CPU's kernels. Past a tie the two answers are different
texts, so the comparison stops there, and the tie itself must be one by the reference's logits.
"""

from __future__ import annotations

import jinja2
import pytest
import torch

from kernels.cpu_quant import PackedWeight
from ninfer import LLM, SamplingParams
from ninfer.errors import ConvertError

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
]


@pytest.fixture(scope="module")
def demo_path() -> str:
    from ninfer.artifact.demo import demo_artifact_path

    try:
        return str(demo_artifact_path())
    except ConvertError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def llms(demo_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # LLM's defaults: packed weights, unless float32 compute is asked for (dtype="float32")
    yield {
        "packed": LLM(demo_path, max_concurrency=3, kv_capacity=1024),
        "float32": LLM(demo_path, dtype="float32", max_concurrency=3, kv_capacity=1024),
    }
    torch.set_num_threads(threads)


def _prompts(llm: LLM) -> list[str]:
    template = jinja2.Environment().from_string(llm.artifact.chat_template)
    return [
        template.render(messages=[{"role": "user", "content": q}], add_generation_prompt=True)
        for q in QUESTIONS
    ]


def test_plan_names_the_packed_kernels(llms):
    packed, ref = llms["packed"].plan.kernels, llms["float32"].plan.kernels
    assert packed["cpu.q4_1_int4pack"] == 120  # q|k|v, o, gate|up, down in 30 layers
    assert packed["cpu.logits_f16"] == 1 and packed["cpu.gguf_rows"] == 1
    assert "torch.linear" not in packed
    assert ref["torch.linear"] == 120 and not any(k.startswith("cpu.") for k in ref)


def test_packed_weights_hold_a_fraction_of_the_float32_bytes(llms):
    def host_bytes(llm: LLM) -> int:
        return sum(
            w.nbytes() if isinstance(w, PackedWeight) else w.numel() * w.element_size()
            for w in llm.executor.weights.values()
        )

    assert any(isinstance(w, PackedWeight) for w in llms["packed"].executor.weights.values())
    assert host_bytes(llms["packed"]) < host_bytes(llms["float32"]) / 3
    for llm in llms.values():  # the plan's ledger says what the executor holds
        assert llm.plan.ledger.bytes_of("weights") == host_bytes(llm)


TIE = 0.01  # of the largest |logit|: well inside the bf16 GEMM's error, far below a real choice


def test_greedy_answers_equal_the_float32_reference_up_to_a_tie(llms):
    prompts = _prompts(llms["packed"])
    params = SamplingParams(max_tokens=32, temperature=0.0)
    got = llms["packed"].generate(prompts, params)
    want = llms["float32"].generate(prompts, params)
    for prompt, g, w in zip(prompts, got, want):
        g_ids, w_ids = g.token_ids, w.token_ids
        i = next((i for i, (a, b) in enumerate(zip(g_ids, w_ids)) if a != b), None)
        if i is None:
            assert g_ids == w_ids, prompt
            continue
        assert i >= 4, (prompt, i)  # the opening tokens are clear choices
        ids = llms["float32"].tokenizer.encode(prompt) + list(w_ids[:i])
        ref = llms["float32"].logits(ids)[-1]
        gap = (ref[w_ids[i]] - ref[g_ids[i]]).item()
        assert 0 <= gap < TIE * ref.abs().max().item(), (prompt, i, gap)
    assert "Paris" in got[0].text


def test_logits_within_tolerance_of_the_float32_reference(llms):
    ids = llms["packed"].tokenizer.encode(_prompts(llms["packed"])[0])
    got, want = llms["packed"].logits(ids), llms["float32"].logits(ids)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    assert torch.equal(got.argmax(-1), want.argmax(-1))
