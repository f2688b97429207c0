"""Qwen3-MoE GGUF (llama.cpp arch `qwen3moe`, experts fused as `ffn_{gate,up,down}_exps`)
converted to the per-expert layout of convert_hf, from GGUF files written out of the tiny
qwen3_moe fixture: the same tensors as convert_hf's artifact, quantised experts split without
dequantising, logits equal to transformers' GGUF load, bad expert metadata refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from ninfer.artifact import Artifact
from ninfer.artifact.convert_gguf import convert_gguf
from ninfer.errors import ConvertError

LAYERS, EXPERTS, TOP_K, MOE_INTER = 2, 8, 2, 32  # the qwen3_moe fixture of artifacts/fixtures.py
_LAYER = {  # GGUF layer tensor -> fixture (HF) name
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate",
}
_PROJ = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
HPARAMS = {
    "block_count": LAYERS,
    "embedding_length": 64,
    "feed_forward_length": 128,
    "attention.head_count": 4,
    "attention.head_count_kv": 2,
    "attention.key_length": 16,
    "attention.value_length": 16,
    "vocab_size": 512,
    "expert_count": EXPERTS,
    "expert_used_count": TOP_K,
    "expert_feed_forward_length": MOE_INTER,
}
# (layer, gate|up|down) -> GGUF type of the fused experts; None = F32
MIXED: dict[tuple[int, str], T | None] = {
    (0, "gate"): T.Q8_0,
    (0, "up"): T.Q4_0,
    (0, "down"): T.BF16,
    (1, "gate"): T.F16,
    (1, "up"): T.Q4_1,
    (1, "down"): T.Q8_0,
}
# largest |dequantised - source| allowed, relative to the source's largest |value|
TOLERANCE = {None: 0.0, T.F16: 1e-3, T.BF16: 1e-2, T.Q8_0: 1e-2, T.Q4_0: 0.15, T.Q4_1: 0.15}


def fixture_weights(hf_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(hf_dir / "model.safetensors"))


def qwen3moe_tensors(
    hf: dict[str, np.ndarray], experts: dict[tuple[int, str], T | None]
) -> dict[str, tuple[np.ndarray, T | None]]:
    """The fixture's weights under llama.cpp's qwen3moe names, experts stacked [E, N, K]."""
    out: dict[str, tuple[np.ndarray, T | None]] = {
        "token_embd.weight": (hf["model.embed_tokens.weight"], T.Q8_0 if experts else None),
        "output_norm.weight": (hf["model.norm.weight"], None),
        "output.weight": (hf["lm_head.weight"], T.F16 if experts else None),
    }
    for i in range(LAYERS):
        for g, h in _LAYER.items():
            out[f"blk.{i}.{g}.weight"] = (hf[f"model.layers.{i}.{h}.weight"], None)
        for w, proj in _PROJ.items():
            # [E, I, H] for gate/up, [E, H, I] for down
            stacked = np.stack(
                [hf[f"model.layers.{i}.mlp.experts.{e}.{proj}.weight"] for e in range(EXPERTS)]
            )
            out[f"blk.{i}.ffn_{w}_exps.weight"] = (stacked, experts.get((i, w)))
    return out


def gguf_experts(path: Path) -> dict[str, np.ndarray]:
    """Fused GGUF expert name -> dequantised [E, N, K] straight from the gguf reader."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    return {
        t.name: dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
        for t in GGUFReader(path).tensors
        if "_exps" in t.name
    }


def test_f32_gguf_gives_the_convert_hf_artifact(
    tmp_path, write_gguf, fixture_hf_dir, fixture_artifacts
):
    """An all-F32 qwen3moe GGUF converts to exactly the tensors (per expert) and MoE config of
    the artifact convert_hf makes from the same model."""
    hf = fixture_weights(fixture_hf_dir("qwen3_moe"))
    path = write_gguf(
        tmp_path / "f32.gguf", qwen3moe_tensors(hf, {}), arch="qwen3moe", hparams=HPARAMS
    )
    a = Artifact(convert_gguf(path, tmp_path / "f32.ninfer"))
    want = Artifact(fixture_artifacts("qwen3_moe"))
    assert a.architecture == want.architecture == "qwen3_moe"
    assert set(a) == set(want)
    for name in want:
        assert a.info(name).format == "f32" and a.info(name).shape == want.info(name).shape, name
        np.testing.assert_array_equal(a.dense(name), want.dense(name), err_msg=name)
    for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob"):
        assert a.config[key] == want.config[key], key
    for key in ("decoder_sparse_step", "mlp_only_layers", "num_hidden_layers", "head_dim"):
        assert a.config[key] == want.config[key], key
    assert a.config["tie_word_embeddings"] is False
    assert a.verify() > 0


@pytest.fixture
def mixed_gguf(tmp_path, write_gguf, fixture_hf_dir) -> tuple[Path, dict[str, np.ndarray]]:
    hf = fixture_weights(fixture_hf_dir("qwen3_moe"))
    tensors = qwen3moe_tensors(hf, MIXED)
    return write_gguf(tmp_path / "model.gguf", tensors, arch="qwen3moe", hparams=HPARAMS), hf


def test_quantised_experts_split_per_expert(mixed_gguf, tmp_path):
    """Q8_0/Q4_0/Q4_1 experts stay GGML blocks (whole rows per expert), F16/BF16 stay as they
    are; each expert dequantises to its slice of the fused GGUF tensor and to the fixture's
    weight within the type's precision."""
    path, hf = mixed_gguf
    a = Artifact(convert_gguf(path, tmp_path / "mixed.ninfer"))
    ref = gguf_experts(path)
    for (i, w), qtype in MIXED.items():
        proj = _PROJ[w]
        fused = ref[f"blk.{i}.ffn_{w}_exps.weight"]  # [E, N, K]
        assert fused.shape[0] == EXPERTS
        fmt = {T.F16: "f16", T.BF16: "bf16"}.get(qtype, f"gguf:{qtype.name}")
        for e in range(EXPERTS):
            name = f"model.layers.{i}.mlp.experts.{e}.{proj}.weight"
            info = a.info(name)
            assert (info.format, info.shape) == (fmt, fused.shape[1:]), name
            got = a.dense(name)
            np.testing.assert_array_equal(got, fused[e], err_msg=name)
            src = hf[name]
            assert np.abs(got - src).max() <= TOLERANCE[qtype] * np.abs(src).max(), name
    fused = [f"experts.{proj}.weight" for proj in _PROJ.values()]
    assert not [n for n in a if n.endswith(tuple(fused))]  # no fused tensor left
    assert a.info("model.layers.0.mlp.gate.weight").shape == (EXPERTS, 64)
    assert a.verify() > 0


def test_mixed_gguf_logits_equal_transformers(mixed_gguf, tmp_path):
    """The CPU executor on the converted artifact computes transformers' function of the same
    GGUF (transformers ignores qwen3moe.expert_feed_forward_length, so it is passed in)."""
    transformers = pytest.importorskip("transformers")
    import torch

    from ninfer import LLM

    path, _ = mixed_gguf
    out = convert_gguf(path, tmp_path / "mixed.ninfer")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, moe_intermediate_size=MOE_INTER
    )
    state = model.state_dict()
    a = Artifact(out)
    for e in (0, EXPERTS - 1):  # transformers fuses gate|up per expert: [E, 2I, H]
        p = f"model.layers.1.mlp.experts.{e}"
        ours = np.concatenate([a.dense(f"{p}.gate_proj.weight"), a.dense(f"{p}.up_proj.weight")])
        theirs = state["model.layers.1.mlp.experts.gate_up_proj"][e].numpy()
        np.testing.assert_array_equal(ours, theirs)
    ids = [5, 17, 99, 200, 3, 42, 250, 7, 11, 128]
    llm = LLM(str(out), device="cpu", dtype="float32", max_concurrency=1, kv_capacity=64)
    got = llm.logits(ids)
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0]
    assert got.shape == want.shape == (len(ids), 512)
    assert (got - want).abs().max().item() < 1e-3
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_weights_quantise_each_expert(mixed_gguf, tmp_path):
    path, _ = mixed_gguf
    exact = Artifact(convert_gguf(path, tmp_path / "exact.ninfer"))
    a = Artifact(convert_gguf(path, tmp_path / "fp8.ninfer", weights="fp8"))
    assert set(a) == set(exact)
    assert a.info("model.layers.0.mlp.experts.5.down_proj.weight").format == "fp8"
    assert a.info("model.layers.1.mlp.experts.0.up_proj.weight").format == "fp8"
    assert a.info("model.layers.0.mlp.gate.weight").format == "bf16"  # the router stays precise
    for name in a:
        ref, got = exact.dense(name), a.dense(name)
        assert np.abs(got - ref).max() <= 0.07 * np.abs(ref).max() + 1e-6, name


# -- bad inputs ------------------------------------------------------------------------------


def _tiny_moe(experts: int) -> dict[str, tuple[np.ndarray, None]]:
    """One qwen3moe layer in F32 with `experts` experts, shapes from HPARAMS otherwise."""
    rng = np.random.default_rng(0)
    hidden, q, kv = 64, 4 * 16, 2 * 16
    shapes = {
        "token_embd.weight": (512, hidden),
        "output_norm.weight": (hidden,),
        "blk.0.attn_norm.weight": (hidden,),
        "blk.0.ffn_norm.weight": (hidden,),
        "blk.0.attn_q.weight": (q, hidden),
        "blk.0.attn_k.weight": (kv, hidden),
        "blk.0.attn_v.weight": (kv, hidden),
        "blk.0.attn_output.weight": (hidden, q),
        "blk.0.attn_q_norm.weight": (16,),
        "blk.0.attn_k_norm.weight": (16,),
        "blk.0.ffn_gate_inp.weight": (experts, hidden),
        "blk.0.ffn_gate_exps.weight": (experts, MOE_INTER, hidden),
        "blk.0.ffn_up_exps.weight": (experts, MOE_INTER, hidden),
        "blk.0.ffn_down_exps.weight": (experts, hidden, MOE_INTER),
    }
    return {n: (rng.standard_normal(s).astype(np.float32), None) for n, s in shapes.items()}


def _expect_error(tmp_path, write_gguf, tensors, hparams, arch="qwen3moe") -> str:
    src = write_gguf(tmp_path / "bad.gguf", tensors, arch=arch, hparams=hparams)
    out = tmp_path / "o.ninfer"
    with pytest.raises(ConvertError) as e:
        convert_gguf(src, out)
    assert not out.exists() and not list(tmp_path.glob("o.ninfer*"))
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


def test_tiny_moe_converts(tmp_path, write_gguf):
    """The synthetic layer the bad-input cases break is itself valid."""
    src = write_gguf(
        tmp_path / "ok.gguf",
        _tiny_moe(4),
        arch="qwen3moe",
        hparams=HPARAMS | {"block_count": 1, "expert_count": 4},
    )
    a = Artifact(convert_gguf(src, tmp_path / "ok.ninfer"))
    assert a.config["num_experts"] == 4 and a.config["moe_intermediate_size"] == MOE_INTER
    assert {n for n in a if ".experts." in n} == {
        f"model.layers.0.mlp.experts.{e}.{p}.weight" for e in range(4) for p in _PROJ.values()
    }


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"expert_feed_forward_length": None}, "lacks qwen3moe.expert_feed_forward_length"),
        ({"expert_count": None}, "lacks qwen3moe.expert_count"),
        ({"expert_used_count": 5}, "expert_used_count=5"),
        ({"expert_count": 8}, "has shape [4, 64] but the GGUF metadata implies [8, 64]"),
        ({"expert_feed_forward_length": 16}, "implies [4, 16, 64]"),
    ],
)
def test_bad_expert_metadata(tmp_path, write_gguf, change, needle):
    hp = HPARAMS | {"block_count": 1, "expert_count": 4}
    hp = {k: v for k, v in (hp | change).items() if v is not None}
    assert needle in _expect_error(tmp_path, write_gguf, _tiny_moe(4), hp)


def test_missing_expert_tensor(tmp_path, write_gguf):
    tensors = _tiny_moe(4)
    del tensors["blk.0.ffn_down_exps.weight"]
    hp = HPARAMS | {"block_count": 1, "expert_count": 4}
    assert "missing tensor blk.0.ffn_down_exps.weight" in _expect_error(
        tmp_path, write_gguf, tensors, hp
    )


def test_experts_in_a_dense_architecture(tmp_path, write_gguf):
    tensors = {"blk.0.ffn_gate_exps.weight": (np.ones((4, 32, 64), np.float32), None)}
    msg = _expect_error(tmp_path, write_gguf, tensors, {"block_count": 1}, arch="qwen3")
    assert "no place in a qwen3 model" in msg
