"""The typed graph IR: types, signatures, the verifier, the printer and the builders."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ninfer.artifact import Artifact
from ninfer.errors import ArtifactError
from ninfer.ir import Graph, Op, TensorType, VerifyError, print_graph, verify
from ninfer.ir.builder import GraphBuilder
from ninfer.ir.models import build_graph

ARCHS = ("llama", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe")


def tensor_table(path) -> dict:
    a = Artifact(path)
    return {n: (i.format, tuple(i.shape)) for n, i in a.tensors.items()}


def test_tensor_type_prints_and_parses() -> None:
    t = TensorType("f32", ("T", 64))
    assert str(t) == "f32[T,64]"
    assert TensorType.parse(str(t)) == t
    assert t.nbytes({"T": 3}) == 3 * 64 * 4
    with pytest.raises(ValueError):
        TensorType("f33", (1,))


def _tiny() -> Graph:
    b = GraphBuilder("tiny", {"w": ("f32", (8, 4)), "n": ("f32", (8,))}, "f32")
    b.input("x", TensorType("f32", ("T", 4)))
    y = b.op1("linear", ["x", b.weight("w")], None, "y")
    b.op1("rmsnorm", [y, b.weight("n")], {"eps": 1e-6, "zero_centered": False}, "z")
    return b.finish(["z"])


def test_builder_infers_types_and_verifier_accepts() -> None:
    g = verify(_tiny())
    assert str(g.values["y"]) == "f32[T,8]"
    text = print_graph(g)
    assert "%y = linear(%x, @w) : f32[T,8]" in text
    assert print_graph(g.copy()) == text  # stable


def test_builder_refuses_a_mismatched_weight() -> None:
    b = GraphBuilder("bad", {"w": ("f32", (8, 5))}, "f32")
    b.input("x", TensorType("f32", ("T", 4)))
    with pytest.raises(ValueError, match="does not match weight"):
        b.op1("linear", ["x", b.weight("w")], None, "y")


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda g: g.ops.reverse(), "used before it is defined"),
        (lambda g: g.values.__setitem__("y", TensorType("f32", ("T", 9))), "declared f32\\[T,9\\]"),
        (lambda g: setattr(g.ops[0], "kind", "conv3d"), "unknown op kind"),
        (lambda g: g.ops[1].attrs.pop("eps"), "missing attributes"),
        (lambda g: g.ops.append(Op("add", ("y", "y"), ("y",), {})), "defined twice"),
        (lambda g: g.outputs.append("nowhere"), "not defined"),
    ],
)
def test_verifier_names_the_broken_invariant(breakage, message) -> None:
    g = _tiny()
    breakage(g)
    with pytest.raises(VerifyError, match=message):
        verify(g)


@pytest.mark.parametrize("arch", ARCHS)
def test_builders_make_verified_graphs(arch: str, fixture_artifacts) -> None:
    a = Artifact(fixture_artifacts(arch))
    g = verify(build_graph(a.architecture, a.config, tensor_table(a.path)))
    kinds = {op.kind for op in g.ops}
    assert g.outputs == ["logits"] and str(g.values["logits"]) == f"f32[R,{a.config['vocab_size']}]"
    assert len([o for o in g.ops if o.kind == "attention"]) == g.meta["layer_types"].count(
        "full_attention"
    )
    if arch.startswith("qwen3_5"):
        assert {"gated_delta_rule", "causal_conv1d", "gated_rmsnorm", "split_gated_q"} <= kinds
        assert all(op.attrs["zero_centered"] for op in g.ops if op.kind == "rmsnorm")
        rot = next(op for op in g.ops if op.kind == "rotary")
        assert rot.attrs["rotary_dim"] == a.config["head_dim"] // 4  # partial rotary 0.25
    if "moe" in arch:
        assert {"moe_router", "moe_experts"} <= kinds
        assert all(op.attrs["normalize"] for op in g.ops if op.kind == "moe_router")
    if arch == "qwen3_5_moe":
        assert any(
            op.inputs[1].endswith("shared_expert_gate.weight")
            for op in g.ops
            if op.kind == "linear"
        )
    if arch == "llama":
        assert not any(
            op.kind == "rmsnorm" and op.attrs.get("head_dim") for op in g.ops
        )  # no qk-norm
    if arch == "qwen3":
        assert (
            sum(1 for op in g.ops if op.kind == "rmsnorm" and op.attrs.get("head_dim")) == 4
        )  # q, k x 2 layers


def test_builder_reports_a_missing_tensor(fixture_artifacts) -> None:
    a = Artifact(fixture_artifacts("qwen3"))
    table = tensor_table(a.path)
    del table["model.layers.1.self_attn.k_norm.weight"]
    with pytest.raises(ArtifactError, match="k_norm"):
        build_graph("qwen3", a.config, table)


def test_ir_and_passes_do_not_import_torch() -> None:
    code = (
        "import sys, ninfer.ir, ninfer.ir.models, ninfer.ir.plan, ninfer.passes.pipeline;"
        "bad = [m for m in ('torch', 'triton', 'ninfer.runtime.executors.cpu.executor') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
