"""Assign a kernel to every op from its kind, the storage format of its weight and the device.

cpu: torch reference ops (`torch.<kind>`); quantised weights are dequantised to the compute
dtype when loaded, so one `torch.linear` serves every format, except GGUF Q4_0 / Q4_1 / Q8_0
weights with `cpu_weights="packed"` (the default): their GEMMs run packed (`cpu.q4_1_int4pack`
...), an lm_head in f16 (`cpu.logits_f16`) and an embedding dequantises only the rows it reads
(`cpu.gguf_rows`), see kernels/cpu_quant.py. cuda: Triton kernels where one is
(or will be) written, cuBLAS for dense bf16 GEMMs, small torch ops for cheap elementwise work.
Attention and the delta rule name a prefill kernel and a decode kernel (`decode_kernel`).
An attention with a folded prologue (fuse_attention_prologue) names the prologue first:
`triton.attention_prologue+paged_attention_decode` (q/k norm, rotary and the KV write in one
kernel), or, for KV formats that kernel does not write (nvfp4, k8v4), the unfused launches
`triton.rmsnorm+rotary+kv_write+paged_attention_decode`.
The plan says which kernel it *would* use even before that kernel exists.
"""

from __future__ import annotations

from ninfer.ir.graph import Graph, Op
from ninfer.passes.base import Pass
from ninfer.passes.options import CompileOptions

VIEW_OPS = ("split", "split_gated_q")

CUDA_KERNELS = {
    "embed": "torch.embedding",
    "rmsnorm": "triton.rmsnorm",
    "add_rmsnorm": "triton.rmsnorm_residual",
    "add": "torch.add",
    "rotary": "triton.rotary",
    "attention": "triton.paged_attention_prefill",
    "sigmoid_mul": "torch.sigmoid_mul",
    "silu_mul": "triton.silu_mul",
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
CUDA_DECODE_KERNELS = {
    "attention": "triton.paged_attention_decode",
    "gated_delta_rule": "triton.gdn_recurrent_decode",
}
# KV dtypes kernels/attn_prologue.py writes (others keep the unfused prologue)
PROLOGUE_KV_DTYPES = ("f32", "bf16", "f16", "int8", "fp8")
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


def _weight_format(g: Graph, op: Op) -> str | None:
    for name in op.inputs:
        if name in g.weights and g.weights[name].type.rank >= 2:
            return g.weights[name].format
    return None


def _cuda(g: Graph, op: Op) -> str:
    if op.kind in ("linear", "logits"):
        return CUDA_GEMMS.get(_weight_format(g, op) or "", "cublas.gemm")
    return CUDA_KERNELS[op.kind]


def _cpu(g: Graph, op: Op, options: CompileOptions) -> str:
    fmt = _weight_format(g, op)
    if options.cpu_weights == "packed" and fmt in CPU_PACKED_GEMMS:
        if op.kind == "linear":
            return CPU_PACKED_GEMMS[fmt]
        if op.kind == "logits":
            return CPU_PACKED_LOGITS
        if op.kind == "embed":
            return CPU_PACKED_ROWS
    return f"torch.{op.kind}"


def _attention_prologue(op: Op) -> str:
    """Kernel-name prefix of an attention's folded prologue ("" when none is folded)."""
    prologue = op.attrs.get("prologue")
    if not prologue:
        return ""
    if op.attrs.get("kv_dtype") in PROLOGUE_KV_DTYPES:
        return "triton.attention_prologue+"
    norm = "rmsnorm+" if prologue == "qk_norm+rotary" else ""
    return f"triton.{norm}rotary+kv_write+"


def _run(graph: Graph, options: CompileOptions) -> Graph:
    g = graph.copy()
    for op in g.ops:
        fmt = _weight_format(g, op)
        if op.kind in VIEW_OPS:
            op.kernel = "view.split"
        elif options.device == "cpu":
            op.kernel = _cpu(g, op, options)
        else:
            op.kernel = _cuda(g, op)
            if op.kind in CUDA_DECODE_KERNELS:
                op.attrs["decode_kernel"] = CUDA_DECODE_KERNELS[op.kind]
            if op.kind == "attention" and (prefix := _attention_prologue(op)):
                decode = op.attrs["decode_kernel"]
                op.kernel = prefix + op.kernel.removeprefix("triton.")
                op.attrs["decode_kernel"] = prefix + decode.removeprefix("triton.")
        if fmt is not None and op.kind in ("linear", "logits", "moe_experts", "moe_experts_gu"):
            op.attrs["weight_format"] = fmt
    g.meta["kernels_assigned"] = True
    return g


ASSIGN_KERNELS = Pass("assign_kernels", _run, "one kernel per op from weight format and device")
