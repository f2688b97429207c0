"""artifacts/random_artifact.py writes a servable artifact whose tensors equal the synthetic
model's, in every weight format."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from artifacts.random_artifact import write_random_artifact
from ninfer.artifact import Artifact
from ninfer.bench.synthetic import build_synthetic


@pytest.mark.parametrize("weights", ["bf16", "fp8", "nvfp4"])
def test_random_artifact_matches_the_synthetic_model(tmp_path, weights):
    path = write_random_artifact("tiny-qwen3", tmp_path / "r.ninfer", weights=weights, seed=3)
    a = Artifact(path)
    a.verify()
    source, _ = build_synthetic("tiny-qwen3", weights, "cpu", seed=3)
    assert set(a.tensors) == set(source.tensors)
    assert a.info("model.layers.0.self_attn.q_proj.weight").format == (
        weights if weights != "bf16" else "bf16"
    )
    for name in source.tensors:
        # the stored bits are identical; the two reference dequantisers may round differently
        # in the last place (they multiply e2m1 * scale * global in different orders)
        np.testing.assert_allclose(
            a.dense(name), source.dense(name), rtol=1e-6, atol=1e-9, err_msg=name
        )
    assert a.chat_template and a.special_tokens["eos_token_ids"]


def test_random_artifact_runs_through_llm(tmp_path):
    from ninfer import LLM, SamplingParams

    path = write_random_artifact("tiny-qwen3.5-hybrid", tmp_path / "h.ninfer", seed=1)
    llm = LLM(str(path), device="cpu", dtype="float32", max_concurrency=2, kv_capacity=256)
    out = llm.generate(
        [[1, 2, 3, 4]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    )
    assert len(out[0].token_ids) == 4
    torch.set_num_threads(torch.get_num_threads())
