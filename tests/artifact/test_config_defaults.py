"""model_spec reads a config.json as transformers' config classes read it: a key the file leaves
out takes that class's default (which differs between architectures), and what no kernel here
implements (a sliding window, a non-SiLU MLP) is refused by name, at convert time as well."""

from __future__ import annotations

import json

import pytest
import torch

from ninfer.artifact.convert_hf import convert_hf
from ninfer.artifact.model_spec import model_spec
from ninfer.errors import ArtifactError, ConvertError
from ninfer.ir.models import check_tensors

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# the smallest config of each architecture that names every size the builders need
BASE = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 96}
EXTRA = {
    "llama": {"intermediate_size": 128},
    "qwen3": {"intermediate_size": 128},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "qwen3_5_text": {
        "intermediate_size": 128, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    },
    "qwen3_5_moe_text": {
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    },
}  # fmt: skip
ARCH = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe"}


def _reference(model_type: str, cfg: dict):
    """transformers' config object for the same config.json."""
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **cfg)


@pytest.mark.parametrize("model_type", list(EXTRA))
def test_left_out_keys_take_the_transformers_defaults(model_type):
    cfg = {**BASE, **EXTRA[model_type]}
    ref = _reference(model_type, cfg)
    spec = model_spec(ARCH.get(model_type, model_type), cfg)
    assert spec.kv_heads == ref.num_key_value_heads
    head_dim = getattr(ref, "head_dim", None) or ref.hidden_size // ref.num_attention_heads
    assert spec.head_dim == head_dim
    params = getattr(ref, "rope_parameters", None) or {}
    partial = params.get("partial_rotary_factor", getattr(ref, "partial_rotary_factor", 1.0))
    assert spec.rotary_dim == int(head_dim * partial) // 2 * 2
    assert spec.max_position == ref.max_position_embeddings
    if model_type == "qwen3_moe":
        assert spec.norm_topk == ref.norm_topk_prob is False


@pytest.mark.parametrize(
    ("model_type", "extra", "first_sliding"),
    [
        ("qwen3", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}, 1),
        ("qwen3_moe", {"use_sliding_window": True, "sliding_window": 8}, 0),
    ],
)
def test_a_sliding_window_is_refused_by_name(model_type, extra, first_sliding):
    cfg = {**BASE, **EXTRA[model_type], **extra}
    types = getattr(_reference(model_type, cfg), "layer_types", None)
    if types is not None:  # transformers' Qwen3 lists them; Qwen3-MoE windows every layer
        assert types.index("sliding_attention") == first_sliding
    with pytest.raises(ArtifactError, match=f"layer {first_sliding} is 'sliding_attention'"):
        model_spec(model_type, cfg)
    # asked for but not in effect: every layer below max_window_layers, or no window
    off = (
        {**cfg, "max_window_layers": 4}
        if model_type == "qwen3"
        else {**cfg, "sliding_window": None}
    )
    assert set(model_spec(model_type, off).layer_types) == {"full_attention"}
    assert (
        model_spec("llama", {**BASE, **EXTRA["llama"], **extra}).layer_types[0] == "full_attention"
    )


def test_a_non_silu_mlp_is_refused_by_name():
    cfg = {**BASE, **EXTRA["llama"], "hidden_act": "gelu_pytorch_tanh"}
    with pytest.raises(ArtifactError, match="hidden_act 'gelu_pytorch_tanh' is not supported"):
        model_spec("llama", cfg)
    assert model_spec("llama", {**cfg, "hidden_act": "silu"}).inter == 128


def test_convert_refuses_what_loading_would(tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**BASE, intermediate_size=128, hidden_act="gelu")
    src = tmp_path / "gelu-llama"
    LlamaForCausalLM(cfg).save_pretrained(src)
    (src / "tokenizer.json").write_text(Tokenizer(models.BPE()).to_str())
    with pytest.raises(ConvertError, match="hidden_act 'gelu' is not supported"):
        convert_hf(src, tmp_path / "out.ninfer", check_model=check_tensors)
    assert not list(tmp_path.glob("out.ninfer*"))


def test_weights_that_do_not_fit_the_config_are_refused_at_conversion(tmp_path):
    """The check loading makes (the graph builder's, which `ninfer convert` passes to the
    converter) runs before the artifact is kept."""
    from tokenizers import Tokenizer, models
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    src = tmp_path / "qwen3"
    Qwen3ForCausalLM(Qwen3Config(**BASE, intermediate_size=128, head_dim=16)).save_pretrained(src)
    (src / "tokenizer.json").write_text(Tokenizer(models.BPE()).to_str())
    config = json.loads((src / "config.json").read_text())
    config["head_dim"] = 8  # the stored q/k norms and projections are for 16
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConvertError, match="the weights do not fit the config"):
        convert_hf(src, tmp_path / "out.ninfer", check_model=check_tensors)
    assert not list(tmp_path.glob("out.ninfer*"))
