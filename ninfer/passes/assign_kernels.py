"""Assign a kernel to every op from its kind, the storage format of its weight and the device.

cpu: torch reference ops (`torch.<kind>`); quantised weights are dequantised to the compute
dtype when loaded, so one `torch.linear` serves every format, except GGUF Q4_0 / Q4_1 / Q8_0
weights with `cpu_weights="packed"` (the default): their GEMMs run packed (`cpu.q4_1_int4pack`
...), an lm_head in f16 (`cpu.logits_f16`) and an embedding dequantises only the rows it reads
(`cpu.gguf_rows`), see kernels/cpu_quant.py. cuda: Triton kernels where one is
(or will be) written, cuBLAS for dense bf16 GEMMs, small torch ops for cheap elementwise work.
A dense GEMM also carries `launch`: the Triton GEMV / tile kernels and launch shapes that run
it for few rows of x (decode batches), from the measured tables (ninfer/passes/gemm_launch.py).
Attention and the delta rule name a prefill kernel and a decode kernel (`decode_kernel`).
A --vision plan on cuda names torch implementations for the vision tower's ops and for the
text rotary over 3-axis positions (`torch.<op>`, `torch.rotary_mrope`); its GEMMs run cuBLAS.
An attention with a folded prologue (fuse_attention_prologue) names the prologue first:
`triton.attention_prologue+paged_attention_decode` (q/k norm, rotary and the KV write in one
kernel), or, for KV formats that kernel does not write (nvfp4, k8v4), the unfused launches
`triton.rmsnorm+rotary+kv_write+paged_attention_decode`.
Every name is one the executors' kernel registries implement (ninfer/runtime/executors/kernel_registry.py:
an executor refuses a plan naming another, and runs each call by the name the plan gives it).
"""

from __future__ import annotations

from ninfer.ir.graph import Graph, Op
from ninfer.ir.kv_formats import prologue_fuses
from ninfer.ir.ops import COLLECTIVE_OPS, VIEW_OPS
from ninfer.ir.ops_vision import VISION_SIGNATURES
from ninfer.passes.base import Pass
from ninfer.passes.gemm_launch import CUBLAS, dense_launches
from ninfer.passes.options import CompileOptions

CUDA_KERNELS = {
    "embed": "torch.embedding",
    "rmsnorm": "triton.rmsnorm",
    "add_rmsnorm": "triton.rmsnorm_residual",
    "add": "torch.add",
    "rotary": "triton.rotary",
    "attention": "triton.paged_attention_prefill",
    "sigmoid_mul": "torch.sigmoid_mul",
    "silu_mul": "torch.silu_mul",  # separate gate and up inputs (fuse_gate_up makes swiglu)
    "swiglu": "triton.silu_mul",
    "moe_router": "torch.moe_router",
    "moe_experts": "triton.moe_gemm",
    "moe_experts_gu": "triton.moe_gemm",
    "causal_conv1d": "triton.causal_conv1d",
    "gdn_gates": "triton.gdn_gates",
    "gated_delta_rule": "triton.gdn_recurrent_prefill",  # fla chunked from 256 tokens, if installed
    "gated_rmsnorm": "triton.rmsnorm_gated",
    "select_rows": "torch.index_select",
}
# the vision tower's ops and media_merge (--vision) on cuda: torch implementations
# (ninfer/runtime/executors/vision/cuda_ops.py), run eagerly once per image / video (media_merge in the step)
VISION_CUDA_KERNELS = {sig.kind: f"torch.{sig.kind}" for sig in VISION_SIGNATURES}
# the text rotary over 3-axis positions [3, T] (MRoPE): torch; kernels.rotary and the one-launch
# attention prologue take positions [T] (fuse_attention_prologue leaves it unfolded on cuda)
CUDA_ROTARY_MROPE = "torch.rotary_mrope"
CUDA_DECODE_KERNELS = {
    "attention": "triton.paged_attention_decode",
    "gated_delta_rule": "triton.gdn_recurrent_decode",
}
# cpu, cpu_weights="packed": GEMM by GGUF block format, and the embedding lookup of one
CPU_PACKED_GEMMS = {
    "gguf:Q4_0": "cpu.q4_0_int4pack",
    "gguf:Q4_1": "cpu.q4_1_int4pack",
    "gguf:Q8_0": "cpu.q8_0_int4pack",
}
CPU_PACKED_ROWS = "cpu.gguf_rows"
# the lm_head of such a weight: f16, not int4 (whose bf16 result is too coarse for logits)
CPU_PACKED_LOGITS = "cpu.logits_f16"
# GEMM by weight storage format on cuda. GGUF blocks and f32 are converted to bf16 at load.
CUDA_GEMMS = {"fp8": "triton.gemm_fp8", "nvfp4": "triton.gemm_nvfp4"}
CUBLAS_GEMM = CUBLAS  # dense GEMMs: cuBLAS past the rows of their `launch` attr


def cpu_kernel(kind: str) -> str:
    """The cpu kernel of an op kind: its torch reference, or the view of a split."""
    return "view.split" if kind in VIEW_OPS else f"torch.{kind}"


def collective_kernel(kind: str) -> str:
    """The kernel of a collective op (ninfer/parallel/collectives.py), on either device."""
    return f"dist.{kind}"


def attention_kernel(prologue: str, fused: bool, decode: bool) -> str:
    """A cuda attention's kernel name: the folded prologue's launches (none, the one-launch
    kernel when `fused`, else the unfused norm / rotary / KV write) + the paged attention."""
    base = CUDA_DECODE_KERNELS["attention"] if decode else CUDA_KERNELS["attention"]
    if not prologue:
        return base
    if fused:
        head = "triton.attention_prologue+"
    else:
        head = (
            "triton.rmsnorm+rotary+kv_write+"
            if prologue == "qk_norm+rotary"
            else "triton.rotary+kv_write+"
        )
    return head + base.removeprefix("triton.")


def _weight_format(g: Graph, op: Op) -> str | None:
    for name in op.inputs:
        if name in g.weights and g.weights[name].type.rank >= 2:
            return g.weights[name].format
    return None


def _cuda(g: Graph, op: Op) -> str:
    if op.kind in ("linear", "logits"):
        return CUDA_GEMMS.get(_weight_format(g, op) or "", CUBLAS_GEMM)
    if op.kind == "rotary" and "mrope_axes" in op.attrs["rope"]:
        return CUDA_ROTARY_MROPE
    if op.kind in VISION_CUDA_KERNELS:
        return VISION_CUDA_KERNELS[op.kind]
    return CUDA_KERNELS[op.kind]


def _dense_launches(g: Graph, op: Op) -> list:
    """gemm_launch.dense_launches for a cuda GEMM's weight [N, K] (rows of x decide)."""
    (n, k) = next(g.weights[i].type.shape for i in op.inputs if i in g.weights)
    return dense_launches(n, k, op.attrs.get("act") == "swiglu")


def _sharded(g: Graph, op: Op) -> bool:
    return any(g.weights[n].shards for n in op.inputs if n in g.weights)


def _cpu(g: Graph, op: Op, options: CompileOptions) -> str:
    fmt = _weight_format(g, op)
    # a rank's part of a GGUF weight is dequantised at load (blocks do not split along K)
    if options.cpu_weights == "packed" and fmt in CPU_PACKED_GEMMS and not _sharded(g, op):
        if op.kind == "linear":
            return CPU_PACKED_GEMMS[fmt]
        if op.kind == "logits":
            return CPU_PACKED_LOGITS
        if op.kind == "embed":
            return CPU_PACKED_ROWS
    return cpu_kernel(op.kind)


def _run(graph: Graph, options: CompileOptions) -> Graph:
    g = graph.copy()
    for op in g.ops:
        fmt = _weight_format(g, op)
        if op.kind in VIEW_OPS:
            op.kernel = cpu_kernel(op.kind)
        elif op.kind in COLLECTIVE_OPS:  # the process group's backend: gloo on cpu, nccl on cuda
            op.kernel = collective_kernel(op.kind)
        elif options.device == "cpu":
            op.kernel = _cpu(g, op, options)
        elif op.kind == "attention":
            prologue = op.attrs.get("prologue", "")
            fused = prologue_fuses(op.attrs["kv_dtype"])
            op.kernel = attention_kernel(prologue, fused, decode=False)
            op.attrs["decode_kernel"] = attention_kernel(prologue, fused, decode=True)
        else:
            op.kernel = _cuda(g, op)
            if op.kind in CUDA_DECODE_KERNELS:
                op.attrs["decode_kernel"] = CUDA_DECODE_KERNELS[op.kind]
            vision = op.attrs.get("stage") == "vision"  # whole items: no decode-sized rows
            if op.kernel == CUBLAS_GEMM and not vision and (launches := _dense_launches(g, op)):
                op.attrs["launch"] = launches
        if fmt is not None and op.kind in ("linear", "logits", "moe_experts", "moe_experts_gu"):
            op.attrs["weight_format"] = fmt
    g.meta["kernels_assigned"] = True
    return g


ASSIGN_KERNELS = Pass("assign_kernels", _run, "one kernel per op from weight format and device")
