"""ninfer computes the same function as transformers on every fixture architecture (float32, cpu):
logits within 1e-3 for prompts of 1, 7 and 300 tokens, chunked prefill + decode equal to one
full prefill within 1e-4, and 64-token greedy continuations equal to `generate`."""

from __future__ import annotations

import functools

import pytest
import torch
from real_engine import assert_logits_match

from ninfer import LLM, SamplingParams
from ninfer.runtime.step import SeqChunk, StepBatch

ARCHS = ("llama", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe")


pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def _hf(path: str):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@functools.cache
def _llm(path: str) -> LLM:
    return LLM(path, max_concurrency=2, kv_capacity=1024)


def _prompt(n: int, seed: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(arch, fixture_artifacts, fixture_hf_dir) -> None:
    llm, hf = _llm(str(fixture_artifacts(arch))), _hf(str(fixture_hf_dir(arch)))
    for n in (1, 7, 300):
        assert_logits_match(llm, hf, _prompt(n, n, llm.executor.vocab_size), f"{arch}, {n} tokens")


@pytest.mark.parametrize("arch", ARCHS)
def test_chunked_prefill_and_decode_equal_full_prefill(arch, fixture_artifacts) -> None:
    ex = _llm(str(fixture_artifacts(arch))).executor
    ids = _prompt(300, 300, ex.vocab_size)
    pages = tuple(reversed(range(ex.num_pages)))[: -(-len(ids) // ex.page_size)]  # non-contiguous
    slot = 1 if ex.is_hybrid else None
    full = ex.run(StepBatch((SeqChunk(7, tuple(ids), 0, pages, slot),)), all_logits=True)
    parts, pos = [], 0
    while pos < len(ids):
        n = 64 if pos + 64 <= 256 else 1
        chunk = SeqChunk(7, tuple(ids[pos : pos + n]), pos, pages, slot)
        parts.append(ex.run(StepBatch((chunk,)), all_logits=True))
        pos += n
    chunked = torch.cat(parts)
    assert len(parts) == 4 + 44
    err = (chunked - full).abs().max().item()
    assert err < 1e-4, f"{arch}: chunked differs from full prefill by {err}"


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_continuation_matches_generate(arch, fixture_artifacts, fixture_hf_dir) -> None:
    llm, hf = _llm(str(fixture_artifacts(arch))), _hf(str(fixture_hf_dir(arch)))
    prompts = [
        llm.tokenizer.encode("The weather today is"),
        _prompt(23, 5, llm.executor.vocab_size),
    ]
    outs = llm.generate(prompts, SamplingParams(max_tokens=64, temperature=0.0))
    for ids, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False)[
                0, len(ids) :
            ].tolist()
        assert out.token_ids == ref
        assert len(ref) == 64 or ref[-1] in llm.eos_token_ids
