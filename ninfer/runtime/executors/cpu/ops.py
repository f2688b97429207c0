"""Torch reference implementations of every IR op (the `torch.*` kernels of cpu plans). A
weight loaded packed for a `cpu.*` kernel (kernels/cpu_quant.PackedWeight) runs that kernel
inside the same op: `linear` (cpu.*_int4pack), `logits` (cpu.logits_f16), `embed`
(cpu.gguf_rows).

Each op is `fn(ctx, attrs, *inputs) -> tensor | tuple of tensors`. Tensors are flat over the
step: row t of every [T, ...] value belongs to chunk `ctx.chunk_of[t]`. Ops that keep state
across steps (attention, causal_conv1d, gated_delta_rule) loop over the step's chunks and use
`ctx.kv` / `ctx.state` with each chunk's block table or state slot. Reductions (norms,
softmax, the delta-rule state) run in float32, as the reference implementations do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from kernels.cpu_quant import PackedWeight, gguf_rows, half_logits, int4pack_linear
from ninfer.runtime.executors.cpu.kv_cache import PagedKVCache, StateSlots
from ninfer.runtime.executors.cpu.weights import TORCH_DTYPES


@dataclass
class ChunkView:
    begin: int  # first row of the chunk in the step's flat token dimension
    length: int
    start_pos: int  # absolute position of its first token
    block_table: tuple[int, ...]
    slot: int | None
    spill: tuple[int, ...] = ()  # a verify chunk: the state after position t goes to spill[t]


@dataclass
class StepContext:
    chunks: list[ChunkView]
    kv: PagedKVCache
    state: StateSlots | None
    rope_cache: dict[str, torch.Tensor]
    # values every layer of this step shares (rotary cos/sin, KV slot indices), made once
    memo: dict[Any, Any] = field(default_factory=dict)


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:  # one op computing x * rsqrt(mean(x^2) + eps) as below
        return F.rms_norm(x, (x.shape[-1],), eps=eps)
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def embed(ctx: StepContext, a: dict, tokens: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    if isinstance(table, PackedWeight):  # cpu.gguf_rows
        return gguf_rows(tokens, table, TORCH_DTYPES[a["dtype"]])
    return F.embedding(tokens.long(), table)


def rmsnorm(ctx: StepContext, a: dict, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    shape = x.shape
    if a.get("head_dim"):
        x = x.unflatten(-1, (-1, a["head_dim"]))  # [T, heads, head_dim]
    y = _rms(x, a["eps"])
    if a["zero_centered"]:
        y = (y * (1.0 + w.float())).to(x.dtype)
    else:
        y = w * y.to(x.dtype)
    return y.reshape(shape)


def add_rmsnorm(ctx: StepContext, a: dict, x: torch.Tensor, r: torch.Tensor, w: torch.Tensor):
    s = x + r
    return rmsnorm(ctx, a, s, w), s


def add(ctx: StepContext, a: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


def linear(
    ctx: StepContext, a: dict, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None
):
    if a.get("act") == "swiglu":  # fuse_swiglu_linear, into the down projection
        x = swiglu(ctx, a, x)
    y = _matmul(x, w, bias)
    return swiglu(ctx, a, y) if a.get("out") == "swiglu" else y  # or into gate/up


def _matmul(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w^T (+ bias): F.linear, or a packed GGUF weight's cpu.*_int4pack kernel."""
    if isinstance(w, PackedWeight):
        y = int4pack_linear(x, w)
        return y + bias if bias is not None else y
    return F.linear(x, w, bias)


def logits(ctx: StepContext, a: dict, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if isinstance(w, PackedWeight):  # cpu.logits_f16
        return half_logits(x, w)
    return F.linear(x, w).float()


def split(ctx: StepContext, a: dict, x: torch.Tensor):
    return tuple(torch.split(x, a["sizes"], dim=-1))


def split_gated_q(ctx: StepContext, a: dict, x: torch.Tensor):
    q, g = x.unflatten(-1, (a["heads"], 2 * a["head_dim"])).chunk(2, dim=-1)
    return q.flatten(-2), g.flatten(-2)


def _inv_freq(rope: dict[str, Any], dim: int) -> torch.Tensor:
    inv = 1.0 / (rope["theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if rope["type"] == "linear":
        inv = inv / rope["factor"]
    elif rope["type"] == "llama3":
        factor, lo, hi = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old = rope["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / hi) & (wavelen <= old / lo)
        inv = torch.where(medium, smoothed, scaled)
    elif rope["type"] == "yarn":
        inv = _yarn_inv_freq(rope, dim)
    if "freq_factors" in rope:  # llama.cpp's rope_freqs: each frequency divided by its factor
        inv = inv / torch.tensor(rope["freq_factors"], dtype=torch.float32)
    return inv


def _yarn_inv_freq(rope: dict[str, Any], dim: int) -> torch.Tensor:
    """YaRN inv_freq [dim // 2] fp32, the float operations of transformers'
    `_compute_yarn_parameters` in its order: the dims that turn more than beta_fast times over
    the original context keep their frequency, those turning fewer than beta_slow times are
    interpolated (divided by factor), with a linear ramp between."""
    base, factor = rope["theta"], rope["factor"]
    orig = rope["original_max_position_embeddings"]

    def corr_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr_dim(rope["beta_fast"]), corr_dim(rope["beta_slow"])
    if rope["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # the reference's guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extra = 1 - ramp  # [dim/2] weight of the unscaled frequency
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    return (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra


def rope_scale(rope: dict[str, Any]) -> float:
    """The factor multiplying cos and sin: YaRN's attention_factor, else 1.0."""
    return float(rope.get("attention_factor", 1.0)) if rope["type"] == "yarn" else 1.0


def _cos_sin(ctx: StepContext, a: dict, pos: torch.Tensor, dtype: torch.dtype):
    """cos, sin [T, 1, rotary_dim] in `dtype` at positions `pos` (once per step and rope)."""
    rd = a["rotary_dim"]
    key = f"{sorted(a['rope'].items())}/{rd}"
    memo_key = ("cos_sin", key, dtype, id(pos))  # pos: the step's positions tensor
    if memo_key in ctx.memo:
        return ctx.memo[memo_key]
    if key not in ctx.rope_cache:
        ctx.rope_cache[key] = _inv_freq(a["rope"], rd).to(pos.device)
    inv = ctx.rope_cache[key]
    if pos.dim() == 2:  # MRoPE [3, T]: frequency j turns with axis mrope_axes[j] (t, h or w)
        axes = torch.tensor(a["rope"]["mrope_axes"], device=pos.device)
        freqs = pos.float()[axes].T * inv[None, :]  # [T, rd/2]
    else:
        freqs = pos.float()[:, None] * inv[None, :]  # [T, rd/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()  # [T, rd] fp32
    scale = rope_scale(a["rope"])
    if scale != 1.0:  # YaRN: scaled in fp32 before the cast, as transformers does
        cos, sin = cos * scale, sin * scale
    out = cos.to(dtype)[:, None, :], sin.to(dtype)[:, None, :]  # [T, 1, rd]
    ctx.memo[memo_key] = out
    return out


def rotate_half(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, rotary_dim: int
) -> torch.Tensor:
    """Rotate-half rotary of `x` [T, heads * head_dim] on the first `rotary_dim` dims of each
    head (the rest pass through), by `cos`/`sin` [T, 1, rotary_dim] in `x`'s dtype."""
    d, rd = head_dim, rotary_dim
    x = x.unflatten(-1, (-1, d))  # [T, heads, d]
    xr, xp = x[..., :rd], x[..., rd:]
    x1, x2 = xr[..., : rd // 2], xr[..., rd // 2 :]
    out = xr * cos + torch.cat([-x2, x1], dim=-1) * sin
    return torch.cat([out, xp], dim=-1).flatten(-2) if rd < d else out.flatten(-2)


def rotary(ctx: StepContext, a: dict, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor):
    d, rd = a["head_dim"], a["rotary_dim"]
    cos, sin = _cos_sin(ctx, a, pos, q.dtype)
    qk = rotate_half(torch.cat([q, k], dim=-1), cos, sin, d, rd)  # q's heads then k's: one pass
    return qk[:, : q.shape[-1]], qk[:, q.shape[-1] :]


def attention(
    ctx: StepContext,
    a: dict,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pos: torch.Tensor | None = None,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write k/v into the cache and attend causally, per chunk. A folded prologue (attr
    `prologue`, inputs pos [T] and the q/k norm weights) first applies exactly the rmsnorm and
    rotary ops it replaced (its attrs carry their eps / zero_centered / rope / rotary_dim)."""
    if a.get("prologue"):
        if q_norm is not None:
            q, k = rmsnorm(ctx, a, q, q_norm), rmsnorm(ctx, a, k, k_norm)
        q, k = rotary(ctx, a, q, k, pos)
    h, kvh, d, layer = a["heads"], a["kv_heads"], a["head_dim"], a["layer"]
    g = h // kvh  # query heads per KV head
    out = torch.empty_like(q)
    for i, c in enumerate(ctx.chunks):
        rows = slice(c.begin, c.begin + c.length)
        total = c.start_pos + c.length
        if ("kv_slots", i) not in ctx.memo:  # the same pages in every layer of the step
            ctx.memo["kv_slots", i] = ctx.kv.slots(c.block_table, 0, total)
        slots = ctx.memo["kv_slots", i]  # [S] rows of positions 0..total-1
        ctx.kv.write(
            layer,
            c.block_table,
            c.start_pos,
            k[rows].unflatten(-1, (kvh, d)),
            v[rows].unflatten(-1, (kvh, d)),
            slots[c.start_pos :],
        )
        kc, vc = ctx.kv.read(layer, c.block_table, total, slots)  # [S, KVH, D]
        # [1, heads, L, D] against [1, KVH, S, D]: query head j attends with KV head j // g
        qc = q[rows].reshape(1, c.length, h, d).transpose(1, 2)
        mask = None
        if c.length > 1:  # a decode row (one query, the last position) sees every key
            qpos = torch.arange(c.start_pos, total, device=q.device)[:, None]
            mask = torch.arange(total, device=q.device)[None, :] <= qpos  # [L, S] past keys
        o = F.scaled_dot_product_attention(
            qc,
            kc.transpose(0, 1)[None],
            vc.transpose(0, 1)[None],
            attn_mask=mask,
            scale=a["scale"],
            enable_gqa=g > 1,
        )  # [1, H, L, D]
        out[rows] = o[0].transpose(0, 1).reshape(c.length, h * d)
    return out


def sigmoid_mul(ctx: StepContext, a: dict, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(g)


def silu_mul(ctx: StepContext, a: dict, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return F.silu(g) * u


def swiglu(ctx: StepContext, a: dict, gu: torch.Tensor) -> torch.Tensor:
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


def moe_router(ctx: StepContext, a: dict, x: torch.Tensor, w: torch.Tensor):
    probs = torch.softmax(F.linear(x, w).float(), dim=-1)  # [T, E]
    top_w, top_i = torch.topk(probs, a["top_k"], dim=-1)
    if a["normalize"]:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    return top_w, top_i.to(torch.int32)


def _experts(
    x: torch.Tensor, top_w: torch.Tensor, top_i: torch.Tensor, gate_up: Callable, down: torch.Tensor
):
    y = torch.zeros_like(x)
    for e in torch.unique(top_i).tolist():
        tok, slot = torch.where(top_i == e)
        g, u = gate_up(e, x[tok])
        h = F.linear(F.silu(g) * u, down[e])
        y.index_add_(0, tok, h * top_w[tok, slot, None].to(x.dtype))
    return y


def moe_experts(ctx: StepContext, a: dict, x, top_w, top_i, wg, wu, wd) -> torch.Tensor:
    return _experts(x, top_w, top_i, lambda e, xs: (F.linear(xs, wg[e]), F.linear(xs, wu[e])), wd)


def moe_experts_gu(ctx: StepContext, a: dict, x, top_w, top_i, wgu, wd) -> torch.Tensor:
    return _experts(x, top_w, top_i, lambda e, xs: F.linear(xs, wgu[e]).chunk(2, dim=-1), wd)


def causal_conv1d(ctx: StepContext, a: dict, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per chunk: prepend the slot's conv tail [C, K-1], depthwise conv, SiLU; keep the new tail."""
    assert ctx.state is not None
    conv = ctx.state.conv[a["layer"]]
    kk = a["kernel_size"]
    out = torch.empty_like(x)
    for c in ctx.chunks:
        rows = slice(c.begin, c.begin + c.length)
        xc = torch.cat([conv[c.slot], x[rows].T], dim=-1)  # [C, K-1+L]
        y = F.conv1d(xc[None], w, groups=xc.shape[0])[0]  # [C, L]
        if c.spill:  # the tail after position t: inputs t+1 .. t+K-1 of xc
            for t, slot in enumerate(c.spill):
                conv[slot] = xc[:, t + 1 : t + kk]
        else:
            conv[c.slot] = xc[:, -(kk - 1) :]
        out[rows] = F.silu(y).T
    return out


def gdn_gates(ctx: StepContext, a: dict, av, bv, a_log, dt_bias):
    g = -a_log.float().exp() * F.softplus(av.float() + dt_bias.float())
    return g, torch.sigmoid(bv.float())


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def gated_delta_rule(ctx: StepContext, a: dict, q, k, v, g, beta) -> torch.Tensor:
    """Per chunk, per token t and value head: S <- e^g S; delta = beta (v - S^T k);
    S <- S + k delta^T; o = S^T q — with q, k L2-normalised and q scaled by k_dim^-1/2."""
    assert ctx.state is not None
    ssm = ctx.state.ssm[a["layer"]]
    hk, hv, dk, dv = a["k_heads"], a["v_heads"], a["k_dim"], a["v_dim"]
    out = torch.empty_like(v)
    for c in ctx.chunks:
        rows = slice(c.begin, c.begin + c.length)
        qc = (
            _l2norm(q[rows].float().unflatten(-1, (hk, dk))).repeat_interleave(hv // hk, dim=1)
            * dk**-0.5
        )
        kc = _l2norm(k[rows].float().unflatten(-1, (hk, dk))).repeat_interleave(hv // hk, dim=1)
        vc = v[rows].float().unflatten(-1, (hv, dv))  # [L, Hv, Dv]
        decay, bc = g[rows].float().exp(), beta[rows].float()  # [L, Hv]
        s = ssm[c.slot].clone()  # [Hv, Dk, Dv]
        o = torch.empty(c.length, hv, dv, device=v.device)
        for t in range(c.length):
            s = s * decay[t, :, None, None]
            mem = (s * kc[t, :, :, None]).sum(dim=1)  # [Hv, Dv]
            delta = (vc[t] - mem) * bc[t, :, None]
            s = s + kc[t, :, :, None] * delta[:, None, :]
            o[t] = (s * qc[t, :, :, None]).sum(dim=1)
            if c.spill:  # a verify chunk keeps the state after every position
                ssm[c.spill[t]] = s
        if not c.spill:
            ssm[c.slot] = s
        out[rows] = o.flatten(-2).to(v.dtype)
    return out


def gated_rmsnorm(
    ctx: StepContext, a: dict, x: torch.Tensor, z: torch.Tensor, w: torch.Tensor
) -> torch.Tensor:
    xs = x.unflatten(-1, (-1, a["head_dim"]))
    y = w * _rms(xs, a["eps"]).to(x.dtype)
    y = y * F.silu(z.unflatten(-1, (-1, a["head_dim"])).float())
    return y.flatten(-2).to(x.dtype)


def select_rows(ctx: StepContext, a: dict, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return x[rows.long()]


OPS: dict[str, Callable[..., Any]] = {
    name: fn
    for name, fn in globals().items()
    if callable(fn)
    and getattr(fn, "__module__", None) == __name__
    and not name.startswith("_")
    and name not in ("ChunkView", "StepContext")
}
