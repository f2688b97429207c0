"""`convert --quantize-lm-head`: the head takes --weights too, tied or not, and the engine's
logits are the head's dequantised weights times the final hidden state (transformers on the
artifact's dequantised weights)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ninfer.artifact import Artifact
from ninfer.artifact.convert_hf import convert_hf
from ninfer.passes.options import CompileOptions
from ninfer.passes.pipeline import compile_artifact
from ninfer.runtime.executors.cpu.executor import Executor
from ninfer.runtime.step import SeqChunk, StepBatch

pytestmark = pytest.mark.usefixtures("one_thread")

HEAD, EMBED = "lm_head.weight", "model.embed_tokens.weight"
PROMPT = (5, 17, 3, 42, 8, 11)


def engine_logits(path) -> torch.Tensor:
    a = Artifact(path)
    ex = Executor(compile_artifact(a, CompileOptions(max_concurrency=1, kv_capacity=64)), a)
    slot = 0 if ex.is_hybrid else None
    return ex.run(StepBatch((SeqChunk(1, PROMPT, 0, (0,), slot),)))[0].float()


def reference_logits(hf_dir, a: Artifact) -> torch.Tensor:
    """transformers on the artifact's dequantised weights: the final hidden state times the
    artifact's head."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    state = {n: torch.tensor(a.dense(n)) for n in a if n != HEAD}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {HEAD}, (missing, unexpected)
    with torch.no_grad():
        out = model(torch.tensor([PROMPT]), output_hidden_states=True)
    return out.hidden_states[-1][0, -1] @ torch.from_numpy(a.dense(HEAD)).T


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])  # tied, untied
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_head_is_quantised_and_used(arch, fmt, fixture_hf_dir, tmp_path) -> None:
    d = fixture_hf_dir(arch)
    plain_path = convert_hf(d, tmp_path / "plain.ninfer", weights=fmt)
    plain = Artifact(plain_path)
    tied = bool(plain.config.get("tie_word_embeddings"))
    assert tied == (arch == "qwen3")
    assert plain.info(HEAD if not tied else EMBED).format == "bf16"
    path = convert_hf(d, tmp_path / "head.ninfer", weights=fmt, quantize_lm_head=True)
    a = Artifact(path)
    assert a.info(HEAD).format == fmt and a.info(EMBED).format == "bf16"
    assert a.config["tie_word_embeddings"] is False
    np.testing.assert_array_equal(a.dense(EMBED), plain.dense(EMBED))  # the gather is exact
    source = plain.dense(EMBED if tied else HEAD)
    err = np.abs(a.dense(HEAD) - source).max() / np.abs(source).max()
    assert 0 < err <= {"fp8": 0.07, "nvfp4": 0.2}[fmt]
    got = engine_logits(path)
    want = reference_logits(d, a)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)
    assert (got - engine_logits(plain_path)).abs().max() > 1e-3  # the quantised head is read
