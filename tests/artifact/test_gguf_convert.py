"""GGUF conversion on small synthetic files: storage formats, q/k un-permutation, qwen3,
`weights=` quantisation, and every bad-input case (one-line ConvertError, no OUT left behind)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from ninfer.artifact import Artifact
from ninfer.artifact.convert_gguf import convert_gguf, unpermute_rotary
from ninfer.artifact.format import StoredTensor
from ninfer.artifact.quant import dequantize
from ninfer.errors import ConvertError

HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM = 64, 256, 4, 2, 16
VOCAB = 3 + 256 + 8  # the tiny vocabulary of conftest.tiny_vocab


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (HF rotate-half -> interleaved)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def random_blocks(qtype: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random GGML blocks [rows, row bytes] whose f16 scale fields hold small finite values."""
    import gguf

    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, nbytes), dtype=np.uint8)
    f16_at = {T.Q4_K: [0, 2], T.Q6_K: [nbytes - 2]}[qtype]
    for off in f16_at:
        scale = rng.uniform(-0.05, 0.05, (rows, cols // block)).astype(np.float16)
        raw[:, :, off : off + 2] = scale.view(np.uint8).reshape(rows, cols // block, 2)
    return raw.reshape(rows, -1)


def tiny_llama(rng: np.random.Generator) -> dict[str, tuple[np.ndarray, T | None]]:
    """HF-order weights of a 1-layer llama, in every supported GGUF type, q/k permuted as llama.cpp does."""
    vocab = VOCAB
    w = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.1
    return {
        "token_embd.weight": (w(vocab, HIDDEN), T.Q8_0),
        "output_norm.weight": (w(HIDDEN) + 1, None),
        "output.weight": (w(vocab, HIDDEN), T.F16),
        "blk.0.attn_norm.weight": (w(HIDDEN) + 1, None),
        "blk.0.ffn_norm.weight": (w(HIDDEN) + 1, None),
        "blk.0.attn_q.weight": (llama_permute(w(HEADS * HEAD_DIM, HIDDEN), HEADS), T.Q4_0),
        "blk.0.attn_k.weight": (llama_permute(w(KV_HEADS * HEAD_DIM, HIDDEN), KV_HEADS), T.Q4_1),
        "blk.0.attn_v.weight": (w(KV_HEADS * HEAD_DIM, HIDDEN), T.BF16),
        "blk.0.attn_output.weight": (w(HIDDEN, HEADS * HEAD_DIM), T.Q8_0),
        "blk.0.ffn_gate.weight": (w(FFN, HIDDEN), T.Q4_0),
        "blk.0.ffn_up.weight": (w(FFN, HIDDEN), T.Q4_1),
        "blk.0.ffn_down.weight": (random_blocks(T.Q6_K, HIDDEN, FFN, rng), T.Q6_K),
    }


@pytest.fixture
def llama_gguf(tmp_path, write_gguf):
    rng = np.random.default_rng(0)
    tensors = tiny_llama(rng)
    path = write_gguf(tmp_path / "tiny.gguf", tensors, hparams={"feed_forward_length": FFN})
    return path, tensors


def reference(path):
    """GGUF name -> dequantised float32 in GGUF row order, straight from the gguf reader."""
    from gguf import GGUFReader
    from gguf.quants import dequantize as gguf_dequantize

    r = GGUFReader(path)
    return {
        t.name: gguf_dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
        for t in r.tensors
    }


def test_formats_kept_and_qk_unpermuted(llama_gguf, tmp_path):
    path, tensors = llama_gguf
    out = convert_gguf(path, tmp_path / "tiny.ninfer")
    a = Artifact(out)
    formats = {n: a.info(n).format for n in a}
    assert formats["model.embed_tokens.weight"] == "gguf:Q8_0"
    assert formats["lm_head.weight"] == "f16"
    assert formats["model.layers.0.self_attn.q_proj.weight"] == "gguf:Q4_0"
    assert formats["model.layers.0.self_attn.k_proj.weight"] == "gguf:Q4_1"
    assert formats["model.layers.0.mlp.down_proj.weight"] == "gguf:Q6_K"
    assert formats["model.norm.weight"] == "f32"
    assert formats["model.layers.0.self_attn.v_proj.weight"] == "bf16"
    assert a.config["tie_word_embeddings"] is False
    assert (
        a.config["num_attention_heads"],
        a.config["num_key_value_heads"],
        a.config["head_dim"],
    ) == (HEADS, KV_HEADS, HEAD_DIM)
    ref = reference(path)
    q = a.dense("model.layers.0.self_attn.q_proj.weight")
    np.testing.assert_array_equal(q, unpermute_rotary(ref["blk.0.attn_q.weight"], HEADS))
    k = a.dense("model.layers.0.self_attn.k_proj.weight")
    np.testing.assert_array_equal(k, unpermute_rotary(ref["blk.0.attn_k.weight"], KV_HEADS))
    # un-permuting undoes llama.cpp's permutation: close to the HF-order source before quantisation
    src_q = unpermute_rotary(tensors["blk.0.attn_q.weight"][0], HEADS)
    assert np.abs(q - src_q).max() < 0.1 * np.abs(src_q).max()
    np.testing.assert_array_equal(
        a.dense("model.layers.0.mlp.down_proj.weight"), ref["blk.0.ffn_down.weight"]
    )
    np.testing.assert_array_equal(a.dense("model.embed_tokens.weight"), ref["token_embd.weight"])
    np.testing.assert_array_equal(
        a.dense("model.layers.0.self_attn.v_proj.weight"), ref["blk.0.attn_v.weight"]
    )
    assert a.verify() > 0


def test_unpermute_inverts_llama_cpp_permutation():
    rng = np.random.default_rng(3)
    for n_head, head_dim in ((1, 2), (4, 16), (3, 64)):
        hf = rng.standard_normal((n_head * head_dim, 5)).astype(np.float32)
        np.testing.assert_array_equal(unpermute_rotary(llama_permute(hf, n_head), n_head), hf)
        assert n_head * head_dim <= 2 or not np.array_equal(llama_permute(hf, n_head), hf)


@pytest.mark.parametrize("weights", ["bf16", "fp8", "nvfp4"])
def test_weights_quantised_on_the_way(llama_gguf, tmp_path, weights):
    path, _ = llama_gguf
    exact = Artifact(convert_gguf(path, tmp_path / "exact.ninfer"))
    a = Artifact(convert_gguf(path, tmp_path / f"{weights}.ninfer", weights=weights))
    proj = "model.layers.0.self_attn.q_proj.weight"
    assert a.info(proj).format == weights
    assert a.info("model.embed_tokens.weight").format == "bf16"
    assert a.info("model.norm.weight").format in ("f32", "bf16")
    bound = {"bf16": 0.01, "fp8": 0.07, "nvfp4": 0.3}[weights]
    for name in a:
        ref, got = exact.dense(name), a.dense(name)
        assert got.shape == ref.shape
        assert np.abs(got - ref).max() <= bound * np.abs(ref).max() + 1e-6, name


def test_metadata_name_template_and_tokenizer(llama_gguf, tmp_path):
    from tokenizers import Tokenizer

    path, _ = llama_gguf
    a = Artifact(convert_gguf(path, tmp_path / "a.ninfer"))
    assert a.name == "tiny-test" and a.metadata["source"] == "gguf"
    assert "<|im_start|>" in a.chat_template
    tok = Tokenizer.from_str(a.tokenizer_json)
    enc = tok.encode("<|im_start|>hello world<|im_end|>")
    assert enc.ids[0] == 1 and enc.ids[-1] == 2
    assert tok.id_to_token(enc.ids[1]) == "hello"
    assert a.special_tokens["eos_token_ids"][0] == 2
    b = Artifact(convert_gguf(path, tmp_path / "b.ninfer", name="Other", chat_template="{{ x }}"))
    assert b.name == "Other" and b.chat_template == "{{ x }}"


def test_qwen3_equals_transformers(tmp_path, write_gguf):
    """A tiny qwen3 GGUF (q/k norms, head_dim 128 > hidden / heads, no permutation) against
    transformers' GGUF load."""
    rng = np.random.default_rng(1)
    hidden, heads, kv, hd, ffn, vocab = 128, 2, 1, 128, 256, VOCAB
    w = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.1
    tensors = {
        "token_embd.weight": (w(vocab, hidden), T.Q8_0),
        "output_norm.weight": (w(hidden) + 1, None),
        "blk.0.attn_norm.weight": (w(hidden) + 1, None),
        "blk.0.ffn_norm.weight": (w(hidden) + 1, None),
        "blk.0.attn_q.weight": (w(heads * hd, hidden), T.Q4_0),
        "blk.0.attn_k.weight": (w(kv * hd, hidden), T.Q4_1),
        "blk.0.attn_v.weight": (w(kv * hd, hidden), T.F16),
        "blk.0.attn_q_norm.weight": (w(hd) + 1, None),
        "blk.0.attn_k_norm.weight": (w(hd) + 1, None),
        "blk.0.attn_output.weight": (w(hidden, heads * hd), T.Q8_0),
        "blk.0.ffn_gate.weight": (w(ffn, hidden), T.Q8_0),
        "blk.0.ffn_up.weight": (w(ffn, hidden), T.Q4_0),
        "blk.0.ffn_down.weight": (random_blocks(T.Q4_K, hidden, ffn, rng), T.Q4_K),
    }
    hp = {
        "embedding_length": hidden,
        "feed_forward_length": ffn,
        "attention.head_count": heads,
        "attention.head_count_kv": kv,
        "attention.key_length": hd,
        "attention.value_length": hd,
    }
    path = write_gguf(tmp_path / "model.gguf", tensors, arch="qwen3", hparams=hp)
    a = Artifact(convert_gguf(path, tmp_path / "q.ninfer"))
    assert (
        a.architecture == "qwen3"
        and a.config["head_dim"] == hd
        and a.config["tie_word_embeddings"] is True
    )
    assert_equals_transformers(a, tmp_path, "model.gguf")


def assert_equals_transformers(a: Artifact, directory, gguf_file: str) -> None:
    """Every weight of transformers' GGUF load equals the artifact's dequantised tensor."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import torch

    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=gguf_file, dtype=torch.float32
    )
    state = model.state_dict()
    tied = a.config["tie_word_embeddings"]
    for name, ref in state.items():
        ours = "model.embed_tokens.weight" if name == "lm_head.weight" and tied else name
        np.testing.assert_array_equal(a.dense(ours), ref.numpy(), err_msg=name)
    assert {n for n in state if not (tied and n == "lm_head.weight")} == set(a.tensors)


def test_llama_equals_transformers(llama_gguf, tmp_path):
    """Q/K un-permutation with fewer KV heads, untied head, every block type, against transformers."""
    path, _ = llama_gguf
    a = Artifact(convert_gguf(path, tmp_path / "tiny.ninfer"))
    assert_equals_transformers(a, path.parent, path.name)


# -- bad inputs ------------------------------------------------------------------------------


def assert_nothing_left(tmp_path, out):
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(out.name)]


def refusal(src, tmp_path) -> str:
    """Converting `src` fails with a one-line ConvertError (returned) and leaves no output or
    temporary file behind."""
    out = tmp_path / "o.ninfer"
    with pytest.raises(ConvertError) as e:
        convert_gguf(src, out)
    msg = str(e.value)
    assert "\n" not in msg and msg
    assert_nothing_left(tmp_path, out)
    return msg


def test_missing_file(tmp_path):
    assert "no such file" in refusal(tmp_path / "nope.gguf", tmp_path)


def test_not_a_gguf(tmp_path):
    src = tmp_path / "junk.gguf"
    src.write_bytes(b"this is not a gguf file at all" * 10)
    assert "GGUF" in refusal(src, tmp_path)


@pytest.mark.parametrize("qtype", [T.Q2_K, T.IQ4_NL, T.Q3_K])
def test_unsupported_quant_type(tmp_path, write_gguf, qtype):
    import gguf

    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = np.random.default_rng(0).integers(0, 256, (8, 256 // block * nbytes), dtype=np.uint8)
    src = write_gguf(tmp_path / "q.gguf", {"blk.0.ffn_up.weight": (blocks, qtype)})
    msg = refusal(src, tmp_path)
    assert qtype.name in msg and "unsupported" in msg


def test_unsupported_architecture(tmp_path, write_gguf):
    src = write_gguf(
        tmp_path / "f.gguf",
        {"token_embd.weight": (np.ones((8, 8), np.float32), None)},
        arch="falcon",
    )
    assert "falcon" in refusal(src, tmp_path)


def f32_llama(
    hidden: int, heads: int, head_dim: int, ffn: int
) -> dict[str, tuple[np.ndarray, None]]:
    """Every tensor of a 1-layer llama in F32 (kv heads = heads)."""
    rng = np.random.default_rng(0)
    shapes = {
        "token_embd.weight": (VOCAB, hidden),
        "output_norm.weight": (hidden,),
        "blk.0.attn_norm.weight": (hidden,),
        "blk.0.ffn_norm.weight": (hidden,),
        "blk.0.attn_q.weight": (heads * head_dim, hidden),
        "blk.0.attn_k.weight": (heads * head_dim, hidden),
        "blk.0.attn_v.weight": (heads * head_dim, hidden),
        "blk.0.attn_output.weight": (hidden, heads * head_dim),
        "blk.0.ffn_gate.weight": (ffn, hidden),
        "blk.0.ffn_up.weight": (ffn, hidden),
        "blk.0.ffn_down.weight": (hidden, ffn),
    }
    return {n: (rng.standard_normal(shape).astype(np.float32), None) for n, shape in shapes.items()}


def test_failure_while_writing_leaves_no_output(tmp_path, write_gguf):
    # head_dim 15 is odd: q's rows cannot be rotary pairs, found after earlier tensors were written
    hp = {"embedding_length": 60, "attention.head_count": 4, "attention.head_count_kv": 4}
    hp |= {"attention.key_length": 15, "feed_forward_length": 32}
    src = write_gguf(tmp_path / "h.gguf", f32_llama(60, 4, 15, 32), hparams=hp)
    assert "rotary" in refusal(src, tmp_path)


def test_missing_tensor(tmp_path, write_gguf):
    tensors = f32_llama(64, 4, 16, 32)
    del tensors["blk.0.ffn_down.weight"], tensors["output_norm.weight"]
    src = write_gguf(
        tmp_path / "m.gguf",
        tensors,
        hparams={"feed_forward_length": 32, "attention.head_count_kv": 4},
    )
    assert "missing tensor blk.0.ffn_down.weight and 1 more" in refusal(src, tmp_path)


def test_tensor_shape_disagreeing_with_metadata(tmp_path, write_gguf):
    tensors = {"blk.0.ffn_up.weight": (np.ones((100, 64), np.float32), None)}
    src = write_gguf(tmp_path / "s.gguf", tensors)
    assert "mlp.up_proj" in refusal(src, tmp_path)


@pytest.mark.parametrize(
    "hparams, key",
    [
        ({"block_count": "two"}, "llama.block_count"),
        ({"attention.head_count": [4, 4]}, "llama.attention.head_count"),
        ({"rope.freq_base": "1e4"}, "llama.rope.freq_base"),
    ],
)
def test_metadata_of_the_wrong_type_is_named(tmp_path, write_gguf, hparams, key):
    tensors = f32_llama(64, 4, 16, 32)
    hp = {"feed_forward_length": 32, "attention.head_count_kv": 4, **hparams}
    src = write_gguf(tmp_path / "t.gguf", tensors, hparams=hp)
    assert f"the GGUF metadata's {key} is" in refusal(src, tmp_path)


def test_cli_refuses_a_directory_as_output(tmp_path, write_gguf):
    src = write_gguf(tmp_path / "m.gguf", f32_llama(64, 4, 16, 32), hparams={
        "feed_forward_length": 32, "attention.head_count_kv": 4})  # fmt: skip
    (tmp_path / "outdir").mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "ninfer.cli", "convert", str(src), "-o", str(tmp_path / "outdir")],
        check=False,
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip() == (
        f"ninfer convert: error: -o {tmp_path / 'outdir'}: is a directory; name the .ninfer file "
        "to write"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "outdir"]


def test_cli_reports_one_line(tmp_path, write_gguf):
    src = write_gguf(
        tmp_path / "f.gguf",
        {"token_embd.weight": (np.ones((8, 8), np.float32), None)},
        arch="falcon",
    )
    out = tmp_path / "o.ninfer"
    r = subprocess.run(
        [sys.executable, "-m", "ninfer.cli", "convert", str(src), "-o", str(out)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "falcon" in lines[0] and "Traceback" not in r.stderr
    assert_nothing_left(tmp_path, out)


def test_dequantizer_matches_an_independent_implementation():
    """quant.dequantize of gguf:TYPE (gguf-py) equals transformers' torch dequantiser bit for bit."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.integrations.gguf.dequant import dequantize as torch_dequantize

    rng = np.random.default_rng(0)
    for qtype in (T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q6_K):
        if qtype in (T.Q4_K, T.Q6_K):
            data = random_blocks(qtype, 8, 512, rng)
        else:
            import gguf

            data = gguf.quants.quantize(rng.standard_normal((8, 512)).astype(np.float32), qtype)
        ours = dequantize(StoredTensor(f"gguf:{qtype.name}", (8, 512), {"data": data}))
        theirs = torch_dequantize(torch.from_numpy(data), qtype.value).numpy().reshape(8, 512)
        np.testing.assert_array_equal(ours, theirs, err_msg=qtype.name)
