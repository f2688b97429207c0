"""fuse_swiglu_linear: the SwiGLU activation folded into the down projection (into the gate/up
projection for fp8 and nvfp4 weights), printed before and after (run with -s); refused when the
activation has another reader; the same logits from the reference executor with and without it
(the CUDA executor's batch-1 GEMV paths, which compute the activation inside the kernels, are
checked in tests/runtime/test_cuda_executor.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ninfer.artifact import Artifact
from ninfer.ir import Graph, print_graph, verify
from ninfer.ir.graph import Op
from ninfer.passes.fuse_gate_up import FUSE_GATE_UP
from ninfer.passes.fuse_swiglu_linear import FUSE_SWIGLU_LINEAR
from ninfer.passes.options import CompileOptions
from ninfer.passes.pipeline import compile_artifact, graph_for_artifact
from ninfer.runtime.executors.cpu.executor import Executor
from ninfer.runtime.step import SeqChunk, StepBatch

CPU = CompileOptions(device="cpu", max_concurrency=2, kv_capacity=256)
PASS = "fuse_swiglu_linear"


def _graph(fixture_artifacts, arch: str) -> Graph:
    return FUSE_GATE_UP(graph_for_artifact(Artifact(fixture_artifacts(arch)), CPU), CPU)


@pytest.fixture(scope="module", params=["fp8", "nvfp4"])
def quant_llama(request, fixture_hf_dir, tmp_path_factory) -> Path:
    """The llama fixture with fp8 or nvfp4 projections (both take the gate/up fold)."""
    from ninfer.artifact.convert_hf import convert_hf

    out = tmp_path_factory.mktemp(request.param) / f"llama-{request.param}.ninfer"
    return convert_hf(fixture_hf_dir("llama"), out, weights=request.param)


def _down(g: Graph, layer: int) -> Op:
    w = f"model.layers.{layer}.mlp.down_proj.weight"
    return next(op for op in g.ops if op.kind == "linear" and op.inputs[1] == w)


@pytest.mark.parametrize("arch, mlps", [("llama", 2), ("qwen3_5", 4), ("qwen3_5_moe", 4)])
def test_folds_every_swiglu(fixture_artifacts, arch, mlps) -> None:
    g = _graph(fixture_artifacts, arch)
    out = verify(FUSE_SWIGLU_LINEAR(g, CPU))
    b, a = print_graph(g, weights=False), print_graph(out, weights=False)
    print(f"--- before {PASS}\n{b}--- after {PASS}\n{a}")
    assert out.meta["fusions"][PASS] == mlps  # qwen3_5_moe: the shared-expert MLPs
    assert "swiglu" in [op.kind for op in g.ops] and "swiglu" not in [op.kind for op in out.ops]
    assert len(out.ops) == len(g.ops) - mlps
    if arch == "llama":
        assert (
            "%L0.mlp_out = linear(%L0.mlp_in, @model.layers.0.mlp.down_proj.weight) "
            "{act=swiglu, group=L0.mlp_out, proj=down}" in a
        )
        assert (
            out.values["L0.mlp_in"].shape[-1]
            == 2 * out.weights[_down(out, 0).inputs[1]].type.shape[1]
        )


def test_activation_with_another_reader_is_not_folded(fixture_artifacts) -> None:
    g = _graph(fixture_artifacts, "llama").copy()
    g.ops.append(Op("add", ("L1.act", "L1.act"), ("L1.act.twice",)))
    g.values["L1.act.twice"] = g.values["L1.act"]
    g.outputs.append("L1.act.twice")
    out = verify(FUSE_SWIGLU_LINEAR(verify(g), CPU))
    assert out.meta["fusions"][PASS] == 1
    assert "act" in _down(out, 0).attrs and "act" not in _down(out, 1).attrs


def _run(ex, n_decode: int = 3) -> torch.Tensor:
    """Logits of a 13-token prefill's last row, then of n_decode batch-1 decode steps."""
    slot = 0 if ex.is_hybrid else None
    g = torch.Generator().manual_seed(9)
    tokens = tuple(torch.randint(0, 500, (13 + n_decode,), generator=g).tolist())
    rows = [ex.run(StepBatch((SeqChunk(1, tokens[:13], 0, (0, 1), slot),)))]
    for t in range(13, 13 + n_decode):
        rows.append(ex.run(StepBatch((SeqChunk(1, tokens[t : t + 1], t, (0, 1), slot),))))
    return torch.cat(rows)


@pytest.mark.parametrize("arch", ["llama", "qwen3_5"])
def test_cpu_logits_equal_without_the_pass(fixture_artifacts, arch) -> None:
    a = Artifact(fixture_artifacts(arch))
    fused, plain = compile_artifact(a, CPU), compile_artifact(a, CPU, disable=(PASS,))
    assert PASS in fused.passes and PASS not in plain.passes
    assert len(fused.calls) < len(plain.calls)
    torch.testing.assert_close(
        _run(Executor(fused, a)), _run(Executor(plain, a)), atol=1e-5, rtol=0
    )


def test_quantised_gate_up_takes_the_activation(quant_llama) -> None:
    """fp8 / nvfp4 weights: the gate/up projection writes silu(gate) * up ([T, I]) and the down
    projection reads it as a plain input."""
    g = FUSE_GATE_UP(graph_for_artifact(Artifact(quant_llama), CPU), CPU)
    out = verify(FUSE_SWIGLU_LINEAR(g, CPU))
    print(f"--- after {PASS} ({quant_llama.stem})\n{print_graph(out, weights=False)}")
    assert out.meta["fusions"][PASS] == 2 and "swiglu" not in [op.kind for op in out.ops]
    gate_up = [op for op in out.ops if op.attrs.get("out") == "swiglu"]
    assert len(gate_up) == 2 and not any("act" in op.attrs for op in out.ops)
    for layer in (0, 1):
        down = _down(out, layer)
        inter = out.weights[down.inputs[1]].type.shape[1]
        assert out.values[down.inputs[0]].shape[-1] == inter
        assert g.weights[gate_up[layer].inputs[1]].type.shape[0] == 2 * inter


def test_quantised_cpu_logits_equal_without_the_pass(quant_llama) -> None:
    a = Artifact(quant_llama)
    fused, plain = compile_artifact(a, CPU), compile_artifact(a, CPU, disable=(PASS,))
    assert any(c.attrs.get("out") == "swiglu" for c in fused.calls)
    torch.testing.assert_close(
        _run(Executor(fused, a)), _run(Executor(plain, a)), atol=1e-5, rtol=0
    )
