"""The converted demo GGUF against transformers' own GGUF loader (the reference).

- its tokenizer encodes a set of texts to exactly the ids of
  `AutoTokenizer.from_pretrained(dir, gguf_file=...)`;
- every tensor dequantises to exactly the weight of
  `AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)` (q/k un-permuted).
"""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from ninfer.artifact import Artifact
from ninfer.artifact.format import StoredTensor
from ninfer.artifact.quant import dequantize

GGUF_NAME = "model.gguf"

TEXTS = [
    "Hello, world! This is a plain ASCII sentence.",
    "Crème brûlée, naïve café, Ångström, façade — déjà vu.",
    "日本語のテキストと中文文本，还有한국어 텍스트。",
    "Emoji: 😀🎉👩‍👩‍👧 ❤️ 🇫🇷",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "spaces:   three,\ttab,\n\nnewlines,    \n  trailing   ",
    "digits 1234567890 and 3.14159, 1,000,000 and 2024-01-31",
    "def f(x):\n    return x ** 2  # code\n",
    "it's they're I'm we'll you've HELLO'S",
    "",
    " ",
    "<|endoftext|><|im_end|>text<repo_name>x",
]


@pytest.fixture(scope="module")
def artifact(demo_artifact):
    a = Artifact(demo_artifact)
    yield a


@pytest.fixture(scope="module")
def hf_tokenizer(hf_gguf_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(hf_gguf_dir, gguf_file=GGUF_NAME)


def test_demo_metadata(artifact):
    assert artifact.name == "SmolLM2-135M-Instruct"
    assert artifact.architecture == "llama"
    c = artifact.config
    assert (
        c["hidden_size"],
        c["num_hidden_layers"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
    ) == (576, 30, 9, 3)
    assert c["head_dim"] == 64 and c["vocab_size"] == 49152 and c["tie_word_embeddings"] is True
    assert "lm_head.weight" not in artifact
    assert "<|im_start|>" in artifact.chat_template
    st = artifact.special_tokens
    im_end = Tokenizer.from_str(artifact.tokenizer_json).token_to_id("<|im_end|>")
    assert im_end in st["eos_token_ids"] and st["add_bos"] is False


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_ids_equal_transformers(artifact, hf_tokenizer, text):
    tok = Tokenizer.from_str(artifact.tokenizer_json)
    ours = tok.encode(text).ids
    assert ours == hf_tokenizer(text)["input_ids"]
    assert tok.decode(ours, skip_special_tokens=False) == text


def test_chat_template_render_encodes_like_transformers(artifact, hf_tokenizer):
    messages = [{"role": "user", "content": "What is 2+2? Réponds en français 🙂"}]
    text = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    import jinja2

    ours_text = (
        jinja2.Environment()
        .from_string(artifact.chat_template)
        .render(messages=messages, add_generation_prompt=True)
    )
    assert ours_text == text
    ids = Tokenizer.from_str(artifact.tokenizer_json).encode(ours_text).ids
    assert ids == hf_tokenizer(text)["input_ids"]
    assert ids.count(1) == 3  # every <|im_start|> stays one token


def test_weights_equal_transformers_gguf_load(artifact, demo_transformers_model):
    state = demo_transformers_model.state_dict()
    seen = set()
    for name, ref in state.items():
        ours_name = "model.embed_tokens.weight" if name == "lm_head.weight" else name
        ours = artifact.dense(ours_name)
        np.testing.assert_array_equal(ours, ref.numpy(), err_msg=name)
        seen.add(ours_name)
    assert seen == set(artifact.tensors)
    # The check can fail: stored without the un-permutation, q_proj differs from the reference.
    info = artifact.stored("model.layers.0.self_attn.q_proj.weight")
    from ninfer.artifact.convert_gguf import unpermute_rotary

    n_head = artifact.config["num_attention_heads"]
    half = info.shape[0] // n_head // 2
    # re-apply llama.cpp's permutation: HF row j*half + i -> GGUF row 2i + j (per head)
    raw = (
        info.parts["data"]
        .reshape(n_head, 2, half, -1)
        .swapaxes(1, 2)
        .reshape(info.parts["data"].shape)
    )
    permuted = dequantize(StoredTensor(info.format, info.shape, {"data": raw}))
    assert not np.array_equal(permuted, state["model.layers.0.self_attn.q_proj.weight"].numpy())
    np.testing.assert_array_equal(unpermute_rotary(raw, n_head), info.parts["data"])
