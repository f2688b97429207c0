"""Plan memory into a ledger: weights, workspace, KV pages, recurrent-state slots.

    weights     resident bytes of every weight as the device keeps it (cpu: dequantised to the
                compute dtype, except the GGUF weights only `cpu.*` kernels read, kept in the
                forms those read: int4 codes + bf16 scale/zero, f16 copy, raw blocks; cuda:
                fp8/nvfp4 kept packed with their scales, the rest in bf16)
    nvfp4_copies  cuda: the nvfp4 matrices again, repacked for the batch-1 tensor-core GEMV
                (kernels/nvfp4_mma.py), where the plan fits with them (--kv-capacity auto: with
                KV for max_concurrency x max_context tokens left); absent otherwise
    workspace   peak bytes of live activations over one step of `step_tokens` tokens
                (values freed after their last use, in op order); with a vision tower, the
                larger of that and one run of the vision stage on the largest item
                (`vision_tokens` merged tokens), which runs apart from the step
    kv_cache    num_pages * bytes_per_page; num_pages covers --kv-capacity tokens
                (N; auto = what the budget leaves after the rest and 1 GiB headroom, capped
                at what the lanes can use, max_concurrency * max_context rounded up to pages;
                omitted = max_context)
    state       state_slots * bytes_per_slot (hybrid models)

A plan that does not fit `options.memory_budget` is refused with a one-line ConfigError.
"""

from __future__ import annotations

import os
from typing import Any

from ninfer.errors import ConfigError
from ninfer.ir.graph import Graph, Weight
from ninfer.ir.types import DTYPE_BYTES
from ninfer.passes.assign_kernels import CPU_PACKED_LOGITS, CPU_PACKED_ROWS
from ninfer.passes.base import Pass
from ninfer.passes.options import GIB, HEADROOM, CompileOptions

NVFP4_COPIES = "nvfp4_copies"  # the ledger item (present only where the copies are budgeted)
MMA_COPY_ENV = "NINFER_NVFP4_MMA"  # "0": the plan budgets (so the CUDA runtime makes) no copies


def copy_enabled() -> bool:
    return os.environ.get(MMA_COPY_ENV, "1") != "0"


def copy_bytes(n: int, k: int) -> int:
    """Device bytes of the repacked copy (kernels/nvfp4_mma.py) of an [n, k] nvfp4 weight:
    0.5 per value + a 4-byte row scale; 0 where none is made (k % 32 != 0)."""
    return n * k // 2 + 4 * n if k % 32 == 0 else 0


def _numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def weight_bytes(w: Weight, options: CompileOptions, dtype: str) -> int:
    """Bytes the device holds for weight `w` once loaded."""
    n = _numel(w.type.shape)
    if options.device == "cuda" and w.type.rank >= 2:
        rows = n // w.type.shape[-1]
        segments = len(w.sources)
        if w.format == "fp8":
            return n + 4 * rows
        if w.format == "nvfp4":
            return n // 2 + n // 16 + 4 * segments
    return n * DTYPE_BYTES[dtype]


def cpu_packed_bytes(w: Weight, kernels: set[str]) -> int | None:
    """Bytes of a GGUF weight only `cpu.*` kernels read (kernels/cpu_quant.PackedWeight), or
    None when it is held dense: int4 codes (two planes for Q8_0) and bf16 [scale, zero] per
    32 values and output row (rows padded to 16) for a GEMM, f16 for the lm_head, the raw
    blocks for the embedding."""
    if not kernels or not all(k.startswith("cpu.") for k in kernels):
        return None
    if w.layout not in ("plain", "concat") or w.type.rank != 2:
        return None
    n, k = w.type.shape
    out = 0
    if any(k_.endswith("_int4pack") for k_ in kernels):
        planes = 2 if w.format == "gguf:Q8_0" else 1
        rows = n + (-n % 16)
        out += rows * k * planes // 2 + rows * (k * planes // 32) * 4
    if CPU_PACKED_LOGITS in kernels:
        out += n * k * 2
    if CPU_PACKED_ROWS in kernels:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[(w.format or "").split(":")[1]]]
        out += n * (k // block) * size
    return out


def nvfp4_copy_bytes(g: Graph, options: CompileOptions) -> int:
    """Bytes of the repacked copies the CUDA runtime can keep of the 2-D nvfp4 weights for its
    batch-1 GEMV (kernels/nvfp4_mma.py); 0 on cpu or with NINFER_NVFP4_MMA=0."""
    ws = [w for w in g.weights.values() if w.format == "nvfp4" and w.type.rank == 2]
    if options.device != "cuda" or not ws:
        return 0
    return sum(copy_bytes(*w.type.shape) for w in ws) if copy_enabled() else 0


def workspace_bytes(g: Graph, bindings: dict[str, int], stage: str | None = None) -> int:
    """Peak bytes of live op outputs of the ops of `stage` (attrs["stage"]; None: the step's
    ops), freeing each value after its last reader."""
    ops = [op for op in g.ops if op.attrs.get("stage") == stage]
    last_use: dict[str, int] = {}
    for i, op in enumerate(ops):
        for name in op.inputs:
            last_use[name] = i
    for name in g.outputs:
        last_use[name] = len(ops)
    live: dict[str, int] = {}
    peak = 0
    for i, op in enumerate(ops):
        for name in op.outputs:
            live[name] = g.values[name].nbytes(bindings)
        peak = max(peak, sum(live.values()))
        for name in op.inputs:
            if last_use.get(name) == i:
                live.pop(name, None)
        for name in op.outputs:
            if name not in last_use:
                live.pop(name, None)
    return peak


def gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _run(graph: Graph, options: CompileOptions) -> Graph:
    g = graph.copy()
    dtype = g.meta["dtype"]
    kv, state = g.meta["kv"], g.meta["state"]
    readers: dict[str, set[str]] = {}
    for op in g.ops:
        for name in op.inputs:
            readers.setdefault(name, set()).add(op.kernel or "")
    weights = 0
    for w in g.weights.values():
        packed = cpu_packed_bytes(w, readers.get(w.name, set()))
        weights += weight_bytes(w, options, dtype) if packed is None else packed
    step = {"T": options.step_tokens, "R": options.max_concurrency, "M": options.step_tokens}
    workspace = workspace_bytes(g, step)
    detail = f"peak live activations at T={options.step_tokens}"
    vision = g.meta.get("vision")
    if vision is not None:  # encoded before the step that needs it, freed before it runs
        n = options.vision_tokens
        encode = workspace_bytes(g, {"P": n * vision["merge_size"] ** 2, "N": n}, "vision")
        detail = (
            f"the larger of {workspace:,} B (step at T={options.step_tokens}) and {encode:,} B "
            f"(vision encode of a {n}-token item)"
        )
        workspace = max(workspace, encode)
    state_total = state["slots"] * state["bytes_per_slot"]
    budget = options.memory_budget
    per_token, page = kv["bytes_per_token"], options.page_size
    lane_tokens = options.max_concurrency * options.max_context
    # nvfp4 copies for the batch-1 GEMV: kept where the plan still fits with them (with auto,
    # with KV for every lane at full context left over); the runtime makes them iff budgeted
    copies = nvfp4_copy_bytes(g, options)
    if copies:
        room = budget - weights - copies - workspace - state_total
        if options.kv_capacity == "auto":
            need = HEADROOM + per_token * lane_tokens
        else:
            cap = options.max_context if options.kv_capacity is None else int(options.kv_capacity)
            need = -(-cap // page) * kv["bytes_per_page"]
        if room < need:
            copies = 0
    fixed = weights + copies + workspace + state_total
    if fixed > budget:  # before any KV: name what takes the memory
        raise ConfigError(
            f"the plan needs {gib(fixed)} before any KV (weights {gib(weights + copies)}, "
            f"workspace {gib(workspace)} for {options.step_tokens}-token steps, state "
            f"{gib(state_total)}) but the budget is {gib(budget)}; lower --prefill-chunk or "
            "--max-concurrency"
        )
    if options.kv_capacity == "auto":
        free = budget - HEADROOM - fixed
        if per_token == 0:
            tokens = lane_tokens
        else:
            if free < per_token * page:
                raise ConfigError(
                    f"--kv-capacity auto: no memory left for KV ({gib(fixed)} of weights, workspace and state, "
                    f"budget {gib(budget)})"
                )
            # capped at what the lanes can hold: a small model on a large GPU would otherwise
            # ask for more tokens than any engine addresses (and pages nothing can use)
            tokens = min(free // per_token // page * page, -(-lane_tokens // page) * page)
    else:
        tokens = options.max_context if options.kv_capacity is None else int(options.kv_capacity)
    num_pages = -(-tokens // page)
    kv_total = num_pages * kv["bytes_per_page"]
    total = fixed + kv_total
    if total > budget:
        flag = "--max-context" if options.kv_capacity is None else "--kv-capacity"
        raise ConfigError(
            f"{flag} {tokens}: KV needs {gib(kv_total)} but only {gib(max(budget - fixed, 0))} of the "
            f"{gib(budget)} budget remain after weights, workspace and state; lower it or use --kv-capacity auto"
        )
    kv["capacity_tokens"] = num_pages * page
    kv["num_pages"] = num_pages
    entries: list[dict[str, Any]] = [
        {"item": "weights", "bytes": weights, "detail": f"{len(g.weights)} tensors"},
        {
            "item": "workspace",
            "bytes": workspace,
            "detail": detail,
        },
        {
            "item": "kv_cache",
            "bytes": kv_total,
            "detail": f"{num_pages} pages x {kv['bytes_per_page']} B ({kv['dtype']})",
        },
        {
            "item": "state_slots",
            "bytes": state_total,
            "detail": f"{state['slots']} slots x {state['bytes_per_slot']} B",
        },
    ]
    if copies:
        entries.insert(1, {"item": NVFP4_COPIES, "bytes": copies,
                           "detail": "nvfp4 weights repacked for the batch-1 GEMV"})  # fmt: skip
    g.meta["ledger"] = {"entries": entries, "total": total, "budget": budget}
    return g


PLAN_MEMORY = Pass(
    "plan_memory", _run, "weights, workspace, KV pages and state slots into a ledger"
)
