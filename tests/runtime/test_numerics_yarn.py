"""YaRN rope scaling (`rope_type: "yarn"`) computes transformers' function.

The model is the tiny qwen3 fixture with its config.json switched to YaRN (factor 4 over an
original context of 32, max_position_embeddings 128) and converted into tmp_path, so prompts of
~100 tokens run well past original_max_position_embeddings, where YaRN's interpolated
frequencies and its attention factor (which multiplies cos and sin) both matter. Checked: the
inv_freq and attention factor against transformers' `_compute_yarn_parameters` (defaults,
truncate, beta_fast/beta_slow, mscale/mscale_all_dim), float32 CPU logits within 1e-3, 16-token
greedy continuations equal to `generate`, and the CUDA executor's kernels (rotary and the fused
attention prologue with their `scale` argument) under the Triton interpreter on CPU.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before kernels/ is imported

import pytest
from real_engine import assert_logits_match

from ninfer import LLM, SamplingParams
from ninfer.artifact import Artifact
from ninfer.artifact.convert_hf import convert_hf
from ninfer.artifact.model_spec import model_spec
from ninfer.errors import ArtifactError
from ninfer.passes.options import CompileOptions
from ninfer.passes.pipeline import compile_artifact
from ninfer.runtime.executors.cpu.executor import Executor
from ninfer.runtime.executors.cpu.ops import _inv_freq, rope_scale
from ninfer.runtime.executors.cuda.executor import CudaExecutor
from ninfer.runtime.step import SeqChunk, StepBatch

pytestmark = pytest.mark.usefixtures("one_thread")

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}


@pytest.fixture(scope="module")
def yarn_model(fixture_hf_dir, tmp_path_factory) -> tuple[Path, Path]:
    """(HF dir, .ninfer) of the qwen3 fixture with YaRN rope scaling."""
    root = tmp_path_factory.mktemp("yarn")
    hf = root / "qwen3-yarn-hf"
    shutil.copytree(fixture_hf_dir("qwen3"), hf)
    cfg = json.loads((hf / "config.json").read_text())
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta"))
    cfg["rope_parameters"] = {**YARN, "rope_theta": theta}
    cfg.pop("rope_scaling", None)
    cfg["max_position_embeddings"] = 128
    (hf / "config.json").write_text(json.dumps(cfg))
    return hf, convert_hf(hf, root / "qwen3-yarn.ninfer", name="tiny-qwen3-yarn")


@pytest.fixture(scope="module")
def models(yarn_model):
    import transformers

    hf_dir, path = yarn_model
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    assert hf.config.rope_parameters["rope_type"] == "yarn"
    return LLM(str(path), max_concurrency=2, kv_capacity=512, max_context=256), hf


def _prompt(n: int, seed: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"truncate": False, "beta_fast": 16.0, "beta_slow": 2.0},
        {"mscale": 1.0, "mscale_all_dim": 0.707, "factor": 8.0},
        {"attention_factor": 0.9},
    ],
)
def test_inv_freq_and_attention_factor_match_transformers(extra) -> None:
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {**YARN, "rope_theta": 1e6, **extra}
    cfg = Qwen3Config(
        hidden_size=64, num_attention_heads=4, head_dim=32, max_position_embeddings=128,
        vocab_size=512, rope_parameters=dict(params),
    )  # fmt: skip
    want_inv, want_factor = ROPE_INIT_FUNCTIONS["yarn"](cfg)
    rope = model_spec("qwen3", cfg.to_dict()).rope
    assert rope["type"] == "yarn"
    assert torch.equal(_inv_freq(rope, 32), want_inv)
    assert rope_scale(rope) == pytest.approx(want_factor, rel=1e-15)
    assert want_factor != 1.0


def test_logits_match_transformers_beyond_original_context(models) -> None:
    llm, hf = models
    for n in (100, 7):
        assert_logits_match(llm, hf, _prompt(n, n, llm.executor.vocab_size), f"{n} tokens")


def test_greedy_continuation_matches_generate(models) -> None:
    llm, hf = models
    prompts = [_prompt(96, 1, llm.executor.vocab_size), _prompt(40, 2, llm.executor.vocab_size)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    for ids, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([ids]), max_new_tokens=16, min_new_tokens=16, do_sample=False
            )[0, len(ids) :].tolist()
        assert out.token_ids == ref


def _plan(path: Path, device: str):
    opts = CompileOptions(
        device=device, dtype="float32", kv_dtype="f32", max_context=256, max_concurrency=2,
        kv_capacity=512,
    )  # fmt: skip
    return compile_artifact(Artifact(path), opts)


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests/runtime/test_cuda_executor covers it")
def test_interpreted_cuda_kernels_match_reference(yarn_model) -> None:
    """The CUDA executor (rotary / fused prologue with scale = attention factor), interpreted."""
    _, path = yarn_model
    ref = Executor(_plan(path, "cpu"), Artifact(path))
    ex = CudaExecutor(_plan(path, "cuda"), Artifact(path), "cpu")
    ids = _prompt(40, 3, ref.vocab_size)
    pages = tuple(range(8))
    logits = []
    for e in (ref, ex):
        out = [e.run(StepBatch((SeqChunk(0, tuple(ids), 0, pages, None),)), all_logits=True)]
        out.append(e.run(StepBatch((SeqChunk(0, (5,), len(ids), pages, None),))))
        logits.append(torch.cat([o.float().cpu() for o in out]))
    torch.testing.assert_close(logits[1], logits[0], atol=1e-4, rtol=1e-4)


def test_other_scaled_rope_types_still_refused() -> None:
    cfg = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 512}
    cfg["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 1e4}
    with pytest.raises(ArtifactError, match="rope type 'longrope' is not supported.*yarn"):
        model_spec("qwen3", cfg)
