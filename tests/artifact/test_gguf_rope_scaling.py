"""GGUF rope.scaling.* metadata becomes the transformers rope_scaling the model specs read:
linear and YaRN (with llama.cpp's default attention factor, 0.1·ln(factor) + 1, which is
transformers' too); a file that sets its own yarn attention factor is refused."""

from __future__ import annotations

import math

import pytest

from ninfer.artifact.convert_gguf import _config
from ninfer.errors import ConvertError
from ninfer.ir.models.spec import _rope

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
