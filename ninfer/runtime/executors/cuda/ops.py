"""GPU implementations of the IR ops: the Triton kernels of kernels/ where the plan names one,
cuBLAS (F.linear) for dense GEMMs, small torch ops for cheap elementwise work.

Each op is `fn(step, attrs, *inputs) -> tensor | tuple`, like ninfer.runtime.executors.cpu.ops, with the
same meaning. Unlike the reference, no op loops over chunks or reads a device value on the host:
per-step metadata (`DeviceStep`) is already on the device, so a decode step can be captured into
a CUDA Graph and replayed with new metadata copied into the same buffers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from kernels.attn_prologue import attention_prologue
from kernels.folded_norm import NormedX, ResidualNorm
from kernels.fp8_mma import Fp8MmaConfig, fp8_mma, fp8_mma_config
from kernels.fp8_mma import usable as fp8_mma_usable
from kernels.fp8_mma import usable_nvfp4 as fp8_mma_usable_nvfp4
from kernels.gated_rmsnorm import gated_rmsnorm as gated_rmsnorm_kernel
from kernels.gdn_conv import causal_conv1d as conv1d_kernel
from kernels.gdn_gates import gdn_gates as gdn_gates_kernel
from kernels.gdn_recurrent import gated_delta_rule_recurrent
from kernels.gemv import INTERPRETED_M1, DenseGemvConfig, SkinnyConfig, dense_gemv, dense_skinny
from kernels.launch import interpreting
from kernels.moe_gemm import moe_gemm
from kernels.paged_decode import paged_attention_decode
from kernels.paged_prefill import paged_attention_prefill
from kernels.rmsnorm import rmsnorm as rmsnorm_kernel
from kernels.rotary import rotary_
from kernels.silu_mul import silu_mul as silu_mul_kernel
from ninfer.passes.assign_kernels import CUBLAS_GEMM, CUDA_GEMMS, attention_kernel
from ninfer.passes.assign_kernels import CUDA_DECODE_KERNELS as DECODE
from ninfer.passes.assign_kernels import CUDA_KERNELS as ASSIGNED
from ninfer.passes.gemm_launch import GEMV, SKINNY
from ninfer.runtime.executors.cpu import ops as ops_torch
from ninfer.runtime.executors.cuda.kv_cache import CudaKVCache, CudaStateSlots
from ninfer.runtime.executors.cuda.weights import QuantWeight
from ninfer.runtime.executors.kernel_registry import KernelRegistry
from ninfer.runtime.executors.vision.cuda_ops import cuda_vision_kernels

GEMMS = (CUBLAS_GEMM, *CUDA_GEMMS.values())

# Opt-in (NINFER_GDN_PREFILL=fla, package `fla-core`): the chunked Gated DeltaNet rule of fla for
# prefill chunks of GDN_CHUNKED_MIN_TOKENS or more. On the H200 at Qwen3.5-9B shapes the recurrent
# kernel takes 0.48 ms at T=256, 1.9 ms at 1024 and 7.8 ms at 4096, fla's chunked one ~1.2 ms up
# to 1024 (bench/results/HISTORY.md, h200/gdn_bench.txt). Opt-in until the executor's fla path
# has been validated on the GPU (its GPU test ran past a 60 s limit in fla's first-call
# compilation).
fla_chunk_gated_delta_rule = None
if os.environ.get("NINFER_GDN_PREFILL", "recurrent") == "fla":
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk_gated_delta_rule
GDN_CHUNKED_MIN_TOKENS = 256


@dataclass
class DeviceStep:
    """One step's metadata, on the device. N chunks of T tokens in total.

    decode        every chunk is one token (N == T): attention uses the decode kernel
    positions     [T] int32 absolute positions ([3, T] in a vision plan: MRoPE's t, h, w)
    slot_mapping  [T] int32 flat KV slot of each token (page * page_size + row)
    block_tables  [N, max_pages] int32
    seq_lens      [N] int32 tokens in the cache after this step (the chunk included)
    cu_seqlens    [N + 1] int32 chunk boundaries in the flat token dimension
    state_slots   [N] int32 recurrent-state slot of each chunk (hybrid models)
    spill_slots   [T] int32 or None: a step with speculative verify chunks of a hybrid model;
                  the slot that takes the recurrent state after each token of a verify chunk
                  (SeqChunk.spill_slots), -1 for the tokens of the other chunks. None: no
                  chunk spills (the kernels take no spill argument, no extra work)
    max_q_len     longest chunk (host int; 1 for decode)
    norm_stats    [slots, NORM_STATS] f32, zeroed at the start of every step: the partial sums of s²
                  of the RMSNorms fuse_norm_linear marked (add_rmsnorm's `stats_slot`)
    """

    decode: bool
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens: torch.Tensor
    state_slots: torch.Tensor
    max_q_len: int
    kv: CudaKVCache | None
    state: CudaStateSlots | None
    inv_freq: dict[str, torch.Tensor] = field(default_factory=dict)
    norm_stats: torch.Tensor | None = None
    spill_slots: torch.Tensor | None = None


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as a 2-D [rows, features] tensor with a contiguous last dim (a copy only if needed)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


@dataclass(frozen=True)
class _PendingProjection:
    """A projection fuse_norm_linear marked (`residual_norm`), left for the add_rmsnorm that is
    its only reader to launch with the residual-add epilogue."""

    x: torch.Tensor  # [1, K]
    w: QuantWeight
    config: Fp8MmaConfig


# where the fp8 table keeps the FMA kernel (Qwen3-8B's q/k/v), a folded RMSNorm still needs the
# tensor-core one: its best launch shape for 4096-wide inputs
FOLDED_NORM_CONFIG = Fp8MmaConfig(2, 2)


def _mma_for(w: Any, x: torch.Tensor) -> Fp8MmaConfig | None:
    """The tensor-core GEMV's launch shape for one row x against w where an RMSNorm can run
    in its prologue or epilogue (kernels/fp8_mma.py; a single fp8 segment, or nvfp4 with its
    repacked copy), or None."""
    if not isinstance(w, QuantWeight) or len(w.segments) != 1:
        return None
    if w.fmt == "nvfp4":
        mma = w.segments[0].mma
        if mma is None or x.dim() != 2 or not fp8_mma_usable_nvfp4(x, mma):
            return None
        return w.mma_config(x) or FOLDED_NORM_CONFIG
    q = w.segments[0].data
    if w.fmt != "fp8" or x.dim() != 2 or x.shape[0] != 1 or not fp8_mma_usable(x, q):
        return None
    return fp8_mma_config(q.shape[0], q.shape[1], 1) or FOLDED_NORM_CONFIG


def _mma_operands(w: QuantWeight) -> tuple[Any, torch.Tensor | None]:
    """(weight, scale) as fp8_mma takes them."""
    seg = w.segments[0]
    return (seg.mma, None) if w.fmt == "nvfp4" else (seg.data, seg.scale)


def linear(
    s: DeviceStep,
    a: dict,
    x: torch.Tensor | NormedX,
    w: Any,
    bias: torch.Tensor | None = None,
) -> torch.Tensor | _PendingProjection:
    """x @ wᵀ (+ bias); attr act=swiglu: x is [gate | up] and the input is silu(gate) * up;
    attr out=swiglu: w is [gate; up] and the result silu(gate) * up (fp8 weights: in the
    tensor-core GEMV's epilogue at batch 1).
    Dense weights: cuBLAS here (the rows the plan's `launch` names run linear_gemv /
    linear_skinny instead); quantised weights run kernels.quant_gemm (the fp8 decode GEMV folds
    the activation in too)."""
    glu = a.get("act") == "swiglu"
    out_glu = a.get("out") == "swiglu"  # (fuse_swiglu_linear folds it only where there is no bias)
    if isinstance(x, NormedX):  # the RMSNorm before this projection left its end to it
        cfg = _mma_for(w, x.s) if bias is None and not glu else None
        if cfg is not None:
            return fp8_mma(x, *_mma_operands(w), cfg, swiglu_out=out_glu)
        x = x.materialize()
    x2 = _rows(x)
    if a.get("residual_norm") and s.norm_stats is not None and bias is None and not out_glu:
        cfg = _mma_for(w, x2) if not glu else None
        if cfg is not None:
            return _PendingProjection(x2, w, cfg)
    lead = x.shape[:-1]
    if isinstance(w, QuantWeight):
        y = w.linear(x2, glu=glu, swiglu_out=out_glu)
    else:  # cuBLAS (the plan's `launch` sends few rows to linear_gemv / linear_skinny)
        y = F.linear(silu_mul_kernel(x2) if glu else x2, w)
        y = silu_mul_kernel(y) if out_glu else y
    y = y.view(*lead, y.shape[-1])
    return y if bias is None else y + bias


def linear_gemv(
    s: DeviceStep, a: dict, x: torch.Tensor, w: torch.Tensor, bias=None, *, config
) -> torch.Tensor:
    """A dense GEMM by kernels.gemv with the plan's launch shape (bn, warps, unroll); a
    swiglu input (act) folded in. Under the CPU interpreter it runs INTERPRETED_M1: the same
    arithmetic in fewer programs."""
    x2 = _rows(x)
    cfg = INTERPRETED_M1 if interpreting() else DenseGemvConfig(*config)
    y = dense_gemv(x2, w, cfg, glu=a.get("act") == "swiglu")
    return _finish(a, x, y, bias)


def linear_skinny(
    s: DeviceStep, a: dict, x: torch.Tensor, w: torch.Tensor, bias=None, *, config
) -> torch.Tensor:
    """A dense GEMM of 5-16 rows by kernels.gemv's tensor-core tiles (bn, bk, stages, warps)."""
    x2 = _rows(x)
    x2 = silu_mul_kernel(x2) if a.get("act") == "swiglu" else x2
    return _finish(a, x, dense_skinny(x2, w, SkinnyConfig(*config)), bias)


def _finish(a: dict, x: torch.Tensor, y: torch.Tensor, bias) -> torch.Tensor:
    """y [rows, N] with the gate/up swiglu (out) applied, in x's leading shape, + bias."""
    y = silu_mul_kernel(y) if a.get("out") == "swiglu" else y
    y = y.view(*x.shape[:-1], y.shape[-1])
    return y if bias is None else y + bias


def _as_logits(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    return lambda s, a, x, w, **kw: fn(s, a, x, w, **kw).float()


def logits(s: DeviceStep, a: dict, x: torch.Tensor, w: Any) -> torch.Tensor:
    return linear(s, a, x, w).float()


def rmsnorm(s: DeviceStep, a: dict, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    shape = x.shape
    hd = a.get("head_dim") or shape[-1]
    y, _ = rmsnorm_kernel(_rows(x.reshape(-1, hd)), w, a["eps"], zero_centered=a["zero_centered"])
    return y.reshape(shape)


def add_rmsnorm(
    s: DeviceStep, a: dict, x: torch.Tensor | _PendingProjection, r: torch.Tensor, w: torch.Tensor
):
    """(rmsnorm(x + r) * w, x + r). After a `_PendingProjection` (fuse_norm_linear): that
    projection runs now with the residual-add epilogue and the norm is finished by the
    projection that reads it (a `NormedX`)."""
    if isinstance(r, _PendingProjection):  # the add is symmetric: the projection is either
        x, r = r, x
    if isinstance(x, _PendingProjection):
        assert s.norm_stats is not None
        stats = s.norm_stats[a["stats_slot"]]
        epilogue = ResidualNorm(_rows(r), w, a["zero_centered"], stats)
        summed, u = fp8_mma(x.x, *_mma_operands(x.w), x.config, residual=epilogue)
        return NormedX(summed, u, w, a["zero_centered"], stats, a["eps"]), summed
    y, summed = rmsnorm_kernel(
        _rows(x), w, a["eps"], residual=_rows(r), zero_centered=a["zero_centered"]
    )
    return y, summed


def _rope_inv_freq(s: DeviceStep, a: dict, device: torch.device) -> torch.Tensor:
    """inv_freq [rotary_dim // 2] f32 of the op's rope, made once per executor (warm-up fills
    it before any CUDA Graph capture)."""
    rd = a["rotary_dim"]
    key = f"{sorted(a['rope'].items())}/{rd}"
    if key not in s.inv_freq:
        s.inv_freq[key] = ops_torch._inv_freq(a["rope"], rd).to(device)
    return s.inv_freq[key]


def rotary(s: DeviceStep, a: dict, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor):
    d = a["head_dim"]
    inv = _rope_inv_freq(s, a, q.device)
    out = []
    for x in (q, k):
        x3 = x.unflatten(-1, (-1, d)).clone()  # [T, heads, d]; rotated in place
        rotary_(x3, pos, inv, scale=ops_torch.rope_scale(a["rope"]))
        out.append(x3.flatten(-2))
    return out[0], out[1]


def _prologue_fused(s: DeviceStep, a: dict, q, k, v, pos, q_norm, k_norm) -> torch.Tensor:
    """q/k norm, rotary and the KV write in one launch of kernels.attn_prologue; q [T, H, D]."""
    assert s.kv is not None
    h, kvh, d = a["heads"], a["kv_heads"], a["head_dim"]
    return attention_prologue(
        q.unflatten(-1, (h, d)), k.unflatten(-1, (kvh, d)), v.unflatten(-1, (kvh, d)),
        pos, _rope_inv_freq(s, a, q.device), q_norm_w=q_norm, k_norm_w=k_norm,
        eps=a.get("eps", 0.0), zero_centered=a.get("zero_centered", False),
        slots=s.slot_mapping, scale=ops_torch.rope_scale(a["rope"]),
        **s.kv.kernel_args(a["layer"]),
    )  # fmt: skip


def _prologue_unfused(s: DeviceStep, a: dict, q, k, v, pos, q_norm, k_norm) -> torch.Tensor:
    """The folded prologue's ops as separate launches (where there is one), then the KV write
    (kernels.kv_cache formats); q [T, H, D]."""
    assert s.kv is not None
    h, kvh, d = a["heads"], a["kv_heads"], a["head_dim"]
    if a.get("prologue"):
        if q_norm is not None:
            q, k = rmsnorm(s, a, q, q_norm), rmsnorm(s, a, k, k_norm)
        q, k = rotary(s, a, q, k, pos)
    s.kv.write(a["layer"], k.unflatten(-1, (kvh, d)), v.unflatten(-1, (kvh, d)), s.slot_mapping)
    q3 = q.unflatten(-1, (h, d))  # [T, H, D]
    return q3 if q3.stride(-1) == 1 else q3.contiguous()


def _attention(prologue: Callable[..., torch.Tensor], decode: bool) -> Callable[..., torch.Tensor]:
    """An attention kernel: `prologue` (fills the KV cache, returns q [T, H, D]) then the paged
    attention kernel of a decode step (`decode`, every chunk one token) or of any other step."""

    def run(
        s: DeviceStep,
        a: dict,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        pos: torch.Tensor | None = None,
        q_norm: torch.Tensor | None = None,
        k_norm: torch.Tensor | None = None,
    ) -> torch.Tensor:
        assert s.kv is not None
        h, d, T = a["heads"], a["head_dim"], q.shape[0]
        q3 = prologue(s, a, q, k, v, pos, q_norm, k_norm)
        args = s.kv.kernel_args(a["layer"])
        if decode:
            out = paged_attention_decode(
                q3, block_tables=s.block_tables, seq_lens=s.seq_lens, scale=a["scale"], **args
            )
        else:
            out = paged_attention_prefill(
                q3, block_tables=s.block_tables, cu_seqlens_q=s.cu_seqlens, seq_lens=s.seq_lens,
                scale=a["scale"], max_q_len=s.max_q_len, **args,
            )  # fmt: skip
        return out.reshape(T, h * d)

    return run


def swiglu(s: DeviceStep, a: dict, gu: torch.Tensor) -> torch.Tensor:
    return silu_mul_kernel(_rows(gu))


def _moe_sort(
    top_i: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """kernels.moe_gemm.moe_sort without its host sync (bincount): (sorted_rows [T*k] int32,
    slot_of [T, k] int64, expert_offsets [E+1] int32)."""
    T, k = top_i.shape
    flat = top_i.reshape(-1).to(torch.int64)
    order = torch.sort(flat, stable=True).indices  # slot -> assignment
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)
    slot_of = torch.empty_like(order)
    slot_of[order] = torch.arange(order.numel(), device=order.device)
    return (order // k).to(torch.int32), slot_of.view(T, k), offsets


def _experts(
    x: torch.Tensor, top_w: torch.Tensor, top_i: torch.Tensor, gate_up: Callable, wd: torch.Tensor
) -> torch.Tensor:
    E = wd.shape[0]
    rows, slot_of, offsets = _moe_sort(top_i, E)
    act = gate_up(_rows(x), rows, offsets)  # [S, I], slots sorted by expert
    slots = torch.arange(rows.numel(), dtype=torch.int32, device=x.device)
    y = moe_gemm(act, wd, slots, offsets)  # [S, H]
    picked = y[slot_of].float()  # [T, k, H]
    return (picked * top_w[..., None].float()).sum(1).to(x.dtype)


def moe_experts_gu(s: DeviceStep, a: dict, x, top_w, top_i, wgu, wd) -> torch.Tensor:
    return _experts(x, top_w, top_i, lambda xs, r, o: silu_mul_kernel(moe_gemm(xs, wgu, r, o)), wd)


def moe_experts(s: DeviceStep, a: dict, x, top_w, top_i, wg, wu, wd) -> torch.Tensor:
    return _experts(
        x,
        top_w,
        top_i,
        lambda xs, r, o: F.silu(moe_gemm(xs, wg, r, o)) * moe_gemm(xs, wu, r, o),
        wd,
    )


def causal_conv1d(s: DeviceStep, a: dict, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """In place on the layer's conv-tail pool, rows s.state_slots (a verify chunk's tails after
    each position: rows s.spill_slots); x may be a view."""
    assert s.state is not None
    y, _ = conv1d_kernel(
        _rows(x), w.reshape(w.shape[0], -1), s.state.conv[a["layer"]], s.cu_seqlens,
        max_len=s.max_q_len, state_slots=s.state_slots, spill_slots=s.spill_slots,
    )  # fmt: skip
    return y


def gdn_gates(s: DeviceStep, a: dict, av, bv, a_log, dt_bias):
    """(g, beta) [T, Hv] f32 in one launch; av, bv may be views of the projection output."""
    return gdn_gates_kernel(_rows(av), _rows(bv), a_log, dt_bias)


def gated_delta_rule(s: DeviceStep, a: dict, q, k, v, g, beta) -> torch.Tensor:
    """Recurrent kernel in place on the layer's S pool (rows s.state_slots, no copies; a verify
    chunk's states after each position: rows s.spill_slots); long prefill chunks use fla's
    chunked kernel when installed (see GDN_CHUNKED_MIN_TOKENS) unless a chunk spills."""
    assert s.state is not None
    ssm = s.state.ssm[a["layer"]]  # [slots + 1, Hv, Dk, Dv] f32
    hk, hv, dk, dv = a["k_heads"], a["v_heads"], a["k_dim"], a["v_dim"]
    q3, k3 = q.unflatten(-1, (hk, dk)), k.unflatten(-1, (hk, dk))  # [T, Hk, Dk] views
    v3 = v.unflatten(-1, (hv, dv))  # [T, Hv, Dv]
    chunked = fla_chunk_gated_delta_rule is not None and s.max_q_len >= GDN_CHUNKED_MIN_TOKENS
    if chunked and s.spill_slots is None:  # fla keeps only each chunk's final state
        return _gated_delta_rule_fla(s, ssm, q3, k3, v3, g, beta).flatten(-2)
    o = gated_delta_rule_recurrent(
        q3, k3, v3, _rows(g), _rows(beta), ssm, s.cu_seqlens, scale=dk**-0.5,
        state_slots=s.state_slots, spill_slots=s.spill_slots,
    )  # fmt: skip
    return o.flatten(-2)


def _gated_delta_rule_fla(s: DeviceStep, ssm, q3, k3, v3, g, beta) -> torch.Tensor:
    """fla's chunked rule on the gathered states of the step's slots; o [T, Hv, Dv]."""
    r, dk = v3.shape[1] // q3.shape[1], q3.shape[2]
    slots = s.state_slots.long()
    o, final = fla_chunk_gated_delta_rule(
        q3.repeat_interleave(r, 1)[None], k3.repeat_interleave(r, 1)[None], v3[None],
        g[None], beta[None], scale=dk**-0.5, initial_state=ssm.index_select(0, slots),
        output_final_state=True, cu_seqlens=s.cu_seqlens.long(), use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    ssm.index_copy_(0, slots, final.to(ssm.dtype))
    return o[0]


def gated_rmsnorm(
    s: DeviceStep, a: dict, x: torch.Tensor, z: torch.Tensor, w: torch.Tensor
) -> torch.Tensor:
    y = gated_rmsnorm_kernel(_rows(x), _rows(z), w, a["eps"], a["head_dim"])
    return y.reshape(x.shape)


def _attention_kernels() -> dict[tuple[str, str], Callable[..., Any]]:
    """Every attention kernel name assign_kernels gives: the prologue (none, the one-launch
    kernel, or its unfused launches) + the paged attention of a decode or any other step."""
    out = {}
    for decode in (False, True):
        for prologue in ("", "rotary", "qk_norm+rotary"):
            for fused in (False, True) if prologue else (False,):
                impl = _attention(_prologue_fused if fused else _prologue_unfused, decode)
                out[(attention_kernel(prologue, fused, decode), "attention")] = impl
    return out


_K = ASSIGNED  # the kernel names assign_kernels gives cuda ops, by op kind
# (kernel name the plan prints, op kind) -> implementation; the torch references where the plan
# names a torch kernel (no host syncs in any of them)
CUDA_KERNELS = KernelRegistry(
    "cuda",
    {
        ("view.split", "split"): ops_torch.split,
        ("view.split", "split_gated_q"): ops_torch.split_gated_q,
        **{
            (_K[op], op): getattr(ops_torch, op)
            for op in ("embed", "add", "sigmoid_mul", "silu_mul", "moe_router", "select_rows")
        },
        **{(name, op): fn for name in GEMMS for op, fn in (("linear", linear), ("logits", logits))},
        (GEMV, "linear"): linear_gemv,
        (GEMV, "logits"): _as_logits(linear_gemv),
        (SKINNY, "linear"): linear_skinny,
        (SKINNY, "logits"): _as_logits(linear_skinny),
        (_K["rmsnorm"], "rmsnorm"): rmsnorm,
        (_K["add_rmsnorm"], "add_rmsnorm"): add_rmsnorm,
        (_K["rotary"], "rotary"): rotary,
        (_K["swiglu"], "swiglu"): swiglu,
        (_K["moe_experts"], "moe_experts"): moe_experts,
        (_K["moe_experts_gu"], "moe_experts_gu"): moe_experts_gu,
        (_K["causal_conv1d"], "causal_conv1d"): causal_conv1d,
        (_K["gdn_gates"], "gdn_gates"): gdn_gates,
        (_K["gated_rmsnorm"], "gated_rmsnorm"): gated_rmsnorm,
        # one recurrent kernel serves both (fla's chunked rule for long prefills, see above)
        (_K["gated_delta_rule"], "gated_delta_rule"): gated_delta_rule,
        (DECODE["gated_delta_rule"], "gated_delta_rule"): gated_delta_rule,
        **_attention_kernels(),
        **cuda_vision_kernels(),  # --vision: the tower, media_merge and the 3-axis rotary
    },
)
