"""The CUDA executor with a --vision plan computes the function of the CPU reference executor:
the vision stage once per image / video, its embeddings over the placeholder rows of prefill
chunks that cut through the media, 3-axis (MRoPE) positions for the prompt and for the decode
rows after it (the rope delta), decode steps replayed from CUDA Graphs on a GPU.

On CPU the executor's code runs its Triton kernels under the interpreter and must match the
reference to float32 rounding. On a GPU (marked `gpu`): bf16 within BF16_TOL (relative to the
largest logit) of the CPU float32 reference at every step of a teacher-forced continuation, and
the first greedy token agrees up to a near-tie; float32 greedy tokens equal the reference's.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before kernels/ is imported

import pytest
from media_prompts import MediaPrompt, PromptBuilder, mp4, png

from ninfer.artifact import Artifact
from ninfer.passes.options import CompileOptions
from ninfer.passes.pipeline import compile_artifact
from ninfer.runtime.executors.cpu.executor import Executor
from ninfer.runtime.executors.cuda.executor import CudaExecutor
from ninfer.runtime.step import SeqChunk, StepBatch
from ninfer.runtime.vision.mrope import MRope

ARCH = "qwen3_5_vl"
BF16_TOL = 0.1  # as tests/runtime/test_cuda_executor.py: bf16 of the tiny random fixtures
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
PAGES = tuple(range(16))  # pages of the one sequence (page size 16: 256 positions)


def _plan(path, device: str, dtype: str, **kw):
    opts = {"vision": True, "max_context": 256, "max_concurrency": 2, "kv_capacity": 1024}
    opts.update(kw)
    return compile_artifact(Artifact(path), CompileOptions(device=device, dtype=dtype, **opts))


def _prompt(builder: PromptBuilder) -> MediaPrompt:
    """An image (a 2 x 4 token grid) and a video of 2 temporal patches (2 x 3 tokens each)."""
    builder.text("Look: ").image(png(40, 56, seed=1)).text(" and ")
    return builder.video(mp4(8, 48, 32, fps=4, seed=2)).text(" What is it?").build()


def _overlaps(span, lo: int, hi: int) -> bool:
    return any(s < hi and lo < s + n for s, n in span.runs)


def _teacher_forced(ex, prompt: MediaPrompt, forced: list[int], chunk: int) -> list[torch.Tensor]:
    """Logits [1, vocab] (float32, on the host) of the last prompt position, then of each
    decode step feeding `forced`; the prompt runs in prefill chunks of `chunk` tokens."""
    mrope = MRope.of(prompt.spans)
    slot = 0 if ex.is_hybrid else None
    ids = list(prompt.ids)
    out: list[torch.Tensor] = []
    pos = 0
    while pos < len(ids):
        end = min(pos + chunk, len(ids))
        media = tuple(s for s in prompt.spans if _overlaps(s, pos, end))
        c = SeqChunk(
            0, tuple(ids[pos:end]), pos, PAGES, slot, end == len(ids), media=media, mrope=mrope
        )
        logits = ex.run(StepBatch((c,)))
        pos = end
    out.append(logits.float().cpu())
    for t in forced:
        c = SeqChunk(0, (t,), pos, PAGES, slot, mrope=mrope)
        out.append(ex.run(StepBatch((c,))).float().cpu())
        pos += 1
    return out


def _reference(path) -> Executor:
    return Executor(_plan(path, "cpu", "float32"), Artifact(path))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the gpu tests cover this on a GPU")
def test_interpreted_vision_plan_matches_reference(vision_artifact, prompt_builder):
    path = vision_artifact(ARCH)
    prompt = _prompt(prompt_builder(ARCH))
    ex = CudaExecutor(_plan(path, "cuda", "float32", kv_dtype="f32"), Artifact(path), "cpu")
    kernels = {c.kernel for c in ex.plan.calls}
    assert {"torch.vision_attention", "torch.rotary_mrope"} <= kernels  # the unfused prologue
    forced = [5, 6]
    # prefill chunks of 24 tokens (63 in all): the video's two frames land in two chunks
    want = _teacher_forced(_reference(path), prompt, forced, chunk=24)
    before = ex.media.encoded_items
    got = _teacher_forced(ex, prompt, forced, chunk=24)
    assert ex.media.encoded_items - before == 2  # the image and the video, once each
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def test_cuda_vision_plan_keeps_text_plans_fused(vision_artifact, capsys):
    """`ninfer compile --vision --device cuda` plans the tower; only a --vision plan leaves the
    rotary out of the one-launch attention prologue (the same artifact compiled without
    --vision folds it as before)."""
    from ninfer.cli import main

    capsys.readouterr()
    assert main(["compile", str(vision_artifact(ARCH)), "--vision", "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "torch.rotary_mrope" in out and "torch.vision_attention" in out
    text = _plan(vision_artifact(ARCH), "cuda", "bfloat16", vision=False)
    vision = _plan(vision_artifact(ARCH), "cuda", "bfloat16")
    for plan, want in ((text, "triton.attention_prologue+paged_attention_prefill"),
                       (vision, "triton.paged_attention_prefill")):  # fmt: skip
        assert {c.kernel for c in plan.calls if c.op == "attention"} == {want}
    assert not any(c.kernel.startswith("torch.") and c.op != "rotary"
                   for c in vision.calls if c.attrs.get("stage") != "vision"
                   and c.op not in ("embed", "add", "sigmoid_mul", "select_rows", "media_merge"))  # fmt: skip
    assert [c.kernel for c in vision.calls if c.op == "rotary"] == ["torch.rotary_mrope"] * 2


# -- GPU ----------------------------------------------------------------------------------------


@gpu
def test_bfloat16_vision_plan_within_tolerance(vision_artifact, prompt_builder):
    path = vision_artifact(ARCH)
    prompt = _prompt(prompt_builder(ARCH))
    ref = _reference(path)
    forced = [
        int(t) for t in torch.randint(3, 512, (8,), generator=torch.Generator().manual_seed(3))
    ]
    want = _teacher_forced(ref, prompt, forced, chunk=16)
    ex = CudaExecutor(_plan(path, "cuda", "bfloat16"), Artifact(path))
    got = _teacher_forced(ex, prompt, forced, chunk=16)
    assert sorted(ex._graphs) == [1], "decode rows after the media replay graph 1"
    # the first greedy token agrees, or is a near-tie under the tolerance in the reference
    w0, g0 = want[0], got[0]
    picked = w0.gather(1, g0.argmax(-1, keepdim=True)).squeeze(1)
    assert bool((w0.max(-1).values - picked <= BF16_TOL * w0.abs().max()).all())
    for w, g in zip(want, got):
        err = float((g - w).abs().max()) / float(w.abs().max())
        assert err < BF16_TOL, err


@gpu
@pytest.mark.parametrize("arch", ["qwen3_5_vl", "qwen3_5_moe_vl"])
def test_float32_vision_greedy_equals_reference(arch, vision_artifact, prompt_builder):
    path = vision_artifact(arch)
    prompt = _prompt(prompt_builder(arch))
    ref = _reference(path)
    ex = CudaExecutor(_plan(path, "cuda", "float32", kv_dtype="f32"), Artifact(path))
    tokens: list[int] = []
    for _ in range(12):  # greedy on the reference, teacher-forced on both
        tokens.append(int(_teacher_forced(ref, prompt, tokens, chunk=64)[-1].argmax()))
    want = _teacher_forced(ref, prompt, tokens[:-1], chunk=64)
    got = _teacher_forced(ex, prompt, tokens[:-1], chunk=64)
    assert [int(g.argmax()) for g in got] == tokens
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=2e-3, rtol=2e-3)


@gpu
def test_engine_on_cuda_gives_the_cpu_engines_tokens(vision_artifact, prompt_builder):
    """Through the engine (scheduler, sampler, overlap, CUDA Graph decode): prefill chunks of 5
    tokens cut through the image and the video's frames, each item is encoded once, and the
    float32 greedy tokens are the CPU engine's."""
    from ninfer import LLM
    from ninfer.runtime.request import Request, SamplingParams

    path = str(vision_artifact(ARCH))
    prompt = _prompt(prompt_builder(ARCH))
    request = Request(
        tuple(prompt.ids), SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True),
        media=prompt.spans,
    )  # fmt: skip
    outs = []
    for device, kv in (("cpu", None), ("cuda", "f32")):
        llm = LLM(path, device=device, vision=True, max_concurrency=2, kv_capacity=1024,
                  prefill_chunk=5, kv_dtype=kv, cpu_weights="float32")  # fmt: skip
        before = llm.executor.media.encoded_items
        out = llm.engine.submit(request).result(120)
        assert out.error is None
        assert llm.executor.media.encoded_items - before == 2
        outs.append(list(out.token_ids))
        llm.engine.close()
    assert outs[0] == outs[1]
