"""GGUF rope.scaling.* metadata becomes the transformers rope_scaling the model specs read:
linear and YaRN (with llama.cpp's default attention factor, 0.1·ln(factor) + 1, which is
transformers' too); a file that sets its own yarn attention factor is refused."""

from __future__ import annotations

import math

import pytest

from ninfer.artifact.convert_gguf import _config
from ninfer.artifact.model_spec import _rope
from ninfer.errors import ConvertError

BASE = {
    "qwen3.embedding_length": 64, "qwen3.block_count": 2, "qwen3.attention.head_count": 4,
    "qwen3.attention.head_count_kv": 2, "qwen3.feed_forward_length": 128,
    "qwen3.context_length": 131072, "qwen3.rope.freq_base": 1e6,
}  # fmt: skip


def config(**scaling) -> dict:
    meta = dict(BASE) | {f"qwen3.rope.scaling.{k}": v for k, v in scaling.items()}
    return _config(meta, "qwen3", tie=True, vocab_size=512)


def test_yarn_metadata_becomes_transformers_yarn():
    cfg = config(type="yarn", factor=4.0, original_context_length=32768)
    assert cfg["rope_scaling"] == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 32768,
    }
    rope = _rope(cfg)
    assert rope["type"] == "yarn" and rope["original_max_position_embeddings"] == 32768
    assert rope["attention_factor"] == pytest.approx(0.1 * math.log(4.0) + 1.0)


def test_linear_and_none():
    assert config(type="linear", factor=2.0)["rope_scaling"] == {
        "rope_type": "linear",
        "factor": 2.0,
    }
    assert "rope_scaling" not in config(type="none")


@pytest.mark.parametrize("extra", ["attn_factor", "yarn_log_multiplier"])
def test_yarn_with_its_own_attention_factor_is_refused(extra):
    with pytest.raises(ConvertError, match=extra):
        config(type="yarn", factor=4.0, original_context_length=32768, **{extra: 0.7})


def test_other_scalings_are_refused():
    with pytest.raises(ConvertError, match="longrope"):
        config(type="longrope", factor=4.0)


def llama3_factors(theta: float, dim: int, factor: float, lo: float, hi: float, old: int):
    """The rope_freqs tensor llama.cpp's convert_hf_to_gguf writes for a Llama 3.1-style
    rope_scaling: one divisor per rotary frequency."""
    out = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * theta ** (i / dim)
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


def test_llama3_rope_freqs_tensor_matches_transformers_llama3(tmp_path, write_gguf):
    """A Llama 3.1-style GGUF (no rope.scaling keys; a rope_freqs.weight tensor) converts and
    computes what transformers' Llama with the same llama3 rope_scaling computes."""
    import numpy as np
    import torch
    import transformers

    from ninfer import LLM
    from ninfer.artifact import Artifact
    from ninfer.artifact.convert_gguf import convert_gguf, unpermute_rotary
    from tests.artifact.test_gguf_convert import HEAD_DIM, HEADS, HIDDEN, VOCAB, f32_llama

    theta, scaling = 5e5, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    old = 64
    tensors = f32_llama(HIDDEN, HEADS, HEAD_DIM, 128)
    factors = llama3_factors(theta, HEAD_DIM, scaling["factor"], 1.0, 4.0, old)
    assert len(set(factors)) > 2  # low, high and smoothed frequencies all occur
    tensors["rope_freqs.weight"] = (np.array(factors, np.float32), None)
    hp = {"rope.freq_base": theta, "attention.head_count_kv": HEADS, "context_length": 128}
    out = convert_gguf(
        write_gguf(tmp_path / "l3.gguf", tensors, hparams=hp), tmp_path / "l3.ninfer"
    )
    assert "rope_freqs.weight" not in Artifact(out).tensors

    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=128,
        rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": theta,
                         "original_max_position_embeddings": old, **scaling},
    )  # fmt: skip
    hf = transformers.LlamaForCausalLM(cfg).eval()
    g = {n: torch.from_numpy(np.array(a)) for n, (a, _) in tensors.items()}
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
             "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}  # fmt: skip
    state = {f"model.layers.0.{hf_n}.weight": g[f"blk.0.{n}.weight"] for n, hf_n in names.items()}
    for n in ("attn_q", "attn_k"):
        w = unpermute_rotary(tensors[f"blk.0.{n}.weight"][0], HEADS)
        state[f"model.layers.0.{names[n]}.weight"] = torch.from_numpy(np.array(w))
    state |= {"model.embed_tokens.weight": g["token_embd.weight"],
              "model.norm.weight": g["output_norm.weight"], "lm_head.weight": g["token_embd.weight"]}  # fmt: skip
    hf.load_state_dict(state, strict=True)
    ids = [(i * 37) % (VOCAB - 3) + 3 for i in range(60)]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    llm = LLM(str(out), max_concurrency=1, kv_capacity=128, max_context=128)
    err = (llm.logits(ids) - ref).abs().max().item()
    assert err < 1e-3 * ref.abs().max().item(), err


def test_the_older_scale_linear_key_is_linear_scaling():
    meta = dict(BASE) | {"qwen3.rope.scale_linear": 4.0}
    assert _config(meta, "qwen3", tie=True, vocab_size=512)["rope_scaling"] == {
        "rope_type": "linear",
        "factor": 4.0,
    }
    assert "rope_scaling" not in _config(dict(BASE) | {"qwen3.rope.scale_linear": 1.0}, "qwen3",
                                         tie=True, vocab_size=512)  # fmt: skip


def test_partial_rotary_is_refused():
    meta = dict(BASE) | {"qwen3.attention.key_length": 32, "qwen3.rope.dimension_count": 16}
    with pytest.raises(ConvertError, match="rope.dimension_count=16 rotates part of a 32-wide"):
        _config(meta, "qwen3", tie=True, vocab_size=512)
    whole = _config(dict(meta) | {"qwen3.rope.dimension_count": 32}, "qwen3", True, 512)
    assert whole["head_dim"] == 32
