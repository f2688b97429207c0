"""The tiny Qwen2 fixture as a llama.cpp GGUF, written with the `gguf` package.

`build_gguf(root)` writes `root/qwen2.gguf` from the Hugging Face fixture `root/qwen2-hf/`
(`artifacts.fixtures.build_hf_dir("qwen2", root)`): the same tokenizer (gpt2-style BPE with the
`qwen2` pre-tokenizer, as llama.cpp writes Qwen2.5), the same hyper-parameters, and the weights
spread over every GGML block type ninfer reads, the way a mixed Q4_K_M file spreads them:

    Q4_0 Q4_1 Q5_0 Q5_1 Q8_0   quantised from the fixture's weights by gguf.quants
    Q4_K Q5_K Q6_K              the three down projections (K = 256: one super-block per row);
                                the `gguf` package has no K-quant quantiser, so these rows are
                                seeded random blocks with small finite scales
    F32 F16                     norms, biases; one projection in F16

So the GGUF model is not the HF model (K-quant rows differ): its reference is transformers'
own GGUF load of this file (`from_pretrained(dir, gguf_file=...)`). Built once, then reused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

GGUF_NAME = "qwen2.gguf"

# HF layer-tensor suffix -> GGUF name; per layer: the GGML type of each projection
_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_LAYER_TYPES = [
    {"attn_q": "Q5_0", "attn_k": "Q5_1", "attn_v": "Q8_0", "attn_output": "Q4_0",
     "ffn_gate": "Q4_1", "ffn_up": "Q5_0", "ffn_down": "Q4_K"},
    {"attn_q": "Q8_0", "attn_k": "F16", "attn_v": "Q5_1", "attn_output": "Q5_0",
     "ffn_gate": "Q8_0", "ffn_up": "Q4_0", "ffn_down": "Q5_K"},
    {"attn_q": "Q4_1", "attn_k": "Q8_0", "attn_v": "Q4_0", "attn_output": "Q5_1",
     "ffn_gate": "Q5_1", "ffn_up": "Q8_0", "ffn_down": "Q6_K"},
]  # fmt: skip
_GLOBAL_TYPES = {"token_embd.weight": "Q8_0", "output.weight": "Q5_1"}


def _random_k_blocks(type_name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random K-quant blocks [rows, row bytes] whose values stay within about ±0.1."""
    from ninfer.artifact.gguf_blocks import BLOCK_SIZES

    elems, size = BLOCK_SIZES[type_name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, cols // elems, size), dtype=np.uint8)

    def f16(lo: float, hi: float) -> np.ndarray:
        v = rng.uniform(lo, hi, (rows, cols // elems)).astype(np.float16)
        return v.view(np.uint8).reshape(rows, cols // elems, 2)

    if type_name == "Q6_K":  # d * int8 scale * (q - 32): |.| <= 2e-5 * 128 * 32
        raw[..., 208:210] = f16(-2e-5, 2e-5)
    else:  # Q4_K / Q5_K: d * scale * q - dmin * min with 6-bit scale, min and 4/5-bit q
        top = 1e-4 if type_name == "Q4_K" else 5e-5
        raw[..., 0:2] = f16(0.0, top)
        raw[..., 2:4] = f16(0.0, 1e-3)
    return raw.reshape(rows, -1)


def _tokenizer(w: Any, hf: Path, config: dict[str, Any]) -> None:
    """tokenizer.ggml.* as llama.cpp's convert_hf_to_gguf writes a Qwen2 tokenizer."""
    tok = json.loads((hf / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = dict(tok["model"]["vocab"])
    added = {a["content"]: a for a in tok.get("added_tokens", [])}
    for content, a in added.items():
        vocab[content] = a["id"]
    tokens = [""] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    # control (3) for special added tokens, user-defined (4) for the other added ones
    types = [(3 if added[t]["special"] else 4) if t in added else 1 for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    cfg = json.loads((hf / "tokenizer_config.json").read_text(encoding="utf-8"))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(int(config["eos_token_id"]))
    w.add_pad_token_id(int(config["pad_token_id"]))
    w.add_add_bos_token(False)
    w.add_chat_template(cfg["chat_template"])


def build_gguf(root: str | os.PathLike[str]) -> Path:
    """`root/qwen2.gguf` (see the module docstring); written to a temporary name, then renamed."""
    import gguf
    from safetensors.numpy import load_file

    from artifacts.fixtures import build_hf_dir

    root = Path(root)
    out = root / GGUF_NAME
    if out.exists():
        return out
    hf = build_hf_dir("qwen2", root)
    config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
    state = load_file(str(hf / "model.safetensors"))
    tmp = root / f".{GGUF_NAME}.{os.getpid()}.tmp"
    w = gguf.GGUFWriter(str(tmp), "qwen2")
    w.add_name("tiny-qwen2-gguf")
    w.add_context_length(int(config["max_position_embeddings"]))
    w.add_embedding_length(int(config["hidden_size"]))
    w.add_block_count(int(config["num_hidden_layers"]))
    w.add_feed_forward_length(int(config["intermediate_size"]))
    w.add_head_count(int(config["num_attention_heads"]))
    w.add_head_count_kv(int(config["num_key_value_heads"]))
    w.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    theta = (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta"))
    w.add_rope_freq_base(float(theta))
    _tokenizer(w, hf, config)
    T = gguf.GGMLQuantizationType
    tensors: list[tuple[str, np.ndarray, str]] = [
        (
            "token_embd.weight",
            state["model.embed_tokens.weight"],
            _GLOBAL_TYPES["token_embd.weight"],
        ),
        ("output_norm.weight", state["model.norm.weight"], "F32"),
        ("output.weight", state["lm_head.weight"], _GLOBAL_TYPES["output.weight"]),
    ]
    for i, types in enumerate(_LAYER_TYPES):
        for suffix, name in _NAMES.items():
            kind = name.split(".")[0]
            qtype = types.get(kind, "F32") if name.endswith(".weight") else "F32"
            tensors.append((f"blk.{i}.{name}", state[f"model.layers.{i}.{suffix}"], qtype))
    for seed, (name, value, qtype) in enumerate(tensors):
        value = np.ascontiguousarray(value, dtype=np.float32)
        if qtype == "F32":
            w.add_tensor(name, value)
        elif qtype == "F16":
            w.add_tensor(name, value.astype(np.float16))
        elif qtype.endswith("_K"):
            blocks = _random_k_blocks(qtype, value.shape[0], value.shape[1], seed)
            w.add_tensor(name, blocks, raw_dtype=T[qtype])
        else:
            w.add_tensor(name, gguf.quants.quantize(value, T[qtype]), raw_dtype=T[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    try:
        tmp.rename(out)
    except OSError:  # another process finished first
        tmp.unlink(missing_ok=True)
    return out
