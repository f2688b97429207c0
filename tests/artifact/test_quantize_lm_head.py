"""`convert --quantize-lm-head` on the artifact side: a tied GGUF head becomes a quantised copy
of the embedding, and the option needs a quantised --weights (the HF side and the engine's
logits: tests/runtime/test_lm_head_logits.py)."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer.artifact import Artifact
from ninfer.artifact.convert_gguf import convert_gguf
from ninfer.artifact.convert_hf import convert_hf
from ninfer.errors import ConvertError

HEAD, EMBED = "lm_head.weight", "model.embed_tokens.weight"


def test_tied_gguf_head_is_a_quantised_copy(tmp_path, write_gguf) -> None:
    from tests.artifact.test_gguf_convert import FFN, tiny_llama

    tensors = tiny_llama(np.random.default_rng(0))
    del tensors["output.weight"]
    path = write_gguf(tmp_path / "tied.gguf", tensors, hparams={"feed_forward_length": FFN})
    exact = Artifact(convert_gguf(path, tmp_path / "exact.ninfer"))
    a = Artifact(convert_gguf(path, tmp_path / "q.ninfer", weights="nvfp4", quantize_lm_head=True))
    assert exact.config["tie_word_embeddings"] is True and HEAD not in exact.tensors
    assert a.config["tie_word_embeddings"] is False
    assert a.info(HEAD).format == "nvfp4" and a.info(EMBED).format == "bf16"
    ref = exact.dense(EMBED)
    assert np.abs(a.dense(HEAD) - ref).max() <= 0.2 * np.abs(ref).max()


def test_needs_a_quantised_format(fixture_hf_dir, tmp_path) -> None:
    for weights in (None, "bf16"):
        with pytest.raises(ConvertError, match="--quantize-lm-head needs --weights fp8 or nvfp4"):
            convert_hf(fixture_hf_dir("qwen3"), tmp_path / "x.ninfer", weights=weights,
                       quantize_lm_head=True)  # fmt: skip
    assert not list(tmp_path.iterdir())
