"""fuse_attention_prologue: per-head q/k RMSNorm + rotary folded into attention, printed before
and after (run with -s), refused when a folded value has another reader, and the same logits
from the reference executor with and without it."""

from __future__ import annotations

import pytest
import torch

from ninfer.artifact import Artifact
from ninfer.ir import Graph, print_graph, verify
from ninfer.ir.graph import Op
from ninfer.passes.fuse_attention_prologue import FUSE_ATTENTION_PROLOGUE
from ninfer.passes.fuse_qkv import FUSE_QKV
from ninfer.passes.options import CompileOptions
from ninfer.passes.pipeline import build_pipeline, compile_artifact, graph_for_artifact
from ninfer.runtime.executors.cpu.executor import Executor
from ninfer.runtime.step import SeqChunk, StepBatch

CPU = CompileOptions(device="cpu", max_concurrency=2, kv_capacity=256)
PASS = "fuse_attention_prologue"


def _graph(fixture_artifacts, arch: str) -> Graph:
    return FUSE_QKV(graph_for_artifact(Artifact(fixture_artifacts(arch)), CPU), CPU)


def _dump(title: str, before: Graph, after: Graph) -> str:
    b, a = print_graph(before, weights=False), print_graph(after, weights=False)
    print(f"--- before {title}\n{b}--- after {title}\n{a}")
    return a


def _attention(g: Graph, layer: int) -> Op:
    return next(op for op in g.ops if op.kind == "attention" and op.attrs["layer"] == layer)


@pytest.mark.parametrize(
    "arch, layers, prologue, rotary_dim, zero_centered",
    [
        ("llama", [0, 1], "rotary", 16, None),
        ("qwen3", [0, 1], "qk_norm+rotary", 16, False),
        ("qwen3_5", [1, 3], "qk_norm+rotary", 4, True),  # gated q, partial rotary
    ],
)
def test_folds_every_attention_prologue(
    fixture_artifacts, arch, layers, prologue, rotary_dim, zero_centered
) -> None:
    g = _graph(fixture_artifacts, arch)
    out = verify(FUSE_ATTENTION_PROLOGUE(g, CPU))
    a = _dump(PASS, g, out)
    assert out.meta["fusions"][PASS] == len(layers)
    assert "rotary" in [op.kind for op in g.ops] and "rotary" not in [op.kind for op in out.ops]
    assert not [op for op in out.ops if op.kind == "rmsnorm" and op.attrs.get("head_dim")]
    assert len(out.ops) == len(g.ops) - len(layers) * (1 if prologue == "rotary" else 3)
    for i in layers:
        att = _attention(out, i)
        q = f"L{i}.q" if arch == "qwen3_5" else f"L{i}.q_proj"
        inputs = (q, f"L{i}.k", f"L{i}.v", "positions")
        if prologue == "qk_norm+rotary":
            p = f"model.layers.{i}.self_attn"
            inputs += (f"{p}.q_norm.weight", f"{p}.k_norm.weight")
        assert att.inputs == inputs
        assert att.attrs["prologue"] == prologue and att.attrs["rotary_dim"] == rotary_dim
        assert att.attrs.get("zero_centered") == zero_centered
        assert f"L{i}.q_rot" not in out.values and f"L{i}.k_rot" not in out.values
    if arch == "qwen3":
        assert (
            "%L0.attn = attention(%L0.q_proj, %L0.k, %L0.v, %positions, "
            "@model.layers.0.self_attn.q_norm.weight, @model.layers.0.self_attn.k_norm.weight) "
            "{cache=kv.L0, eps=1e-06, head_dim=16, heads=4, kv_heads=2, layer=0, "
            'prologue=qk_norm+rotary, rope={"theta":1000000.0,"type":"default"}, rotary_dim=16, '
            "scale=0.25, zero_centered=False}" in a
        )
    assert "rotary" in [op.kind for op in g.ops]  # the input graph is untouched


def _read_by_extra_op(g: Graph, name: str) -> Graph:
    """g with one more op reading `name` (its result a graph output, so it stays live)."""
    g = g.copy()
    g.ops.append(Op("add", (name, name), (f"{name}.twice",)))
    g.values[f"{name}.twice"] = g.values[name]
    g.outputs.append(f"{name}.twice")
    return verify(g)


def test_values_with_other_readers_are_not_folded(fixture_artifacts) -> None:
    g = _graph(fixture_artifacts, "qwen3")
    # L0: a rotated q read elsewhere keeps the whole chain; L1: a normed k read elsewhere keeps
    # both norms, and rotary alone folds
    g = _read_by_extra_op(_read_by_extra_op(g, "L0.q_rot"), "L1.k_normed")
    out = verify(FUSE_ATTENTION_PROLOGUE(g, CPU))
    _dump(PASS, g, out)
    assert out.meta["fusions"][PASS] == 1
    assert "prologue" not in _attention(out, 0).attrs
    assert _attention(out, 0).inputs == ("L0.q_rot", "L0.k_rot", "L0.v")
    l1 = _attention(out, 1)
    assert l1.attrs["prologue"] == "rotary" and "eps" not in l1.attrs
    assert l1.inputs == ("L1.q_normed", "L1.k_normed", "L1.v", "positions")
    head_norms = [op for op in out.ops if op.kind == "rmsnorm" and op.attrs.get("head_dim")]
    assert len(head_norms) == 4  # L0's and L1's
    # a rotated k that is a graph output is not folded either
    g2 = _graph(fixture_artifacts, "llama")
    g2.outputs.append("L1.k_rot")
    out2 = verify(FUSE_ATTENTION_PROLOGUE(g2, CPU))
    assert out2.meta["fusions"][PASS] == 1 and "prologue" not in _attention(out2, 1).attrs


def _run(plan, artifact: Artifact) -> torch.Tensor:
    """All logits of a 21-token prefill, then of two decode steps."""
    ex = Executor(plan, artifact)
    slot = 0 if ex.is_hybrid else None
    g = torch.Generator().manual_seed(5)
    tokens = tuple(torch.randint(0, 500, (23,), generator=g).tolist())
    rows = [ex.run(StepBatch((SeqChunk(1, tokens[:21], 0, (0, 1), slot),)), all_logits=True)]
    for t in (21, 22):
        rows.append(ex.run(StepBatch((SeqChunk(1, tokens[t : t + 1], t, (0, 1), slot),))))
    return torch.cat(rows)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_5"])
def test_cpu_logits_equal_without_the_pass(fixture_artifacts, arch) -> None:
    a = Artifact(fixture_artifacts(arch))
    fused = compile_artifact(a, CPU)
    plain = compile_artifact(a, CPU, disable=(PASS,))
    assert PASS in fused.passes and PASS not in plain.passes
    assert len(fused.calls) < len(plain.calls)
    x, y = _run(plain, a), _run(fused, a)
    assert x.shape == (23, 512) and x.dtype == torch.float32
    torch.testing.assert_close(y, x, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "kv_dtype, prefix",
    [
        ("bf16", "triton.attention_prologue+"),
        ("fp8", "triton.attention_prologue+"),
        ("int8", "triton.attention_prologue+"),
        ("k8v4", "triton.rmsnorm+rotary+kv_write+"),  # nvfp4 V: the unfused launches
    ],
)
def test_cuda_kernel_names(fixture_artifacts, kv_dtype, prefix) -> None:
    opts = CompileOptions(device="cuda", kv_dtype=kv_dtype)
    plan = compile_artifact(Artifact(fixture_artifacts("qwen3")), opts)
    att = [c for c in plan.calls if c.op == "attention"]
    assert len(att) == 2 and {c.kernel for c in att} == {prefix + "paged_attention_prefill"}
    assert {c.attrs["decode_kernel"] for c in att} == {prefix + "paged_attention_decode"}
    assert not [c for c in plan.calls if c.op in ("rotary", "rmsnorm") and c.attrs.get("head_dim")]


def test_only_fusions_can_be_disabled() -> None:
    names = [p.name for p in build_pipeline(CPU, disable=(PASS,))]
    assert PASS not in names and "fuse_qkv" in names
    with pytest.raises(ValueError, match="only fusion passes can be disabled"):
        build_pipeline(CPU, disable=("choose_kv",))
