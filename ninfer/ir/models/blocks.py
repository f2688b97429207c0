"""Building blocks shared by the architecture builders: attention, MLP, MoE, Gated DeltaNet.

Every block reads `h` ([T, hidden], the normed residual stream) and returns its output value
([T, hidden]). Linear ops carry `group`/`proj` attributes so fusion passes can find siblings:

    group attn_in: proj q, k, v           (one GEMM after fuse_qkv)
    group gdn_in:  proj qkv, z, b, a      (one GEMM after fuse_qkv)
    group mlp_in:  proj gate, up          (one GEMM after fuse_gate_up)
"""

from __future__ import annotations

from ninfer.artifact.model_spec import ModelSpec
from ninfer.ir.builder import GraphBuilder


def linear(
    b: GraphBuilder, x: str, prefix: str, out: str, group: str, proj: str, bias: bool = False
) -> str:
    ins = [x, b.weight(f"{prefix}.weight")]
    if bias:
        ins.append(b.weight(f"{prefix}.bias"))
    return b.op1("linear", ins, {"group": group, "proj": proj}, out)


def attention(
    b: GraphBuilder,
    s: ModelSpec,
    i: int,
    h: str,
    *,
    qk_norm: bool,
    gated: bool,
    zero_centered: bool,
    qkv_bias: bool = False,
    prefix: str = "model.layers",
) -> str:
    """Self-attention over the paged KV cache `kv.L{i}`. q/k/v carry a bias when `qkv_bias`
    (Qwen2) or the config's attention_bias says so; o_proj only with attention_bias. Weights
    are `{prefix}.{i}.self_attn.*` (an MTP head's layer: prefix "mtp.layers").

    q: [T, heads*head_dim] (gated: q_proj emits [T, heads*2*head_dim] = per head query|gate),
    k, v: [T, kv_heads*head_dim]; output o_proj(o) [T, hidden].
    """
    p, n = f"{prefix}.{i}.self_attn", f"L{i}"
    g = f"{n}.attn_in"
    in_bias = qkv_bias or s.attention_bias
    q = linear(b, h, f"{p}.q_proj", f"{n}.q_proj", g, "q", in_bias)
    k = linear(b, h, f"{p}.k_proj", f"{n}.k", g, "k", in_bias)
    v = linear(b, h, f"{p}.v_proj", f"{n}.v", g, "v", in_bias)
    gate = None
    if gated:
        q, gate = b.op(
            "split_gated_q",
            [q],
            {"heads": s.heads, "head_dim": s.head_dim},
            [f"{n}.q", f"{n}.gate"],
        )
    if qk_norm:
        nattr = {"eps": s.eps, "zero_centered": zero_centered, "head_dim": s.head_dim}
        q = b.op1("rmsnorm", [q, b.weight(f"{p}.q_norm.weight")], nattr, f"{n}.q_normed")
        k = b.op1("rmsnorm", [k, b.weight(f"{p}.k_norm.weight")], nattr, f"{n}.k_normed")
    rattr = {"head_dim": s.head_dim, "rotary_dim": s.rotary_dim, "rope": s.rope}
    q, k = b.op("rotary", [q, k, "positions"], rattr, [f"{n}.q_rot", f"{n}.k_rot"])
    cache = b.cache(
        f"kv.L{i}", {"kind": "kv", "layer": i, "kv_heads": s.kv_heads, "head_dim": s.head_dim}
    )
    aattr = {
        "layer": i,
        "heads": s.heads,
        "kv_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "scale": s.head_dim**-0.5,
        "cache": cache,
    }
    o = b.op1("attention", [q, k, v], aattr, f"{n}.attn")
    if gate is not None:
        o = b.op1("sigmoid_mul", [o, gate], None, f"{n}.attn_gated")
    return linear(b, o, f"{p}.o_proj", f"{n}.attn_out", f"{n}.attn_out", "o", s.attention_bias)


def mlp(
    b: GraphBuilder, s: ModelSpec, prefix: str, name: str, h: str, bias: bool = False, **inter: int
) -> str:
    """SwiGLU MLP: down(silu(gate h) * up h). `inter`: {config key: size} of the gate."""
    for key, size in inter.items():
        b.sized(f"{prefix}.gate_proj.weight", size, key)
    g = f"{name}.mlp_in"
    gate = linear(b, h, f"{prefix}.gate_proj", f"{name}.mlp_gate", g, "gate", bias)
    up = linear(b, h, f"{prefix}.up_proj", f"{name}.mlp_up", g, "up", bias)
    act = b.op1("silu_mul", [gate, up], None, f"{name}.act")
    return linear(b, act, f"{prefix}.down_proj", f"{name}.mlp_out", f"{name}.mlp_out", "down", bias)


def moe(
    b: GraphBuilder, s: ModelSpec, i: int, h: str, *, shared: bool, prefix: str = "model.layers"
) -> str:
    """Top-k routed experts (softmax in f32 over all experts, then top-k), plus an optional
    shared expert scaled by sigmoid(shared_expert_gate h). Weights: `{prefix}.{i}.mlp.*`."""
    p, n = f"{prefix}.{i}.mlp", f"L{i}"
    top_w, top_i = b.op(
        "moe_router",
        [h, b.weight(f"{p}.gate.weight")],
        {"top_k": s.top_k, "normalize": s.norm_topk},
        [f"{n}.top_w", f"{n}.top_i"],
    )
    ws = [
        b.stacked(
            f"{p}.experts.{proj}.weight",
            [f"{p}.experts.{e}.{proj}.weight" for e in range(s.experts)],
        )
        for proj in ("gate_proj", "up_proj", "down_proj")
    ]
    y = b.op1(
        "moe_experts",
        [h, top_w, top_i, *ws],
        {"experts": s.experts, "inter": s.moe_inter},
        f"{n}.experts",
    )
    if not shared:
        return y
    sh = mlp(
        b, s, f"{p}.shared_expert", f"{n}.shared", h, shared_expert_intermediate_size=s.shared_inter
    )
    sg = b.op1(
        "linear",
        [h, b.weight(f"{p}.shared_expert_gate.weight")],
        {"group": f"{n}.sg", "proj": "gate"},
        f"{n}.shared_gate",
    )
    sh = b.op1("sigmoid_mul", [sh, sg], None, f"{n}.shared_gated")
    return b.op1("add", [y, sh], None, f"{n}.moe_out")


def gated_deltanet(b: GraphBuilder, s: ModelSpec, i: int, h: str) -> str:
    """Gated DeltaNet linear attention with its state in slot cache `state.L{i}`.

    qkv: [T, 2*Hk*Kd + Hv*Vd] -> causal conv1d (+SiLU) -> q, k [T, Hk*Kd], v [T, Hv*Vd];
    g, beta: [T, Hv] f32; o: [T, Hv*Vd] -> gated RMSNorm with z -> out_proj [T, hidden].
    """
    p, n = f"model.layers.{i}.linear_attn", f"L{i}"
    g = f"{n}.gdn_in"
    kd, vd = s.lin_k_heads * s.lin_k_dim, s.lin_v_heads * s.lin_v_dim
    qkv = linear(b, h, f"{p}.in_proj_qkv", f"{n}.qkv_raw", g, "qkv")
    z = linear(b, h, f"{p}.in_proj_z", f"{n}.z", g, "z")
    bb = linear(b, h, f"{p}.in_proj_b", f"{n}.b", g, "b")
    a = linear(b, h, f"{p}.in_proj_a", f"{n}.a", g, "a")
    cache = b.cache(
        f"state.L{i}",
        {
            "kind": "state",
            "layer": i,
            "conv_dim": 2 * kd + vd,
            "kernel_size": s.conv_kernel,
            "v_heads": s.lin_v_heads,
            "k_dim": s.lin_k_dim,
            "v_dim": s.lin_v_dim,
        },
    )
    conv = b.op1(
        "causal_conv1d",
        [qkv, b.weight(f"{p}.conv1d.weight")],
        {"layer": i, "kernel_size": s.conv_kernel, "cache": cache},
        f"{n}.qkv_conv",
    )
    q, k, v = b.op("split", [conv], {"sizes": [kd, kd, vd]}, [f"{n}.lq", f"{n}.lk", f"{n}.lv"])
    gg, beta = b.op(
        "gdn_gates",
        [a, bb, b.weight(f"{p}.A_log"), b.weight(f"{p}.dt_bias")],
        None,
        [f"{n}.g", f"{n}.beta"],
    )
    o = b.op1(
        "gated_delta_rule",
        [q, k, v, gg, beta],
        {
            "layer": i,
            "k_heads": s.lin_k_heads,
            "v_heads": s.lin_v_heads,
            "k_dim": s.lin_k_dim,
            "v_dim": s.lin_v_dim,
            "cache": cache,
        },
        f"{n}.delta",
    )
    o = b.op1(
        "gated_rmsnorm",
        [o, z, b.weight(f"{p}.norm.weight")],
        {"eps": s.eps, "head_dim": s.lin_v_dim},
        f"{n}.delta_normed",
    )
    return linear(b, o, f"{p}.out_proj", f"{n}.attn_out", f"{n}.attn_out", "o")
