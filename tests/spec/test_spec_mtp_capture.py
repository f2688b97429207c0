"""Target hidden-state capture (CompileOptions.capture): the plan outputs the hidden states a
drafter reads, and the CPU executor keeps them after each step as `executor.hidden`, one row per
token of the step in chunk order. Checked against transformers' `output_hidden_states`: "final"
is the last entry (the final norm applied), "L{i}" is hidden_states[i + 1] (for the last layer,
whose entry transformers replaces by the normed one, the model's norm of it is); the logits are
unchanged by capturing."""

from __future__ import annotations

import functools

import pytest
import torch

from ninfer.artifact.format import Artifact
from ninfer.errors import ConfigError
from ninfer.ir.plan_text import summary_lines
from ninfer.passes.options import CompileOptions
from ninfer.passes.pipeline import compile_artifact
from ninfer.runtime.executors.cpu.executor import Executor
from ninfer.runtime.step import SeqChunk, StepBatch


@functools.cache
def _hf(path: str):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _executor(path, capture):
    art = Artifact(path)
    opts = CompileOptions(
        cpu_weights="float32", max_concurrency=2, kv_capacity=256, capture=capture
    )
    return Executor(compile_artifact(art, opts), art)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_captured_rows_equal_transformers_hidden_states(arch, fixture_artifacts, fixture_hf_dir):
    path = fixture_artifacts(arch)
    plain = _executor(path, ())
    last = f"L{len(plain.plan.model['layer_types']) - 1}"
    ex = _executor(path, ("final", "L0", last))
    hf = _hf(str(fixture_hf_dir(arch)))
    g = torch.Generator().manual_seed(3)
    a = torch.randint(0, ex.vocab_size, (9,), generator=g).tolist()
    b = torch.randint(0, ex.vocab_size, (5,), generator=g).tolist()
    slot = (lambda i: i) if ex.is_hybrid else (lambda i: None)
    # two sequences in one step, then a decode step of each: rows follow the chunk order
    pages_a, pages_b = (0,), (3,)
    batch = StepBatch(
        (
            SeqChunk(1, tuple(a[:8]), 0, pages_a, slot(0)),
            SeqChunk(2, tuple(b[:4]), 0, pages_b, slot(1)),
        )
    )
    logits = ex.run(batch)
    assert torch.equal(logits, plain.run(batch))  # capturing changes no logit
    first = {k: v.clone() for k, v in ex.hidden.items()}
    assert set(first) == {"final", "L0", last} and all(v.shape[0] == 12 for v in first.values())
    ex.run(
        StepBatch(
            (SeqChunk(2, (b[4],), 4, pages_b, slot(1)), SeqChunk(1, (a[8],), 8, pages_a, slot(0)))
        )
    )
    second = ex.hidden
    with torch.no_grad():
        ref_a = hf(torch.tensor([a]), output_hidden_states=True).hidden_states
        ref_b = hf(torch.tensor([b]), output_hidden_states=True).hidden_states
    for name, index in (("final", -1), ("L0", 1), (last, -1)):
        got_a = torch.cat([first[name][:8], second[name][1:2]])
        got_b = torch.cat([first[name][8:], second[name][:1]])
        if name == last:
            with torch.no_grad():
                got_a, got_b = hf.model.norm(got_a), hf.model.norm(got_b)
        for got, ref in ((got_a, ref_a[index][0]), (got_b, ref_b[index][0])):
            err = (got - ref).abs().max().item()
            assert err < 1e-4, f"{arch} {name}: {err}"


def test_capture_is_shown_and_checked(fixture_artifacts) -> None:
    art = Artifact(fixture_artifacts("qwen3"))
    plan = compile_artifact(art, CompileOptions(capture=("final", "L1")))
    assert plan.outputs == ["logits", "hidden.final", "hidden.L1"]
    assert plan.model["capture"] == {"final": "hidden.final", "L1": "hidden.L1"}
    assert "capture: final=%hidden.final L1=%hidden.L1" in "\n".join(summary_lines(plan))
    with pytest.raises(ConfigError, match=r"capture 'L9': .*'L0'\.\.'L1'"):
        compile_artifact(art, CompileOptions(capture=("L9",)))
    with pytest.raises(ConfigError, match="capture final: .*--device cpu only"):
        CompileOptions(device="cuda", capture=("final",))
