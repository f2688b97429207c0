"""The shard pass (tensor parallelism), printed before and after on the fixture graphs (run with
-s to see the dumps): which weights each rank keeps a part of, the per-rank attrs and caches,
the collectives it inserts, what it refuses, and what the plans of all ranks add up to."""

from __future__ import annotations

import pytest

from ninfer.artifact import Artifact
from ninfer.errors import ConfigError
from ninfer.ir import Graph, print_graph, verify
from ninfer.ir.graph import Shard
from ninfer.ir.plan import Plan
from ninfer.passes.options import CompileOptions
from ninfer.passes.pipeline import (
    compile_artifact,
    compile_ranks,
    graph_for_artifact,
    run_passes,
)
from ninfer.passes.shard import SHARD

ARCHS = ("llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe")


def tp(n: int = 2, rank: int = 0, **kw) -> CompileOptions:
    return CompileOptions(tensor_parallel=n, tp_rank=rank, **kw)


def sharded(fixture_artifacts, arch: str, options: CompileOptions) -> tuple[Graph, Graph, str]:
    g = graph_for_artifact(Artifact(fixture_artifacts(arch)), options)
    out = verify(SHARD(g, options))
    before, after = print_graph(g), print_graph(out)
    print(f"--- before shard\n{before}--- after shard (rank {options.tp_rank})\n{after}")
    return g, out, after


def test_attention_and_mlp_split_by_heads_and_columns(fixture_artifacts) -> None:
    g, out, text = sharded(fixture_artifacts, "qwen3", tp(rank=1))
    p = "weight @model.layers.0"
    assert f"{p}.self_attn.q_proj.weight: f32[32,64] f32 plain shard dim=0 1/2" in text
    assert f"{p}.self_attn.k_proj.weight: f32[16,64] f32 plain shard dim=0 1/2" in text
    assert f"{p}.self_attn.o_proj.weight: f32[64,32] f32 plain shard dim=1 1/2" in text
    assert f"{p}.mlp.down_proj.weight: f32[64,64] f32 plain shard dim=1 1/2" in text
    assert f"{p}.self_attn.q_norm.weight: f32[16] f32 plain\n" in text  # per head_dim
    assert "heads=2, kv_heads=1, layer=0" in text  # 4 heads / 2 KV heads over 2 ranks
    assert "%L0.attn_out.reduced = all_reduce(%L0.attn_out) {parts=2} : f32[T,64]" in text
    assert "%L0.x_mid = add(%x, %L0.attn_out.reduced)" in text
    assert "%L0.x_out = add(%L0.x_mid, %L0.mlp_out.reduced)" in text
    # the tied embedding stays whole for `embed`; the head reads this rank's vocabulary rows
    assert "weight @model.embed_tokens.weight: f32[512,64] f32 plain\n" in text
    assert "%logits.part = logits(%h_final, @model.embed_tokens.vocab_part.weight)" in text
    assert "%logits = all_gather(%logits.part) {parts=2, size=512} : f32[R,512]" in text
    assert (
        out.meta["caches"]["kv.L0"]["kv_heads"] == 1 and g.meta["caches"]["kv.L0"]["kv_heads"] == 2
    )
    assert [op.kind for op in out.ops].count("all_reduce") == 2 * 2  # a mixer and an FFN per layer
    assert out.meta["parallel"] == {"world": 2, "rank": 1, "all_reduce": 4, "all_gather": 1}


def test_deltanet_heads_and_moe_experts(fixture_artifacts) -> None:
    _, out, text = sharded(fixture_artifacts, "qwen3_5_moe", tp(rank=1))
    p = "weight @model.layers.0"
    # q | k | v of the DeltaNet input projection and conv each halved: [32, 32, 64] -> 64 rows
    assert (
        f"{p}.linear_attn.in_proj_qkv.weight: f32[64,64] f32 plain shard dim=0 1/2 segments=[32, 32, 64]"
        in text
    )
    assert (
        f"{p}.linear_attn.conv1d.weight: f32[64,1,4] f32 plain shard dim=0 1/2 segments=[32, 32, 64]"
        in text
    )
    assert "%L0.lq, %L0.lk, %L0.lv = split(%L0.qkv_conv) {sizes=[16,16,32]}" in text
    assert "k_dim=16, k_heads=1, layer=0, v_dim=16, v_heads=2" in text
    assert out.meta["caches"]["state.L0"]["conv_dim"] == 64
    # every expert's intermediate size split; router and shared-expert gate whole
    assert f"{p}.mlp.experts.gate_proj.weight: f32[8,16,64] f32 stack(8) shard dim=0 1/2" in text
    assert f"{p}.mlp.experts.down_proj.weight: f32[8,64,16] f32 stack(8) shard dim=1 1/2" in text
    assert "{experts=8, inter=16}" in text
    assert f"{p}.mlp.gate.weight: f32[8,64] f32 plain\n" in text
    assert f"{p}.mlp.shared_expert_gate.weight: f32[1,64] f32 plain\n" in text
    assert "%L0.moe_out.reduced = all_reduce(%L0.moe_out)" in text  # one per MoE block


def test_a_row_parallel_bias_is_added_once(fixture_artifacts) -> None:
    """qwen2's q/k/v biases are split with their rows; a row-parallel bias (none in the
    fixtures: checked on a graph given one) stays on rank 0 only."""
    text = sharded(fixture_artifacts, "qwen2", tp(rank=1))[2]
    assert "weight @model.layers.0.self_attn.q_proj.bias: f32[32] f32 plain shard dim=0 1/2" in text
    g = graph_for_artifact(Artifact(fixture_artifacts("qwen2")), tp())
    o_proj = next(op for op in g.ops if op.attrs.get("proj") == "o")
    o_proj.inputs = (*o_proj.inputs, "model.layers.0.input_layernorm.weight")  # any [hidden]
    for rank, inputs in ((0, 3), (1, 2)):
        ops = SHARD(g, tp(rank=rank)).ops
        assert len(next(op for op in ops if op.outputs == o_proj.outputs).inputs) == inputs


@pytest.mark.parametrize(
    ("arch", "n", "message"),
    [
        ("llama", 4, "--tensor-parallel 4: the model has 4 attention heads and 2 KV heads; both must be divisible by 4"),
        ("qwen3_5", 4, "--tensor-parallel 4: the model has 2 Gated DeltaNet key heads and 4 value heads"),
    ],
)  # fmt: skip
def test_heads_not_divisible_are_refused(arch, n, message, fixture_artifacts) -> None:
    with pytest.raises(ConfigError, match=message):
        compile_artifact(Artifact(fixture_artifacts(arch)), tp(n))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"tensor_parallel": 0}, "--tensor-parallel must be in 1..64, got 0"),
        ({"tensor_parallel": 3}, "--tensor-parallel must be a power of two"),
        ({"tensor_parallel": 2, "tp_rank": 2}, "--tp-rank must be in 0..1, got 2"),
    ],
)
def test_options_are_validated(kw, message) -> None:
    with pytest.raises(ConfigError, match=message):
        CompileOptions(**kw)


def test_shards_cover_every_row_once() -> None:
    for length, shard in ((10, Shard(0, 0, 4)), (12, Shard(0, 0, 2, (4, 4, 4)))):
        kept = [[i for r in Shard(0, k, shard.parts, shard.segments).ranges(length) for i in r]
                for k in range(shard.parts)]  # fmt: skip
        assert sorted(i for part in kept for i in part) == list(range(length))
    assert [Shard(0, k, 4).size(10) for k in range(4)] == [3, 3, 3, 1]  # vocab: last is short
    assert Shard(0, 1, 2, (4, 4, 4)).ranges(12) == [range(2, 4), range(6, 8), range(10, 12)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_phase_stays_valid_and_ranks_add_up(arch, device, fixture_artifacts) -> None:
    artifact = Artifact(fixture_artifacts(arch))
    opts = tp(device=device, max_concurrency=2)
    run_passes(graph_for_artifact(artifact, opts), opts, verify_each=True)
    whole = compile_artifact(artifact, CompileOptions(device=device, max_concurrency=2))
    plans = compile_ranks(artifact, opts)
    assert [p.parallel.rank for p in plans] == [0, 1]
    assert all(Plan.from_json(p.to_json()) == p for p in plans)
    # each rank holds half the KV (and recurrent state) of the whole model per token
    assert all(2 * p.kv.bytes_per_token == whole.kv.bytes_per_token for p in plans)
    assert all(2 * p.state.bytes_per_slot == whole.state.bytes_per_slot for p in plans)
    assert all(p.ledger.bytes_of("weights") < whole.ledger.bytes_of("weights") for p in plans)


def test_kv_capacity_auto_is_sized_per_rank(fixture_artifacts) -> None:
    """With a fixed memory budget, `--kv-capacity auto` gives each rank about twice the pages
    (half the KV heads per token), the same on every rank."""
    artifact = Artifact(fixture_artifacts("qwen3"))
    opts = {"kv_capacity": "auto", "device_memory": (1 << 30) + (48 << 20), "max_concurrency": 8,
            "max_context": 1 << 20}  # fmt: skip
    whole = compile_artifact(artifact, CompileOptions(**opts))
    plans = compile_ranks(artifact, tp(**opts))
    assert len({p.kv.num_pages for p in plans}) == 1
    assert plans[0].kv.num_pages > 1.9 * whole.kv.num_pages
    assert all(p.ledger.total <= p.ledger.budget for p in plans)
