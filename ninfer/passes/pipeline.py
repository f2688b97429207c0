"""The compile pipeline, as numbered phases. Which passes run is decided once, here, from the
options (no pass switches itself on or off).

    0 verify                    check the IR the builder made
    0b shard                    this rank's part of the model (--tensor-parallel N > 1 only)
    1 fuse_qkv                  q/k/v (and DeltaNet input) projections -> one GEMM
    2 fuse_gate_up              gate/up projections (and expert gate/up) -> one GEMM + swiglu
    3 fuse_residual_norm        residual add + RMSNorm -> add_rmsnorm
    4 fuse_attention_prologue   per-head q/k RMSNorm + rotary folded into attention
    5 fuse_swiglu_linear        swiglu folded into the linear that reads it (down projection)
    6 fuse_norm_linear          RMSNorm between fp8 / nvfp4 projections run in them (cuda only)
    7 choose_kv                 KV dtype, page layout, state slots
    8 assign_kernels            a kernel per op from weight format and device
    9 plan_memory               ledger: weights, workspace, KV pages, state slots
   10 cuda_graphs               decode buckets 1..max_concurrency (cuda only)
   11 lower                     -> ninfer.ir.plan.Plan

`run_passes(..., verify_each=True)` re-verifies the graph after every phase (tests do);
`dump` receives (phase name, graph) after each phase for IR dumps. `disable` names fusion
passes to leave out (tests compare a plan with and without one; the result must not change).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from typing import Any

from ninfer.ir.graph import Graph
from ninfer.ir.models import build_graph, build_mtp_graph
from ninfer.ir.plan import Plan
from ninfer.ir.verify import verify
from ninfer.passes.assign_kernels import ASSIGN_KERNELS
from ninfer.passes.base import Pass
from ninfer.passes.choose_kv import CHOOSE_KV
from ninfer.passes.cuda_graphs import CUDA_GRAPHS
from ninfer.passes.fuse_attention_prologue import FUSE_ATTENTION_PROLOGUE
from ninfer.passes.fuse_gate_up import FUSE_GATE_UP
from ninfer.passes.fuse_norm_linear import FUSE_NORM_LINEAR
from ninfer.passes.fuse_qkv import FUSE_QKV
from ninfer.passes.fuse_residual_norm import FUSE_RESIDUAL_NORM
from ninfer.passes.fuse_swiglu_linear import FUSE_SWIGLU_LINEAR
from ninfer.passes.lower import lower
from ninfer.passes.options import CompileOptions
from ninfer.passes.plan_memory import PLAN_MEMORY
from ninfer.passes.shard import SHARD
from ninfer.passes.verify import VERIFY

# passes that only fuse (the plan computes the same function without them)
FUSIONS = (
    FUSE_QKV,
    FUSE_GATE_UP,
    FUSE_RESIDUAL_NORM,
    FUSE_ATTENTION_PROLOGUE,
    FUSE_SWIGLU_LINEAR,
    FUSE_NORM_LINEAR,
)
CUDA_ONLY = ("fuse_norm_linear",)  # fusions only the CUDA runtime has kernels for


def build_pipeline(options: CompileOptions, disable: Collection[str] = ()) -> list[Pass]:
    unknown = set(disable) - {p.name for p in FUSIONS}
    if unknown:
        raise ValueError(f"only fusion passes can be disabled, not {sorted(unknown)}")
    phases = [
        VERIFY,
        *([SHARD] if options.tensor_parallel > 1 else []),
        *(
            p
            for p in FUSIONS
            if p.name not in disable and (options.device == "cuda" or p.name not in CUDA_ONLY)
        ),
        CHOOSE_KV,
        ASSIGN_KERNELS,
        PLAN_MEMORY,
    ]
    if options.device == "cuda":
        phases.append(CUDA_GRAPHS)
    return phases


def run_passes(
    graph: Graph,
    options: CompileOptions,
    verify_each: bool = False,
    dump: Callable[[str, Graph], None] | None = None,
    disable: Collection[str] = (),
) -> Graph:
    for p in build_pipeline(options, disable):
        graph = p(graph, options)
        if verify_each:
            verify(graph)
        if dump is not None:
            dump(p.name, graph)
    return graph


def compile_graph(
    graph: Graph, options: CompileOptions, verify_each: bool = False, disable: Collection[str] = ()
) -> Plan:
    return lower(run_passes(graph, options, verify_each, disable=disable), options)


def graph_for_artifact(artifact: Any, options: CompileOptions) -> Graph:
    """The unfused graph of an `ninfer.artifact.Artifact` for the options' compute dtype."""
    tensors = {n: (i.format, tuple(i.shape)) for n, i in artifact.tensors.items()}
    g = build_graph(
        artifact.architecture,
        artifact.config,
        tensors,
        options.compute_dtype,
        options.vision,
        options.capture,
    )
    g.meta["model_name"] = artifact.name
    return g


def compile_mtp(artifact: Any, options: CompileOptions, logits: bool = True) -> Plan:
    """The plan of `artifact`'s MTP head (ir/models/mtp.py): the `--spec mtp` drafter's own
    stage, compiled with the target's options (its own KV pool of the same capacity; no
    capture). ConfigError when the artifact has no mtp component. `logits` False: the head's
    output hidden only (--lm-head-draft applies a reduced head to it). With `options.vision`
    the head reads 3-axis positions and the target's vision embeddings (ir/models/mtp.py);
    it runs no tower of its own, so its plan has no vision stage."""
    tensors = {n: (i.format, tuple(i.shape)) for n, i in artifact.tensors.items()}
    g = build_mtp_graph(
        artifact.architecture, artifact.config, tensors, options.compute_dtype, logits,
        options.vision,
    )  # fmt: skip
    g.meta["model_name"] = f"{artifact.name}-mtp"
    return compile_graph(g, dataclasses.replace(options, capture=(), vision=False))


def compile_ranks(
    artifact: Any, options: CompileOptions, disable: Collection[str] = ()
) -> list[Plan]:
    """One plan per tensor-parallel rank (`options.tensor_parallel`; `tp_rank` is ignored).

    Every rank's KV pool must hold the same pages (rank 0's scheduler hands out page ids that
    every rank writes): with `--kv-capacity auto` the ranks' budgets may leave them different
    page counts (rank 0 holds the biases, the last rank a shorter vocabulary part), so the
    plans are compiled again at the smallest count."""
    graph = graph_for_artifact(artifact, options)
    n = options.tensor_parallel

    def ranks(opts: CompileOptions) -> list[Plan]:
        return [
            compile_graph(graph, dataclasses.replace(opts, tp_rank=r), disable=disable)
            for r in range(n)
        ]

    plans = ranks(options)
    pages = {p.kv.num_pages for p in plans}
    if len(pages) > 1:
        fixed = dataclasses.replace(options, kv_capacity=min(pages) * options.page_size)
        plans = ranks(fixed)
    return plans


def compile_artifact(
    artifact: Any,
    options: CompileOptions,
    verify_each: bool = False,
    disable: Collection[str] = (),
) -> Plan:
    """Artifact -> Plan. Raises ConfigError for impossible options, ArtifactError for a model
    the builders cannot read. `disable`: fusion pass names to leave out."""
    return compile_graph(graph_for_artifact(artifact, options), options, verify_each, disable)
