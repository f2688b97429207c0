"""The tiny random fixtures: each architecture builds, converts, and its artifact holds exactly
the Hugging Face model's weights (fused experts split per expert, docs/artifact.md)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from safetensors import safe_open

from artifacts.fixtures import ARCHS, build_fixture, chat_template, main
from artifacts.tokenizer import ADDED_TOKENS, VOCAB_SIZE
from ninfer.artifact import Artifact

TEXTS = ["Hello, world!", "Café naïve 你好 🙂", "<|im_start|>user\n<think>\nhm\n</think><|im_end|>"]


def expected_tensors(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The model's state dict under artifact names: fused experts split, tied head dropped."""
    out: dict[str, np.ndarray] = {}
    for name, t in model.state_dict().items():
        a = t.detach().float().numpy()
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        m = re.match(r"(.*\.experts)\.(gate_up_proj|down_proj)$", name)
        if m is None:
            out[name] = a
            continue
        prefix, kind = m.groups()
        for e in range(a.shape[0]):  # gate_up_proj [E, 2I, H] = gate | up; down_proj [E, H, I]
            if kind == "gate_up_proj":
                inter = a.shape[1] // 2
                out[f"{prefix}.{e}.gate_proj.weight"] = a[e, :inter]
                out[f"{prefix}.{e}.up_proj.weight"] = a[e, inter:]
            else:
                out[f"{prefix}.{e}.down_proj.weight"] = a[e]
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_fixture_artifact_equals_hf_model(arch, fixture_artifacts, fixture_hf_dir):
    from transformers import AutoModelForCausalLM

    art = Artifact(fixture_artifacts(arch))
    model = AutoModelForCausalLM.from_pretrained(fixture_hf_dir(arch), dtype=torch.float32)
    want = expected_tensors(model)
    assert art.architecture == arch
    assert art.name == f"tiny-{arch}"
    assert set(art) == set(want)
    for name, value in want.items():
        assert art.info(name).format == "f32", name
        np.testing.assert_array_equal(art.dense(name), value, err_msg=name)
    assert art.verify() > 0
    cfg = art.config
    assert (
        cfg["hidden_size"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
    ) == (64, 4, 2, 16)
    assert cfg["vocab_size"] == VOCAB_SIZE


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_5_moe"])
def test_moe_fixtures_have_experts_top2(arch, fixture_artifacts, fixture_hf_dir):
    cfg = Artifact(fixture_artifacts(arch)).config
    assert cfg["num_experts"] == 8 and cfg["num_experts_per_tok"] == 2
    with safe_open(str(fixture_hf_dir(arch) / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    fused = any(k.endswith("experts.gate_up_proj") for k in keys)
    # Qwen3.5-MoE checkpoints ship fused experts, Qwen3-MoE ones per expert: the converter sees both
    assert fused == (arch == "qwen3_5_moe")


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_5_moe"])
def test_qwen3_5_fixtures_mix_linear_and_full_attention(arch, fixture_artifacts):
    art = Artifact(fixture_artifacts(arch))
    types = art.config["layer_types"]
    assert set(types) == {"linear_attention", "full_attention"}
    for i, kind in enumerate(types):
        prefix = f"model.layers.{i}.{'linear_attn' if kind == 'linear_attention' else 'self_attn'}."
        assert any(n.startswith(prefix) for n in art), prefix


def test_fixture_tokenizer_template_and_special_tokens(fixture_artifacts, fixture_hf_dir):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    art = Artifact(fixture_artifacts("qwen3"))
    ours = Tokenizer.from_str(art.tokenizer_json)
    hf = AutoTokenizer.from_pretrained(fixture_hf_dir("qwen3"))
    assert ours.get_vocab_size() == VOCAB_SIZE
    for text in TEXTS:
        ids = ours.encode(text, add_special_tokens=False).ids
        assert ids == hf(text, add_special_tokens=False)["input_ids"]
        assert ours.decode(ids, skip_special_tokens=False) == text
    # added tokens are single ids; markup compresses well below one token per byte
    for t in ADDED_TOKENS:
        assert len(ours.encode(t, add_special_tokens=False).ids) == 1, t
    markup = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
    assert len(ours.encode(markup).ids) < len(markup.encode()) / 2.5
    assert art.chat_template == chat_template()
    st = art.special_tokens
    assert st["eos_token"] == "<|im_end|>"
    assert st["eos_token_ids"][0] == ours.token_to_id("<|im_end|>")
    assert st["add_bos"] is False
    assert art.generation["temperature"] == 0.6


def test_fixtures_are_deterministic_and_reused(tmp_path, fixture_artifacts):
    first = build_fixture("llama", tmp_path)
    assert first.read_bytes() == fixture_artifacts("llama").read_bytes()  # another dir, same bytes
    mtime = first.stat().st_mtime_ns
    assert build_fixture("llama", tmp_path) == first
    assert first.stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert json.loads((tmp_path / "llama-hf" / "config.json").read_text())["model_type"] == "llama"


def test_cli_builds_named_archs_and_rejects_unknown(tmp_path, capsys):
    assert main([str(tmp_path), "qwen3"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "qwen3.ninfer")
    assert Artifact(tmp_path / "qwen3.ninfer").architecture == "qwen3"
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "gpt2"])
    assert e.value.code == 2
    with pytest.raises(ValueError, match="unknown fixture architecture"):
        build_fixture("gpt2", tmp_path)
