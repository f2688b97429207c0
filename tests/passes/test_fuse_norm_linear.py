"""fuse_norm_linear: which RMSNorms are marked to run inside the fp8 / nvfp4 projections around them
(printed before and after with -s), only in CUDA plans; the kernels and the executor's use of
the marks are checked on the GPU (tests/kernels/test_fp8_mma.py,
tests/runtime/test_cuda_executor.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ninfer.artifact import Artifact
from ninfer.ir import Graph, print_graph, verify
from ninfer.ir.graph import Op
from ninfer.passes.fuse_norm_linear import FUSE_NORM_LINEAR
from ninfer.passes.options import CompileOptions
from ninfer.passes.pipeline import FUSIONS, build_pipeline, graph_for_artifact

CUDA = CompileOptions(device="cuda", max_concurrency=2, kv_capacity=256)
PASS = "fuse_norm_linear"


def _convert(fixture_hf_dir, tmp_path_factory, weights: str) -> Path:
    from ninfer.artifact.convert_hf import convert_hf

    out = tmp_path_factory.mktemp(weights) / f"llama-{weights}.ninfer"
    return convert_hf(fixture_hf_dir("llama"), out, weights=weights)


@pytest.fixture(scope="module")
def fp8_llama(fixture_hf_dir, tmp_path_factory) -> Path:
    return _convert(fixture_hf_dir, tmp_path_factory, "fp8")


@pytest.fixture(scope="module", params=["fp8", "nvfp4"])
def quant_llama(request, fixture_hf_dir, tmp_path_factory) -> tuple[str, Path]:
    return request.param, _convert(fixture_hf_dir, tmp_path_factory, request.param)


def _fused(path: Path) -> Graph:
    """The graph after every fusion before this one."""
    g = graph_for_artifact(Artifact(path), CUDA)
    for p in FUSIONS:
        if p.name == PASS:
            return verify(g)
        g = p(g, CUDA)
    raise AssertionError("fuse_norm_linear is not in FUSIONS")


def _marked(g: Graph) -> tuple[list[str], list[tuple[str, int]]]:
    producers = [op.outputs[0] for op in g.ops if op.attrs.get("residual_norm")]
    norms = [(op.outputs[1], op.attrs["stats_slot"]) for op in g.ops if "stats_slot" in op.attrs]
    return producers, norms


def test_marks_the_norms_between_quantised_projections(quant_llama) -> None:
    """Two layers: the post-attention norms (o -> gate/up) and layer 1's input norm (layer 0's
    down -> q/k/v); not layer 0's input norm (after the embedding) nor the final one (before
    the bf16 LM head). fp8 and nvfp4 alike."""
    fmt, path = quant_llama
    g = _fused(path)
    out = verify(FUSE_NORM_LINEAR(g, CUDA))
    b, a = print_graph(g, weights=False), print_graph(out, weights=False)
    print(f"--- before {PASS}\n{b}--- after {PASS}\n{a}")
    producers, norms = _marked(out)
    assert out.meta["fusions"][PASS] == 3
    assert [slot for _, slot in norms] == [0, 1, 2]
    users = out.users()
    for op in out.ops:
        if op.attrs.get("residual_norm"):
            (j,) = users[op.outputs[0]]
            assert out.ops[j].kind == "add_rmsnorm" and "stats_slot" in out.ops[j].attrs
            assert out.weights[op.inputs[1]].format == fmt
    assert len(producers) == 3 and len(out.ops) == len(g.ops)
    assert [op.attrs for op in g.ops] != [op.attrs for op in out.ops]


def test_norm_output_with_another_reader_is_not_marked(fp8_llama) -> None:
    g = _fused(fp8_llama).copy()
    n = next(op.outputs[0] for op in g.ops if op.kind == "add_rmsnorm")
    g.ops.append(Op("add", (n, n), (n + ".twice",)))
    g.values[n + ".twice"] = g.values[n]
    g.outputs.append(n + ".twice")
    out = verify(FUSE_NORM_LINEAR(verify(g), CUDA))
    assert out.meta["fusions"][PASS] == 2
    assert n not in [name for name, _ in _marked(out)[1]]


def test_bf16_weights_and_cpu_plans_are_left_alone(fixture_artifacts, fp8_llama) -> None:
    g = graph_for_artifact(Artifact(fixture_artifacts("llama")), CUDA)
    for p in FUSIONS:
        g = p(g, CUDA)
    assert g.meta["fusions"][PASS] == 0
    cpu = CompileOptions(device="cpu", max_concurrency=2, kv_capacity=256)
    assert PASS not in [p.name for p in build_pipeline(cpu)]
    assert PASS in [p.name for p in build_pipeline(CUDA)]
    assert PASS not in [p.name for p in build_pipeline(CUDA, disable=[PASS])]
