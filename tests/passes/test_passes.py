"""Every pass, printed before and after (run with -s to see the dumps), on real fixture graphs."""

from __future__ import annotations

import pytest

from ninfer.artifact import Artifact
from ninfer.artifact.convert_hf import convert_hf
from ninfer.errors import ConfigError
from ninfer.ir import Graph, print_graph, verify
from ninfer.passes.assign_kernels import ASSIGN_KERNELS
from ninfer.passes.choose_kv import CHOOSE_KV
from ninfer.passes.cuda_graphs import CUDA_GRAPHS
from ninfer.passes.fuse_gate_up import FUSE_GATE_UP
from ninfer.passes.fuse_qkv import FUSE_QKV
from ninfer.passes.fuse_residual_norm import FUSE_RESIDUAL_NORM
from ninfer.passes.options import CompileOptions
from ninfer.passes.pipeline import build_pipeline, compile_artifact, graph_for_artifact, run_passes
from ninfer.passes.plan_memory import PLAN_MEMORY
from ninfer.passes.verify import VERIFY
from ninfer.runtime.config import EngineOptions

ARCHS = ("llama", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe")
CPU = CompileOptions(device="cpu")
CUDA = CompileOptions(device="cuda", max_concurrency=4)


def graph(fixture_artifacts, arch: str, options: CompileOptions = CPU) -> Graph:
    return graph_for_artifact(Artifact(fixture_artifacts(arch)), options)


def dump(title: str, before: Graph, after: Graph) -> tuple[str, str]:
    b, a = print_graph(before, weights=False), print_graph(after, weights=False)
    print(f"--- before {title}\n{b}--- after {title}\n{a}")
    return b, a


def kinds(g: Graph) -> list[str]:
    return [op.kind for op in g.ops]


def test_verify_pass_keeps_the_graph(fixture_artifacts) -> None:
    g = graph(fixture_artifacts, "llama")
    b, a = dump("verify", g, VERIFY(g, CPU))
    assert a == b


def test_fuse_qkv(fixture_artifacts) -> None:
    g = graph(fixture_artifacts, "qwen3_5")
    out = verify(FUSE_QKV(g, CPU))
    b, a = dump("fuse_qkv", g, out)
    assert "@model.layers.1.self_attn.q_proj.weight" in b
    assert "%L1.attn_in = linear(%L1.h, @model.layers.1.self_attn.q_proj+k_proj+v_proj.weight)" in a
    assert "%L1.q_proj, %L1.k, %L1.v = split(%L1.attn_in) {sizes=[128,32,32]}" in a
    assert "%L0.qkv_raw, %L0.z, %L0.b, %L0.a = split(%L0.gdn_in) {sizes=[128,64,4,4]}" in a
    assert out.meta["fusions"]["fuse_qkv"] == 4  # 2 attention + 2 DeltaNet layers
    assert kinds(out).count("linear") == kinds(g).count("linear") - 2 * 2 - 2 * 3
    fused = out.weights["model.layers.1.self_attn.q_proj+k_proj+v_proj.weight"]
    assert fused.layout == "concat" and fused.type.shape == (192, 64)
    assert g.weights.keys() >= {"model.layers.1.self_attn.q_proj.weight"}  # input graph untouched


def test_fuse_gate_up(fixture_artifacts) -> None:
    g = FUSE_QKV(graph(fixture_artifacts, "qwen3_5_moe"), CPU)
    out = verify(FUSE_GATE_UP(g, CPU))
    b, a = dump("fuse_gate_up", g, out)
    assert "silu_mul" in b and "silu_mul" not in a
    assert "%L0.shared.act = swiglu(%L0.shared.mlp_in)" in a
    assert (
        "moe_experts_gu(%L0.h_post, %L0.top_w, %L0.top_i, @model.layers.0.mlp.experts.gate_up_proj.weight"
        in a
    )
    w = out.weights["model.layers.0.mlp.experts.gate_up_proj.weight"]
    assert w.layout == "stack_concat" and w.type.shape == (8, 64, 64) and len(w.sources) == 16
    assert out.meta["fusions"]["fuse_gate_up"] == 8  # 4 shared-expert MLPs + 4 expert sets


def test_fuse_residual_norm(fixture_artifacts) -> None:
    g = graph(fixture_artifacts, "llama")
    out = verify(FUSE_RESIDUAL_NORM(g, CPU))
    _, a = dump("fuse_residual_norm", g, out)
    assert (
        "%L0.h_post, %L0.x_mid = add_rmsnorm(%x, %L0.attn_out, @model.layers.0.post_attention_layernorm.weight)"
        in a
    )
    assert (
        "%L1.h, %L0.x_out = add_rmsnorm(%L0.x_mid, %L0.mlp_out, @model.layers.1.input_layernorm.weight)"
        in a
    )
    # the first norm reads the embedding (no add) and the final norm reads selected rows
    assert kinds(out).count("rmsnorm") == 2 and kinds(out).count("add_rmsnorm") == 3
    assert out.meta["fusions"]["fuse_residual_norm"] == 3


@pytest.mark.parametrize(
    "device, kv_dtype, expect, per_token",
    [
        ("cpu", None, "f32", 2 * 2 * 2 * 16 * 4),  # layers * (K,V) * kv_heads * head_dim * 4
        ("cuda", None, "bf16", 2 * 2 * 2 * 16 * 2),
        ("cpu", "int8", "int8", 2 * 2 * 2 * (16 + 4)),
        ("cuda", "k8v4", "k8v4", 2 * 2 * ((16 + 4) + (8 + 1 + 4))),
    ],
)
def test_choose_kv(fixture_artifacts, device, kv_dtype, expect, per_token) -> None:
    opts = CompileOptions(device=device, kv_dtype=kv_dtype)
    g = graph(fixture_artifacts, "llama", opts)
    out = verify(CHOOSE_KV(g, opts))
    dump("choose_kv", g, out)
    assert out.meta["kv"]["dtype"] == expect
    assert out.meta["kv"]["bytes_per_token"] == per_token
    assert all(op.attrs["kv_dtype"] == expect for op in out.ops if op.kind == "attention")


def test_choose_kv_state_slots(fixture_artifacts) -> None:
    opts = CompileOptions(max_concurrency=3, device_state_slots=2)
    out = CHOOSE_KV(graph(fixture_artifacts, "qwen3_5", opts), opts)
    st = out.meta["state"]
    assert st["layers"] == [0, 2] and st["slots"] == 5
    # conv tail [128, 3] f32 + S [4, 16, 16] f32, per linear layer
    assert st["bytes_per_slot"] == 2 * (128 * 3 * 4 + 4 * 16 * 16 * 4)


def test_assign_kernels_by_device_and_format(fixture_artifacts, fixture_hf_dir, tmp_path) -> None:
    for fmt, gemm in (("fp8", "triton.gemm_fp8"), ("nvfp4", "triton.gemm_nvfp4")):
        path = convert_hf(fixture_hf_dir("llama"), tmp_path / f"llama-{fmt}.ninfer", weights=fmt)
        g = graph_for_artifact(Artifact(path), CUDA)
        g = CHOOSE_KV(FUSE_RESIDUAL_NORM(FUSE_GATE_UP(FUSE_QKV(g, CUDA), CUDA), CUDA), CUDA)
        out = verify(ASSIGN_KERNELS(g, CUDA))
        dump(f"assign_kernels ({fmt}, cuda)", g, out)
        linears = [op for op in out.ops if op.kind == "linear"]
        assert linears and all(
            op.kernel == gemm and op.attrs["weight_format"] == fmt for op in linears
        )
        assert (
            next(op for op in out.ops if op.kind == "logits").kernel == "cublas.gemm"
        )  # tied bf16 head
        att = next(op for op in out.ops if op.kind == "attention")
        assert (att.kernel, att.attrs["decode_kernel"]) == (
            "triton.paged_attention_prefill",
            "triton.paged_attention_decode",
        )
        assert {op.kernel for op in out.ops if op.kind == "add_rmsnorm"} == {
            "triton.rmsnorm_residual"
        }
    g = graph(fixture_artifacts, "qwen3_5")
    out = ASSIGN_KERNELS(CHOOSE_KV(g, CPU), CPU)
    assert all(
        op.kernel == ("view.split" if op.kind.startswith("split") else f"torch.{op.kind}")
        for op in out.ops
    )
    cuda = ASSIGN_KERNELS(CHOOSE_KV(graph(fixture_artifacts, "qwen3_5", CUDA), CUDA), CUDA)
    gdr = next(op for op in cuda.ops if op.kind == "gated_delta_rule")
    assert (gdr.kernel, gdr.attrs["decode_kernel"]) == (
        "triton.gdn_recurrent_prefill",
        "triton.gdn_recurrent_decode",
    )
    assert (
        next(op for op in cuda.ops if op.kind == "causal_conv1d").kernel == "triton.causal_conv1d"
    )


def test_plan_memory_ledger(fixture_artifacts) -> None:
    opts = CompileOptions(max_concurrency=2, kv_capacity=1000, page_size=16)
    g = ASSIGN_KERNELS(CHOOSE_KV(graph(fixture_artifacts, "llama", opts), opts), opts)
    out = PLAN_MEMORY(g, opts)
    entries = {e["item"]: e["bytes"] for e in out.meta["ledger"]["entries"]}
    print(out.meta["ledger"])
    assert out.meta["kv"]["num_pages"] == 63  # ceil(1000 / 16)
    assert entries["kv_cache"] == 63 * 16 * out.meta["kv"]["bytes_per_token"]
    # llama fixture: 512x64 tied embedding + 2 layers of (q,k,v,o + gate,up,down + 2 norms) + final norm, f32
    layer = 64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 128 * 64 + 2 * 64
    assert entries["weights"] == 4 * (512 * 64 + 2 * layer + 64)
    assert entries["workspace"] > 0 and out.meta["ledger"]["total"] == sum(entries.values())


def test_plan_memory_budgets_the_nvfp4_copies(fixture_hf_dir, tmp_path, monkeypatch) -> None:
    """On cuda the nvfp4 matrices are also repacked for the batch-1 GEMV (0.5 bytes per value
    + 4 per row): a ledger item of their own where the plan fits with them; none where it would
    not (a fixed KV capacity that then no longer fits, or auto without KV for every lane at
    full context), on cpu, or with NINFER_NVFP4_MMA=0."""
    from ninfer.passes.plan_memory import NVFP4_COPIES

    path = convert_hf(fixture_hf_dir("llama"), tmp_path / "llama-nvfp4.ninfer", weights="nvfp4")

    def ledger(**kw) -> dict[str, int]:
        opts = CompileOptions(**{"device": "cuda", "max_concurrency": 2, **kw})
        g = ASSIGN_KERNELS(CHOOSE_KV(graph_for_artifact(Artifact(path), opts), opts), opts)
        return {e["item"]: e["bytes"] for e in PLAN_MEMORY(g, opts).meta["ledger"]["entries"]}

    g = graph_for_artifact(Artifact(path), CompileOptions(device="cuda"))
    mats = [w.type.shape for w in g.weights.values() if w.format == "nvfp4" and w.type.rank == 2]
    want = sum(n * k // 2 + 4 * n for n, k in mats)
    assert want > 0
    roomy = ledger(kv_capacity=256)
    assert roomy[NVFP4_COPIES] == want
    tight = roomy["weights"] + want + roomy["workspace"] + roomy["kv_cache"] - 1
    assert NVFP4_COPIES not in ledger(kv_capacity=256, device_memory=tight)
    assert NVFP4_COPIES not in ledger(kv_capacity=256, device="cpu")
    monkeypatch.setenv("NINFER_NVFP4_MMA", "0")
    assert NVFP4_COPIES not in ledger(kv_capacity=256)


def test_plan_memory_auto_and_refusal(fixture_artifacts) -> None:
    """--kv-capacity auto on cuda takes what the budget leaves, capped at what the lanes can
    use: a small model on an H200-sized budget (141 GiB) used to plan 1.4 billion tokens, which
    the engine refused at startup (kv_capacity must be in 16..1073741824)."""
    gib = 1 << 30
    opts = CompileOptions(device="cuda", kv_capacity="auto", device_memory=2 * gib)
    g = ASSIGN_KERNELS(CHOOSE_KV(graph(fixture_artifacts, "llama", opts), opts), opts)
    out = PLAN_MEMORY(g, opts)
    assert 0 < out.meta["ledger"]["total"] <= gib  # 1 GiB headroom left
    lanes = opts.max_concurrency * opts.max_context
    assert out.meta["kv"]["capacity_tokens"] == -(-lanes // opts.page_size) * opts.page_size
    for lanes_of in ((1, 8192), (8, 32768), (3, 1000)):
        h200 = CompileOptions(
            device="cuda", kv_capacity="auto", device_memory=141 * gib,
            max_concurrency=lanes_of[0], max_context=lanes_of[1],
        )  # fmt: skip
        planned = PLAN_MEMORY(g, h200).meta["kv"]
        want = -(-lanes_of[0] * lanes_of[1] // h200.page_size) * h200.page_size
        assert planned["capacity_tokens"] == want and planned["num_pages"] * h200.page_size == want
        EngineOptions.of(
            max_concurrency=lanes_of[0], max_context=lanes_of[1],
            page_size=h200.page_size, kv_capacity=want,
        )  # fmt: skip  # the engine takes the planned pool (it refused the uncapped one)
    fixed = out.meta["ledger"]["total"] - out.meta["ledger"]["entries"][2]["bytes"]  # no KV
    half = fixed + gib + lanes // 2 * out.meta["kv"]["bytes_per_token"]  # KV for half the lanes
    tight = CompileOptions(device="cuda", kv_capacity="auto", device_memory=half)
    assert PLAN_MEMORY(g, tight).meta["kv"]["capacity_tokens"] <= lanes // 2  # the budget rules
    big = CompileOptions(device="cuda", kv_capacity=10_000_000, device_memory=2 * gib)
    with pytest.raises(ConfigError, match="--kv-capacity 10000000: KV needs"):
        PLAN_MEMORY(g, big)


def test_cuda_graph_buckets(fixture_artifacts) -> None:
    g = graph(fixture_artifacts, "llama", CUDA)
    assert CUDA_GRAPHS(g, CUDA).meta["cuda_graph_buckets"] == [1, 2, 3, 4]
    off = CompileOptions(device="cuda", max_concurrency=4, cuda_graphs=False)
    assert CUDA_GRAPHS(g, off).meta["cuda_graph_buckets"] == []
    assert [p.name for p in build_pipeline(CPU)][-1] == "plan_memory"  # no buckets on cpu
    assert [p.name for p in build_pipeline(CUDA)][-1] == "cuda_graphs"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("options", [CPU, CUDA], ids=["cpu", "cuda"])
def test_pipeline_keeps_every_phase_valid(fixture_artifacts, arch, options) -> None:
    seen: list[str] = []
    g = run_passes(
        graph(fixture_artifacts, arch, options),
        options,
        verify_each=True,
        dump=lambda n, g: seen.append(n),
    )
    assert seen == [p.name for p in build_pipeline(options)]
    assert all(op.kernel for op in g.ops)
    plan = compile_artifact(Artifact(fixture_artifacts(arch)), options)
    assert plan.passes[-1] == "lower" and len(plan.calls) == len(g.ops)
