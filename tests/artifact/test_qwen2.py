"""Qwen2 / Qwen2.5 computes what transformers' Qwen2ForCausalLM computes (float32, cpu), from a
Hugging Face directory and from a GGUF that mixes every GGML block type, with the GGUF's
gpt2-style tokenizer and `qwen2` pre-tokenizer converted as transformers converts it."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from artifacts.fixture_gguf import GGUF_NAME, build_gguf
from ninfer import LLM, SamplingParams
from ninfer.artifact import Artifact
from ninfer.artifact.convert_gguf import convert_gguf

TEXTS = [
    "The weather today is",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Numbers 12345 and 3.14159, café, 東京, emoji 🎉 <|im_end|>",
]


@functools.cache
def _hf(path: str, gguf_file: str | None = None):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        path, gguf_file=gguf_file, dtype=torch.float32
    ).eval()


@functools.cache
def _llm(path: str) -> LLM:
    return LLM(
        path, max_concurrency=2, kv_capacity=1024, cpu_weights="float32"
    )  # reference numerics


@pytest.fixture(scope="module")
def qwen2_gguf(fixture_root):
    """(GGUF path, its converted artifact)."""
    src = build_gguf(fixture_root)
    out = fixture_root / "qwen2-gguf.ninfer"
    if not out.exists():
        convert_gguf(src, out)
    return src, out


def _prompts(llm: LLM) -> list[list[int]]:
    g = torch.Generator().manual_seed(2)
    rand = torch.randint(0, llm.executor.vocab_size, (40,), generator=g).tolist()
    return [llm.tokenizer.encode(t) for t in TEXTS] + [rand]


def _check_against(llm: LLM, hf) -> None:
    prompts = _prompts(llm)
    for ids in prompts:
        ours = llm.logits(ids)
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0]
        err = (ours - ref).abs().max().item()
        assert err < 1e-3, f"{len(ids)} tokens: max abs error {err}"
    outs = llm.generate(prompts[:2], SamplingParams(max_tokens=24, temperature=0.0))
    for ids, out in zip(prompts[:2], outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
        ref = ref[0, len(ids) :].tolist()
        assert out.token_ids == ref
        assert len(ref) == 24 or ref[-1] in llm.eos_token_ids


def test_hf_directory_matches_transformers(fixture_artifacts, fixture_hf_dir) -> None:
    path = fixture_artifacts("qwen2")
    art = Artifact(path)
    assert art.architecture == "qwen2"
    assert "model.layers.0.self_attn.q_proj.bias" in art
    assert "model.layers.0.self_attn.o_proj.bias" not in art
    _check_against(_llm(str(path)), _hf(str(fixture_hf_dir("qwen2"))))


def test_gguf_matches_transformers_gguf_load(qwen2_gguf) -> None:
    src, out = qwen2_gguf
    art = Artifact(out)
    formats = {art.info(n).format for n in art.tensors}
    assert {
        f"gguf:{t}" for t in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
    } <= formats
    assert art.info("model.layers.1.mlp.down_proj.weight").format == "gguf:Q5_K"
    assert art.config["rope_theta"] == 1_000_000.0 and not art.config["tie_word_embeddings"]
    _check_against(_llm(str(out)), _hf(str(src.parent), GGUF_NAME))


def test_gguf_tokenizer_equals_transformers(qwen2_gguf) -> None:
    from transformers import AutoTokenizer

    src, out = qwen2_gguf
    ref = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=GGUF_NAME)
    ours = _llm(str(out)).tokenizer
    for text in TEXTS + ["  leading spaces\n\n\ttabs 2024-01-01", "<|im_start|>user\nhi<|im_end|>"]:
        ids = ours.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)


def test_compile_says_gguf_blocks_are_dequantised_at_load(qwen2_gguf, capsys) -> None:
    from ninfer.cli import main

    assert main(["compile", str(qwen2_gguf[1]), "--device", "cpu", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "gguf:Q4_K (dequantised at load)" in out  # no cpu kernel reads K-quants packed
    assert "gguf:Q8_0 (packed)" in out or "gguf:Q4_0 (packed)" in out or "gguf:Q4_1 (packed)" in out
    assert main(["compile", str(qwen2_gguf[1]), "--device", "cuda", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "(packed)" not in out and "gguf:Q4_K (dequantised at load)" in out


def test_missing_bias_is_refused(tmp_path, qwen2_gguf) -> None:
    """A qwen2 GGUF without its q bias is a one-line error naming the tensor, and no artifact."""
    import gguf

    from ninfer.errors import ConvertError

    src = qwen2_gguf[0]
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(tmp_path / "nobias.gguf"), "qwen2")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        w.add_key_value(
            field.name,
            field.contents(),
            field.types[0],
            field.types[-1] if len(field.types) > 1 else None,
        )
    for t in reader.tensors:
        if t.name == "blk.1.attn_q.bias":
            continue
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = tmp_path / "o.ninfer"
    with pytest.raises(ConvertError, match=r"missing tensor blk\.1\.attn_q\.bias"):
        convert_gguf(tmp_path / "nobias.gguf", out)
    assert not out.exists()
