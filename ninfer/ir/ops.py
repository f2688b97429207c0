"""Op signatures: arity, required attributes and the output types each op produces.

`infer(input_types, attrs) -> output types` states an op's contract; the verifier checks every
op's declared output types against it, so a pass that rewires a graph wrongly fails loudly.
Shapes below use T for tokens of the step and R for rows that return logits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ninfer.ir.types import TensorType

Types = list[TensorType]


class SignatureError(ValueError):
    """An op's inputs or attributes do not match its signature."""


@dataclass(frozen=True)
class OpSig:
    kind: str
    inputs: tuple[str, ...]  # input names; a trailing "?" marks an optional last input
    outputs: tuple[str, ...]
    attrs: tuple[str, ...]  # required attribute names
    infer: Callable[[Types, dict[str, Any]], Types]
    doc: str = ""

    def arity(self) -> tuple[int, int]:
        opt = sum(1 for n in self.inputs if n.endswith("?"))
        return len(self.inputs) - opt, len(self.inputs)


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise SignatureError(msg)


def _rows(t: TensorType) -> Any:
    _need(t.rank == 2, f"expected a 2-D [rows, features] tensor, got {t}")
    return t.shape[0]


def _embed(ts: Types, a: dict) -> Types:
    tok, table = ts
    _need(tok.dtype in ("i32", "i64") and tok.rank == 1, f"token ids must be int [T], got {tok}")
    _need(table.rank == 2, f"embedding table must be [V,H], got {table}")
    return [TensorType(a["dtype"], (tok.shape[0], table.shape[1]))]


def _norm(ts: Types, a: dict) -> Types:
    x, w = ts[0], ts[-1]
    _need(w.rank == 1, f"norm weight must be 1-D, got {w}")
    width = a.get("head_dim") or x.shape[-1]
    _need(w.shape[0] == width, f"norm weight {w} does not match width {width}")
    if a.get("head_dim"):
        _need(
            isinstance(x.shape[-1], int) and x.shape[-1] % a["head_dim"] == 0,
            f"{x} not a multiple of head_dim",
        )
    return [x]


def _add_norm(ts: Types, a: dict) -> Types:
    x, r, w = ts
    _need(x == r, f"residual add of {x} and {r}")
    _need(w.rank == 1 and w.shape[0] == x.shape[-1], f"norm weight {w} does not match {x}")
    return [x, x]


def _same(ts: Types, a: dict) -> Types:
    _need(ts[0] == ts[1], f"elementwise op on {ts[0]} and {ts[1]}")
    return [ts[0]]


def _linear(ts: Types, a: dict) -> Types:
    x, w = ts[0], ts[1]
    _need(w.rank == 2, f"linear weight must be [N,K], got {w}")
    width = w.shape[1]
    if a.get("act") is not None:  # fuse_swiglu_linear: the input is [gate | up]
        _need(a["act"] == "swiglu", f"linear: unknown input activation {a['act']!r}")
        width = 2 * w.shape[1]
    _need(x.shape[-1] == width, f"linear: input {x} does not match weight {w}")
    if len(ts) == 3:
        _need(
            ts[2].rank == 1 and ts[2].shape[0] == w.shape[0],
            f"linear bias {ts[2]} does not match {w}",
        )
    n = w.shape[0]
    if a.get("out") is not None:  # fuse_swiglu_linear: the weight is [gate; up]
        _need(a["out"] == "swiglu", f"linear: unknown output activation {a['out']!r}")
        _need(n % 2 == 0 and len(ts) == 2, f"linear out=swiglu needs [gate; up] rows, got {w}")
        n //= 2
    return [TensorType(x.dtype, (*x.shape[:-1], n))]


def _split(ts: Types, a: dict) -> Types:
    (x,) = ts
    sizes = a["sizes"]
    _need(sum(sizes) == x.shape[-1], f"split sizes {sizes} do not add up to {x}")
    return [x.with_shape(*x.shape[:-1], s) for s in sizes]


def _split_gated_q(ts: Types, a: dict) -> Types:
    (x,) = ts
    h, d = a["heads"], a["head_dim"]
    _need(x.shape[-1] == 2 * h * d, f"gated q {x} is not [T, heads*2*head_dim]")
    out = x.with_shape(*x.shape[:-1], h * d)
    return [out, out]


def _rotary(ts: Types, a: dict) -> Types:
    q, k, pos = ts
    if "mrope_axes" in a["rope"]:  # multimodal rotary: a (temporal, height, width) position each
        _need(
            pos.rank == 2 and pos.shape[0] == 3 and pos.dtype in ("i32", "i64"),
            f"MRoPE positions must be int [3, T], got {pos}",
        )
        _need(len(a["rope"]["mrope_axes"]) == a["rotary_dim"] // 2, "mrope_axes per frequency")
    else:
        _need(
            pos.rank == 1 and pos.dtype in ("i32", "i64"), f"positions must be int [T], got {pos}"
        )
    _need(a["rotary_dim"] <= a["head_dim"] and a["rotary_dim"] % 2 == 0, "bad rotary_dim")
    return [q, k]


# attention's folded prologues (passes/fuse_attention_prologue.py): the inputs after q, k, v
ATTENTION_PROLOGUES = {
    "rotary": ("positions",),
    "qk_norm+rotary": ("positions", "q_norm", "k_norm"),
}


def _attention(ts: Types, a: dict) -> Types:
    q, k, v, *extra = ts
    hd = a["head_dim"]
    _need(q.shape[-1] == a["heads"] * hd, f"attention q {q} is not [T, heads*head_dim]")
    _need(
        k.shape[-1] == a["kv_heads"] * hd and v == k,
        f"attention k/v {k} {v} are not [T, kv_heads*head_dim]",
    )
    _need(a["heads"] % a["kv_heads"] == 0, "heads must be a multiple of kv_heads")
    prologue = a.get("prologue")
    if prologue is None:
        _need(not extra, "attention: inputs after q, k, v need a folded prologue")
        return [q]
    names = ATTENTION_PROLOGUES.get(prologue)
    _need(names is not None, f"attention: unknown prologue {prologue!r}")
    _need(
        len(extra) == len(names), f"attention prologue {prologue} takes q, k, v, {', '.join(names)}"
    )
    _need("rope" in a and "rotary_dim" in a, "attention prologue needs rope and rotary_dim")
    _rotary([q, k, extra[0]], a)
    _need(extra[0].shape[-1] == q.shape[0], f"positions {extra[0]} do not match {q}")
    if prologue == "qk_norm+rotary":
        _need("eps" in a and "zero_centered" in a, "attention qk_norm needs eps and zero_centered")
        for w in extra[1:]:
            _need(w.rank == 1 and w.shape[0] == hd, f"q/k norm weight {w} is not [head_dim]")
    return [q]


def _sigmoid_mul(ts: Types, a: dict) -> Types:
    x, g = ts
    _need(
        g.shape[-1] in (x.shape[-1], 1) and g.shape[:-1] == x.shape[:-1],
        f"gate {g} does not fit {x}",
    )
    return [x]


def _swiglu(ts: Types, a: dict) -> Types:
    (x,) = ts
    _need(
        isinstance(x.shape[-1], int) and x.shape[-1] % 2 == 0, f"swiglu input {x} must be [T, 2I]"
    )
    return [x.with_shape(*x.shape[:-1], x.shape[-1] // 2)]


def _router(ts: Types, a: dict) -> Types:
    x, w = ts
    _need(w.rank == 2 and w.shape[1] == x.shape[-1], f"router weight {w} does not match {x}")
    _need(a["top_k"] <= w.shape[0], "top_k larger than the number of experts")
    t = _rows(x)
    return [TensorType("f32", (t, a["top_k"])), TensorType("i32", (t, a["top_k"]))]


def _experts(ts: Types, a: dict) -> Types:
    x, topw, topi, *ws = ts
    e, inter, h = a["experts"], a["inter"], x.shape[-1]
    _need(topw.shape == topi.shape and topi.dtype == "i32", f"routing {topw} {topi}")
    if len(ws) == 3:
        _need(
            ws[0].shape == (e, inter, h) and ws[1].shape == (e, inter, h),
            f"expert gate/up {ws[0]} {ws[1]}",
        )
    else:
        _need(ws[0].shape == (e, 2 * inter, h), f"expert gate_up {ws[0]} is not [E, 2I, H]")
    _need(ws[-1].shape == (e, h, inter), f"expert down {ws[-1]} is not [E, H, I]")
    return [x]


def _conv(ts: Types, a: dict) -> Types:
    x, w = ts
    c = x.shape[-1]
    _need(w.shape[0] == c and w.shape[-1] == a["kernel_size"], f"conv weight {w} does not fit {x}")
    return [x]


def _gdn_gates(ts: Types, a: dict) -> Types:
    av, bv, a_log, dt = ts
    _need(av == bv and a_log.shape == dt.shape == (av.shape[-1],), f"gates {av} {bv} {a_log} {dt}")
    f32 = TensorType("f32", av.shape)
    return [f32, f32]


def _gdr(ts: Types, a: dict) -> Types:
    q, k, v, g, beta = ts
    _need(q == k and q.shape[-1] == a["k_heads"] * a["k_dim"], f"delta rule q/k {q} {k}")
    _need(v.shape[-1] == a["v_heads"] * a["v_dim"], f"delta rule v {v}")
    _need(g.shape[-1] == a["v_heads"] and beta.shape == g.shape, f"delta rule gates {g} {beta}")
    _need(a["v_heads"] % a["k_heads"] == 0, "v_heads must be a multiple of k_heads")
    return [v]


def _gated_norm(ts: Types, a: dict) -> Types:
    x, z, w = ts
    _need(x == z and w.shape == (a["head_dim"],), f"gated norm {x} {z} {w}")
    return [x]


def _select(ts: Types, a: dict) -> Types:
    x, rows = ts
    _need(rows.rank == 1 and rows.dtype in ("i32", "i64"), f"row indices {rows}")
    return [x.with_shape(rows.shape[0], *x.shape[1:])]


def _logits(ts: Types, a: dict) -> Types:
    (t,) = _linear(ts, a)
    return [TensorType("f32", t.shape)]


def _all_reduce(ts: Types, a: dict) -> Types:
    _need(a["parts"] >= 2, f"all_reduce over {a['parts']} ranks")
    return [ts[0]]


def _all_gather(ts: Types, a: dict) -> Types:
    (x,) = ts
    size, parts = a["size"], a["parts"]
    _need(parts >= 2, f"all_gather over {parts} ranks")
    piece = -(-size // parts)  # every rank's part, the last ones' padded up to it
    _need(
        isinstance(x.shape[-1], int) and x.shape[-1] <= piece,
        f"all_gather: {x} is not a 1/{parts} part of {size}",
    )
    return [x.with_shape(*x.shape[:-1], size)]


SIGNATURES: dict[str, OpSig] = {
    s.kind: s
    for s in [
        OpSig("embed", ("tokens", "table"), ("x",), ("dtype",), _embed, "x[t] = table[tokens[t]]"),
        OpSig(
            "rmsnorm",
            ("x", "w"),
            ("y",),
            ("eps", "zero_centered"),
            _norm,
            "y = x/rms(x) * w  (zero_centered: * (1 + w)); with head_dim, per head",
        ),
        OpSig(
            "add_rmsnorm",
            ("x", "residual", "w"),
            ("y", "sum"),
            ("eps", "zero_centered"),
            _add_norm,
            "sum = x + residual; y = rmsnorm(sum)",
        ),
        OpSig("add", ("a", "b"), ("y",), (), _same, "y = a + b"),
        OpSig("linear", ("x", "w", "bias?"), ("y",), (), _linear, "y = x @ w.T (+ bias)"),
        OpSig("logits", ("x", "w"), ("y",), (), _logits, "f32 logits = x @ w.T"),
        OpSig("split", ("x",), ("*",), ("sizes",), _split, "split the last dim into sizes"),
        OpSig(
            "split_gated_q",
            ("x",),
            ("q", "gate"),
            ("heads", "head_dim"),
            _split_gated_q,
            "per head [query | gate] -> query, gate",
        ),
        OpSig(
            "rotary",
            ("q", "k", "positions"),
            ("q", "k"),
            ("head_dim", "rotary_dim", "rope"),
            _rotary,
            "rotate-half rotary on the first rotary_dim of every head",
        ),
        OpSig(
            "attention",
            ("q", "k", "v", "positions?", "q_norm?", "k_norm?"),
            ("o",),
            ("layer", "heads", "kv_heads", "head_dim", "scale", "cache"),
            _attention,
            "write k/v into the paged cache, causal attention over each sequence's pages; with "
            "a `prologue` attr, first per-head q/k rmsnorm (qk_norm+rotary) and rotary",
        ),
        OpSig("sigmoid_mul", ("x", "gate"), ("y",), (), _sigmoid_mul, "y = x * sigmoid(gate)"),
        OpSig("silu_mul", ("gate", "up"), ("y",), (), _same, "y = silu(gate) * up"),
        OpSig(
            "swiglu",
            ("gate_up",),
            ("y",),
            (),
            _swiglu,
            "y = silu(gate) * up for gate_up = [gate | up]",
        ),
        OpSig(
            "moe_router",
            ("x", "w"),
            ("top_w", "top_i"),
            ("top_k", "normalize"),
            _router,
            "softmax(x @ w.T) in f32, top-k, renormalised when normalize",
        ),
        OpSig(
            "moe_experts",
            ("x", "top_w", "top_i", "w_gate", "w_up", "w_down"),
            ("y",),
            ("experts", "inter"),
            _experts,
            "sum_k top_w * down_e(silu(gate_e x) * up_e x)",
        ),
        OpSig(
            "moe_experts_gu",
            ("x", "top_w", "top_i", "w_gate_up", "w_down"),
            ("y",),
            ("experts", "inter"),
            _experts,
            "moe_experts with gate|up fused into one [E, 2I, H] weight",
        ),
        OpSig(
            "causal_conv1d",
            ("x", "w"),
            ("y",),
            ("layer", "kernel_size", "cache"),
            _conv,
            "depthwise causal conv over each sequence (tail kept in the state slot), then SiLU",
        ),
        OpSig(
            "gdn_gates",
            ("a", "b", "A_log", "dt_bias"),
            ("g", "beta"),
            (),
            _gdn_gates,
            "g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b)  (f32)",
        ),
        OpSig(
            "gated_delta_rule",
            ("q", "k", "v", "g", "beta"),
            ("o",),
            ("layer", "k_heads", "v_heads", "k_dim", "v_dim", "cache"),
            _gdr,
            "L2-normalised q/k, gated delta rule over each sequence's state slot",
        ),
        OpSig(
            "gated_rmsnorm",
            ("x", "z", "w"),
            ("y",),
            ("eps", "head_dim"),
            _gated_norm,
            "per head: x/rms(x) * w * silu(z)",
        ),
        OpSig("select_rows", ("x", "rows"), ("y",), (), _select, "y = x[rows]"),
        OpSig(
            "all_reduce",
            ("x",),
            ("y",),
            ("parts",),
            _all_reduce,
            "y = sum of x over the tensor-parallel ranks (every rank gets y)",
        ),
        OpSig(
            "all_gather",
            ("x",),
            ("y",),
            ("parts", "size"),
            _all_gather,
            "y = the ranks' parts of the last dim concatenated in rank order, `size` wide",
        ),
    ]
}

# the vision tower's ops and media_merge (ops_vision.py imports OpSig from here)
from ninfer.ir.ops_vision import VISION_SIGNATURES

SIGNATURES.update((s.kind, s) for s in VISION_SIGNATURES)

COLLECTIVE_OPS = ("all_reduce", "all_gather")  # torch.distributed collectives: kernel `dist.<op>`
VIEW_OPS = ("split", "split_gated_q")  # views of their input: kernel `view.split`, no launch


def signature(kind: str) -> OpSig:
    try:
        return SIGNATURES[kind]
    except KeyError:
        raise SignatureError(f"unknown op kind {kind!r}") from None


def infer(kind: str, input_types: Types, attrs: dict[str, Any]) -> Types:
    """Output types of an op, or SignatureError naming what does not fit."""
    sig = signature(kind)
    lo, hi = sig.arity()
    _need(lo <= len(input_types) <= hi, f"{kind}: takes {lo}..{hi} inputs, got {len(input_types)}")
    missing = [a for a in sig.attrs if a not in attrs]
    _need(not missing, f"{kind}: missing attributes {missing}")
    return sig.infer(input_types, attrs)
