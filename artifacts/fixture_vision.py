"""Tiny random Qwen3.5 vision-language models: `qwen3_5_vl` (dense) and `qwen3_5_moe_vl`.

`build_vision_fixture(arch, root)` makes a seeded random `Qwen3_5(Moe)ForConditionalGeneration`
with transformers, saves it as a Hugging Face directory `root/<arch>-hf/` and converts it to
`root/<arch>.ninfer` (its vision component included). Same arch, same bytes; both steps reuse
what is already there, like artifacts/fixtures.py.

    text model    the qwen3_5 / qwen3_5_moe fixture's shape (hidden 64, 4 layers: linear, full,
                  linear, full attention), vocab 516; rotary on half of each 16-wide head
                  (4 frequencies) with mrope_section [2, 1, 1], so the temporal, height and
                  width axes each turn at least one frequency
    vision tower  2 blocks, hidden 32, 2 heads (head 16), MLP 64, patch 8 x 8 x 2 frames,
                  spatial merge 2, a 4 x 4 learned position grid (interpolated to every size)
    tokenizer     the tiny tokenizer plus <|vision_start|> 512, <|vision_end|> 513,
                  <|image_pad|> 514, <|video_pad|> 515 (special, as in Qwen's)
    processor     preprocessor_config.json / video_preprocessor_config.json with patch 8 and
                  small pixel budgets (an image of at most 64 x 64 pixels, 2 fps, <= 4 frames)

LayerNorm and RMSNorm weights and every bias are moved off their init, so a runtime that drops
one computes another function. Command line: `python -m artifacts.fixture_vision OUTDIR [ARCH ...]`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from artifacts.fixtures import (
    _COMMON,
    _DELTANET,
    chat_template,
    convert_once,
    fixture_cli,
    generation_config,
    hf_dir_once,
    save_fused_experts,
    seeded_model,
)
from artifacts.tokenizer import EOS_TOKEN, PAD_TOKEN, build_tokenizer, token_id, tokenizer_config

VISION_ARCHS = ("qwen3_5_vl", "qwen3_5_moe_vl")
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
VOCAB = 516

VISION_CONFIG: dict[str, Any] = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "patch_size": 8,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": _COMMON["hidden_size"],
    "num_position_embeddings": 16,
    "initializer_range": 0.08,
}
PREPROCESSOR: dict[str, Any] = {
    "patch_size": 8,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "size": {"shortest_edge": 16 * 16, "longest_edge": 64 * 64},
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
VIDEO_PREPROCESSOR: dict[str, Any] = {
    **PREPROCESSOR,
    "size": {"shortest_edge": 16 * 16, "longest_edge": 4 * 48 * 48},
    "fps": 2.0,
    "min_frames": 2,
    "max_frames": 4,
}


def vision_tokenizer():  # -> tokenizers.Tokenizer
    """The tiny tokenizer with Qwen's four vision tokens appended (ids 512..515)."""
    from tokenizers import AddedToken

    tok = build_tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    if tok.get_vocab_size() != VOCAB:
        raise AssertionError(f"vision tokenizer has {tok.get_vocab_size()} ids, expected {VOCAB}")
    return tok


def _model(arch: str):  # -> transformers PreTrainedModel
    import transformers as tf

    tok = vision_tokenizer()
    ids = {t: token_id(tok, t) for t in VISION_TOKENS}
    text: dict[str, Any] = {
        **_COMMON,
        **_DELTANET,
        "vocab_size": VOCAB,
        "num_hidden_layers": 4,
        "eos_token_id": token_id(tok, EOS_TOKEN),
        "pad_token_id": token_id(tok, PAD_TOKEN),
        "bos_token_id": None,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
    }
    top = {
        "vision_config": VISION_CONFIG,
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": False,
    }
    if arch == "qwen3_5_vl":
        cfg = tf.Qwen3_5Config(text_config={**text, "intermediate_size": 128}, **top)
        cls = tf.Qwen3_5ForConditionalGeneration
    elif arch == "qwen3_5_moe_vl":
        moe = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
               "shared_expert_intermediate_size": 32}  # fmt: skip
        cfg = tf.Qwen3_5MoeConfig(text_config={**text, **moe}, **top)
        cls = tf.Qwen3_5MoeForConditionalGeneration
    else:
        raise ValueError(f"unknown vision fixture {arch!r} (choose from {', '.join(VISION_ARCHS)})")
    return seeded_model(arch, cls, cfg, lambda name: "norm" in name and name.endswith(".weight"))


def build_vision_hf_dir(arch: str, root: str | os.PathLike[str]) -> Path:
    """`root/<arch>-hf/`: the Hugging Face directory (built once, then reused)."""

    def write(tmp: Path) -> None:
        model = _model(arch)
        model.save_pretrained(tmp)
        if arch == "qwen3_5_moe_vl":  # real Qwen3.5-MoE checkpoints keep the experts fused
            save_fused_experts(model, tmp)
        tok = vision_tokenizer()
        tok.save(str(tmp / "tokenizer.json"))
        template = chat_template()
        (tmp / "tokenizer_config.json").write_text(
            json.dumps(tokenizer_config(template), indent=2) + "\n", encoding="utf-8"
        )
        (tmp / "chat_template.jinja").write_text(template, encoding="utf-8")
        gen = generation_config(token_id(tok, EOS_TOKEN), token_id(tok, PAD_TOKEN))
        for name, data in (
            ("generation_config.json", gen),
            ("preprocessor_config.json", PREPROCESSOR),
            ("video_preprocessor_config.json", VIDEO_PREPROCESSOR),
        ):
            (tmp / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")

    return hf_dir_once(arch, root, write)


def build_vision_fixture(arch: str, root: str | os.PathLike[str]) -> Path:
    """`root/<arch>.ninfer`, converted from `build_vision_hf_dir(arch, root)`."""
    if arch not in VISION_ARCHS:
        raise ValueError(f"unknown vision fixture {arch!r} (choose from {', '.join(VISION_ARCHS)})")
    return convert_once(arch, root, build_vision_hf_dir)


def main(argv: list[str] | None = None) -> int:
    return fixture_cli(
        argv, "artifacts.fixture_vision", __doc__, VISION_ARCHS, build_vision_fixture
    )


if __name__ == "__main__":
    sys.exit(main())
