"""Hugging Face directory -> .ninfer: values, names, metadata, and bad sources."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from ninfer.artifact import Artifact
from ninfer.artifact.convert_hf import convert_hf


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        eos_token_id=3,
    )
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    d = tmp_path_factory.mktemp("hf") / "tiny-qwen3"
    model.save_pretrained(d)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(
        ["hello world, ninfer"] * 20,
        trainers.BpeTrainer(
            vocab_size=90, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        ),
    )
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "chat_template": "{{ messages }}"})
    )
    (d / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "eos_token_id": [3, 2]})
    )
    return d, {k: v.float().numpy() for k, v in model.state_dict().items()}


def test_values_and_metadata(hf_dir, tmp_path):
    d, sd = hf_dir
    a = Artifact(convert_hf(d, tmp_path / "m.ninfer"))
    assert a.architecture == "qwen3" and a.name == "tiny-qwen3"
    assert a.chat_template == "{{ messages }}" and a.generation["temperature"] == 0.6
    assert a.special_tokens["eos_token_ids"] == [3, 2, 2] or set(
        a.special_tokens["eos_token_ids"]
    ) == {2, 3}
    for name, ref in sd.items():
        if name == "lm_head.weight" and a.config.get("tie_word_embeddings"):
            continue
        assert a.info(name).format == "bf16"
        np.testing.assert_array_equal(a.dense(name), ref)


@pytest.mark.parametrize("fmt,tol", [("bf16", 0.0), ("fp8", 0.07), ("nvfp4", 0.2)])
def test_weights_option_quantises_projections_only(hf_dir, tmp_path, fmt, tol):
    d, sd = hf_dir
    a = Artifact(convert_hf(d, tmp_path / "m.ninfer", weights=fmt, name="custom"))
    assert a.name == "custom"
    assert a.info("model.layers.0.self_attn.q_proj.weight").format == fmt
    assert a.info("model.embed_tokens.weight").format == "bf16"
    assert a.info("model.norm.weight").format in ("f32", "bf16")
    w = sd["model.layers.1.mlp.down_proj.weight"]
    err = np.abs(a.dense("model.layers.1.mlp.down_proj.weight") - w).max() / np.abs(w).max()
    assert err <= tol


def test_fused_experts_are_split(tmp_path):
    """A Hub checkpoint's fused experts (model.language_model.*, [E, 2I, H] and [E, H, I])."""
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    d = tmp_path / "moe"
    cfg = Qwen3_5MoeTextConfig(
        vocab_size=64,
        hidden_size=16,
        moe_intermediate_size=8,
        shared_expert_intermediate_size=8,
        num_experts=3,
        num_experts_per_tok=2,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        layer_types=["full_attention"],
    )
    Qwen3_5MoeForCausalLM(cfg).save_pretrained(d)
    per_expert = load_file(d / "model.safetensors")
    tensors = {
        k.replace("model.", "model.language_model.", 1): v
        for k, v in per_expert.items()
        if ".experts." not in k
    }
    gate_up = torch.randn(3, 16, 16)
    down = torch.randn(3, 16, 8)
    tensors["model.language_model.layers.0.mlp.experts.gate_up_proj"] = gate_up
    tensors["model.language_model.layers.0.mlp.experts.down_proj"] = down
    save_file(tensors, str(d / "model.safetensors"))
    (d / "tokenizer.json").write_text(_tiny_tokenizer_json())
    a = Artifact(convert_hf(d, tmp_path / "m.ninfer"))
    assert a.architecture == "qwen3_5_moe"
    np.testing.assert_array_equal(
        a.dense("model.layers.0.mlp.experts.2.gate_proj.weight"), gate_up[2, :8].numpy()
    )
    np.testing.assert_array_equal(
        a.dense("model.layers.0.mlp.experts.2.up_proj.weight"), gate_up[2, 8:].numpy()
    )
    np.testing.assert_array_equal(
        a.dense("model.layers.0.mlp.experts.1.down_proj.weight"), down[1].numpy()
    )


def _tiny_tokenizer_json() -> str:
    from tokenizers import Tokenizer, models

    return Tokenizer(models.BPE()).to_str()


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "ninfer.cli", "convert", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
    )


def _assert_one_line_error(r, needle):
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle in lines[0], lines[0]


def test_bad_sources(hf_dir, tmp_path):
    d, _ = hf_dir
    out = tmp_path / "out.ninfer"
    _assert_one_line_error(_cli(tmp_path / "nope", "-o", out), "no such file")
    txt = tmp_path / "weights.bin"
    txt.write_bytes(b"x")
    _assert_one_line_error(_cli(txt, "-o", out), "not a .gguf file")
    empty = tmp_path / "empty"
    empty.mkdir()
    _assert_one_line_error(_cli(empty, "-o", out), "config.json: missing")
    # unsupported architecture
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    _assert_one_line_error(_cli(bad, "-o", out), "unsupported architecture 'gpt2'")
    # a shard named by the index is missing
    shard = tmp_path / "shard"
    shard.mkdir()
    (shard / "config.json").write_text((d / "config.json").read_text())
    (shard / "tokenizer.json").write_text((d / "tokenizer.json").read_text())
    (shard / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}})
    )
    _assert_one_line_error(
        _cli(shard, "-o", out), "shard named by model.safetensors.index.json is missing"
    )
    # no tokenizer
    notok = tmp_path / "notok"
    notok.mkdir()
    for f in ("config.json", "model.safetensors"):
        (notok / f).write_bytes((d / f).read_bytes())
    _assert_one_line_error(_cli(notok, "-o", out), "tokenizer.json: missing")
    # a truncated weights file
    cut = tmp_path / "cut"
    cut.mkdir()
    for f in ("config.json", "tokenizer.json", "model.safetensors"):
        (cut / f).write_bytes((d / f).read_bytes())
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) // 2])
    _assert_one_line_error(_cli(cut, "-o", out), "not a readable safetensors file")
    # a --chat-template that serve could not parse
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }\n")
    _assert_one_line_error(
        _cli(d, "-o", out, "--chat-template", bad), "chat template does not parse"
    )
    _assert_one_line_error(_cli(d, "-o", out, "--name", " "), "--name must not be empty")
    assert not out.exists() and not list(tmp_path.glob("out.ninfer*"))


def test_interrupted_conversion_leaves_no_output(hf_dir, tmp_path, monkeypatch):
    d, _ = hf_dir
    import ninfer.artifact.convert_hf as mod

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(mod, "_store", boom)
    with pytest.raises(OSError):
        convert_hf(d, tmp_path / "m.ninfer")
    assert list(tmp_path.iterdir()) == []


def test_cli_convert_then_inspect(hf_dir, tmp_path):
    d, _ = hf_dir
    out = tmp_path / "m.ninfer"
    r = _cli(d, "-o", out, "--weights", "fp8", "--name", "demo")
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "ninfer.cli", "inspect", str(out), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    info = json.loads(r.stdout)
    assert info["name"] == "demo" and info["architecture"] == "qwen3"
    from tokenizers import Tokenizer

    assert info["tokenizer_size"] == Tokenizer.from_file(str(d / "tokenizer.json")).get_vocab_size()
    assert info["chat_template"] is True
    assert info["formats"]["fp8"]["tensors"] == 14 and info["tensor_count"] > 14
    assert info["config"]["num_hidden_layers"] == 2
    r = subprocess.run(
        [sys.executable, "-m", "ninfer.cli", "inspect", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (
        "architecture    qwen3" in r.stdout and "fp8" in r.stdout and "tokenizer size" in r.stdout
    )
