"""What `convert` refuses before it writes an artifact, and a tied checkpoint that stores a
distinct head: each check against a real checkpoint saved by transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ninfer.artifact.convert_hf import convert_hf
from ninfer.cli import main
from ninfer.errors import ConvertError
from ninfer.ir.models import check_tensors

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

CFG = {
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 96,
}  # fmt: skip


def _llama(path: Path, **overrides) -> Path:
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**{**CFG, **overrides})).save_pretrained(path)
    (path / "tokenizer.json").write_text(Tokenizer(models.BPE()).to_str())
    return path


def _edit_config(src: Path, **changes) -> None:
    config = json.loads((src / "config.json").read_text())
    config.update(changes)
    (src / "config.json").write_text(json.dumps(config))


def _refused(src: Path, out_dir: Path, match: str) -> None:
    with pytest.raises(ConvertError, match=match):
        convert_hf(src, out_dir / "out.ninfer", check_model=check_tensors)
    assert not list(out_dir.glob("out.ninfer*"))


def test_a_pre_quantised_checkpoint_is_refused(tmp_path):
    src = _llama(tmp_path / "m")
    _edit_config(src, quantization_config={"quant_method": "fp8", "weight_block_size": [16, 16]})
    _refused(src, tmp_path, "pre-quantised checkpoint .*quant_method 'fp8'")


def test_fp8_tensors_without_a_quantization_config_are_refused(tmp_path):
    src = _llama(tmp_path / "m")
    tensors = load_file(src / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.weight"
    tensors[name] = tensors[name].to(torch.float8_e4m3fn)
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    _refused(src, tmp_path, f"tensor '{name}' is stored as float8_e4m3fn")


def test_a_tensor_stored_twice_is_a_one_line_error(tmp_path):
    src = _llama(tmp_path / "m")
    tensors = load_file(src / "model.safetensors")
    extra = {"model.embed_tokens.weight": tensors["model.embed_tokens.weight"].clone()}
    save_file(extra, src / "model-extra.safetensors", metadata={"format": "pt"})
    _refused(src, tmp_path, "tensor 'model.embed_tokens.weight' appears more than once")


def test_a_non_positive_rope_theta_is_refused(tmp_path):
    src = _llama(tmp_path / "m")
    config = json.loads((src / "config.json").read_text())
    config.get("rope_parameters", {}).pop("rope_theta", None)
    config["rope_theta"] = 0.0
    (src / "config.json").write_text(json.dumps(config))
    _refused(src, tmp_path, "rope_theta must be a positive number, got 0.0")


def test_a_tied_checkpoint_storing_a_distinct_head_uses_that_head(tmp_path):
    """transformers does not tie an embedding and a stored lm_head that differ; nor do we."""
    from transformers import LlamaForCausalLM

    from ninfer import LLM

    src = _llama(tmp_path / "m", tie_word_embeddings=False)
    _edit_config(src, tie_word_embeddings=True)
    ref = LlamaForCausalLM.from_pretrained(src, dtype=torch.float32)
    assert not torch.equal(ref.lm_head.weight, ref.model.embed_tokens.weight)
    out = convert_hf(src, tmp_path / "out.ninfer")
    ids = [5, 17, 3, 42, 8]
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    got = torch.as_tensor(LLM(str(out), device="cpu", dtype="float32").logits(ids))
    assert torch.allclose(got, want, atol=1e-3), (got - want).abs().max()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"intermediate_size": 96}, "gate_proj.weight has 128 rows but the config's intermediate_size is 96"),
        ({"vocab_size": 100}, "embed_tokens.weight has 96 rows but the config's vocab_size is 100"),
    ],
)  # fmt: skip
def test_sizes_the_config_names_must_be_the_weights(tmp_path, change, message):
    """transformers refuses to load these; the graph would run on the weights' sizes."""
    src = _llama(tmp_path / "m")
    _edit_config(src, **change)
    _refused(src, tmp_path, message)


def test_ninfer_convert_checks_the_weights_build_the_model(tmp_path, capsys):
    """The command supplies the IR's check (the artifact layer does not import the builders)."""
    src = _llama(tmp_path / "m")
    _edit_config(src, intermediate_size=96)
    out = tmp_path / "cli.ninfer"
    assert main(["convert", str(src), "-o", str(out)]) == 2
    assert "the config's intermediate_size is 96" in capsys.readouterr().err
    assert not list(tmp_path.glob("cli.ninfer*"))


def test_projections_nvfp4_cannot_hold_are_reported(tmp_path, caplog):
    src = _llama(tmp_path / "m", hidden_size=72, num_attention_heads=4, num_key_value_heads=2)
    out = convert_hf(src, tmp_path / "out.ninfer", weights="nvfp4")
    from ninfer.artifact import Artifact

    formats = {n: t.format for n, t in Artifact(out).tensors.items() if n.endswith("proj.weight")}
    assert formats["model.layers.0.mlp.down_proj.weight"] == "nvfp4"  # K = 128
    assert formats["model.layers.0.mlp.up_proj.weight"] == "bf16"  # K = 72
    assert "12 projection(s) stay bf16: --weights nvfp4 needs" in caplog.text


def test_generation_config_eos_replaces_config_eos(tmp_path):
    """transformers stops on generation_config's ids (config.json's only without them); the
    tokenizer's eos_token joins them, as in vLLM."""
    from ninfer.artifact import Artifact

    src = _llama(tmp_path / "m", eos_token_id=50)
    (src / "generation_config.json").write_text(json.dumps({"eos_token_id": [40, 41]}))
    eos = Artifact(convert_hf(src, tmp_path / "out.ninfer")).special_tokens["eos_token_ids"]
    assert eos == [40, 41]
    (src / "generation_config.json").write_text(json.dumps({"temperature": 0.7}))
    eos = Artifact(convert_hf(src, tmp_path / "out2.ninfer")).special_tokens["eos_token_ids"]
    assert eos == [50]
