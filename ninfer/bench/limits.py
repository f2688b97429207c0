"""The hardware limits a benchmark is quoted against, and the work model of a plan.

Ceilings, measured on the device in the same run:
    copy_bytes_per_s   device-to-device copy, bytes read + bytes written per second
                       (the streaming rate a decode step that reads its weights can reach)
    matmul_flops_per_s matmul of random [n, n] x [n, n] in the plan's compute dtype (bf16 on a
                       GPU, n 8192; float32 on the CPU reference path, n 1024), 2 n^3 / s

Work of a plan:
    decode_bytes(b, ctx)    bytes one decode step of b rows reads: every weight once (only the
                            b embedding rows; for MoE the expected share of experts touched by
                            b·top_k picks), the KV of b sequences of ctx tokens, and the
                            recurrent state of b lanes (read and written)
    prefill_flops(T)        2 · active matmul parameters · T (the head only for the last row)
                            + causal attention 2 · 2 · T²/2 · heads · head_dim per layer

    limit tok/s at batch b = b / (decode_bytes / copy_bytes_per_s)
    ratio = measured / limit
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import torch

from ninfer.ir.plan import Plan

_SHAPE = re.compile(r"\[([^\]]*)\]")


@dataclass(frozen=True)
class Ceilings:
    copy_bytes_per_s: float
    matmul_flops_per_s: float
    device: str
    matmul_dtype: str = "bfloat16"  # the dtype the matmul rate was measured in


def _time(fn, device: torch.device, reps: int) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps
    # on the CPU the fastest repetition: a ceiling is what the device can do, and a shared
    # machine's other work only ever slows a repetition down
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


@torch.inference_mode()
def measure_ceilings(device: str | torch.device, dtype: str | None = None) -> Ceilings:
    """Copy bandwidth and matmul rate of `device`, the matmul in `dtype`: the compute dtype the
    plan runs in (default: bfloat16 on a GPU, float32 on the CPU, as the compiler's defaults).
    A few seconds on a GPU. On the CPU the matmul is float32 (bf16 matmuls there run an
    emulation far below what float32 prefill reaches, and a ratio against them read 1256%)."""
    dev = torch.device(device)
    gpu = dev.type == "cuda"
    # a plan names its dtype as the IR does (f32, bf16, f16); the command line as torch does
    dtype = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}.get(dtype or "", dtype)
    dtype = dtype or ("bfloat16" if gpu else "float32")
    torch_dtype = getattr(torch, dtype)
    n_bytes = (4 << 30) if gpu else (64 << 20)
    bufs = [torch.empty(n_bytes // 2, dtype=torch.bfloat16, device=dev).normal_()]
    bufs.append(torch.empty_like(bufs[0]))
    copy_s = _time(lambda: bufs[1].copy_(bufs[0]), dev, 20 if gpu else 8)
    bufs.clear()
    n = 8192 if gpu else 1024
    a = torch.randn(n, n, device=dev, dtype=torch_dtype)
    b = torch.randn(n, n, device=dev, dtype=torch_dtype)
    mm_s = _time(lambda: a @ b, dev, 20 if gpu else 8)
    name = torch.cuda.get_device_name(dev) if gpu else "cpu"
    return Ceilings(2 * n_bytes / copy_s, 2 * n**3 / mm_s, name, dtype)


def _shape(type_text: str) -> list[int]:
    m = _SHAPE.search(type_text)
    return [int(d) for d in m.group(1).split(",")] if m else []


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@dataclass(frozen=True)
class WorkModel:
    """Per-plan constants of the decode-bytes and prefill-FLOPs formulas (module docstring)."""

    dense_weight_bytes: int  # weights read whole every step (embedding table excluded)
    expert_weight_bytes: int  # routed-expert weights (all experts)
    num_experts: int
    top_k: int
    embed_row_bytes: int
    kv_bytes_per_token: int
    state_bytes_per_lane: int
    active_params: int  # matmul parameters one token multiplies (routed experts: top_k of E)
    head_params: int  # the logits GEMM (applied to one row per prefill)
    attn_layers: int
    heads: int
    head_dim: int

    def decode_bytes(self, batch: int, context: int) -> int:
        touched = 1.0
        if self.num_experts:
            touched = 1.0 - (1.0 - self.top_k / self.num_experts) ** batch
        return int(
            self.dense_weight_bytes + touched * self.expert_weight_bytes + batch * self.embed_row_bytes
            + batch * context * self.kv_bytes_per_token + 2 * batch * self.state_bytes_per_lane
        )  # fmt: skip

    def prefill_flops(self, tokens: int) -> float:
        body = 2.0 * (self.active_params - self.head_params) * tokens + 2.0 * self.head_params
        attn = 4.0 * (tokens * tokens / 2.0) * self.heads * self.head_dim * self.attn_layers
        return body + attn


def work_model(plan: Plan, weight_bytes: dict[str, int]) -> WorkModel:
    """The work model of `plan`; weight_bytes: name -> bytes the device holds for it."""
    dense = expert = embed_row = active = head = 0
    experts = top_k = 0
    heads = head_dim = attn_layers = 0
    embed_names = {c.inputs[1] for c in plan.calls if c.op == "embed"}
    for name in embed_names:
        shape = _shape(plan.buffers[name].type)
        embed_row = weight_bytes.get(name, 0) // max(shape[0], 1)
    seen: set[str] = set()
    for c in plan.calls:
        if c.op in ("linear", "logits"):
            w = c.inputs[1]
            n = _numel(_shape(plan.buffers[w].type))
            active += n
            if c.op == "logits":
                head += n
        elif c.op in ("moe_experts", "moe_experts_gu"):
            ws = c.inputs[3:]
            experts = int(c.attrs["experts"])  # top_k comes from the router call before it
            for w in ws:
                active += _numel(_shape(plan.buffers[w].type)) * top_k // max(experts, 1)
                expert += weight_bytes.get(w, 0)
                seen.add(w)
        elif c.op == "moe_router":
            top_k = int(c.attrs["top_k"])
        elif c.op == "attention":
            attn_layers += 1
            heads, head_dim = int(c.attrs["heads"]), int(c.attrs["head_dim"])
    for name, nbytes in weight_bytes.items():
        if name not in seen and name not in embed_names:
            dense += nbytes
    state = plan.state.bytes_per_slot if plan.state.layers else 0
    return WorkModel(dense, expert, experts, top_k, embed_row, plan.kv.bytes_per_token, state,
                     active, head, attn_layers, heads, head_dim)  # fmt: skip


def plan_weight_bytes(plan: Plan) -> dict[str, int]:
    """Bytes per weight as the plan's ledger counts them (for a plan with no loaded executor)."""
    from ninfer.ir.types import DTYPE_BYTES

    out = {}
    for b in plan.weights():
        n = _numel(_shape(b.type))
        if plan.device == "cuda" and b.format == "fp8":
            out[b.name] = n + 4 * (n // max(_shape(b.type)[-1], 1))
        elif plan.device == "cuda" and b.format == "nvfp4":
            out[b.name] = n // 2 + n // 16
        else:
            out[b.name] = n * DTYPE_BYTES[plan.dtype]
    return out
