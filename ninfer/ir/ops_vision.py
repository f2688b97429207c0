"""Signatures of the vision-tower ops and of the two text-side ops multimodal prompts need.

Vision stage (ops carrying attrs["stage"] == "vision"; one run encodes one image or video):
P is the patch rows of the item, N = P / merge^2 its merged tokens. Text stage: M is the
placeholder rows of the step that take a vision embedding (`media_merge`); `rotary` reads
3-axis (MRoPE) positions [3, T] when its rope carries `mrope_axes`.

Registered into ninfer.ir.ops.SIGNATURES when that module loads (one vocabulary of ops).
"""

from __future__ import annotations

from typing import Any

from ninfer.ir.ops import OpSig, SignatureError, Types
from ninfer.ir.types import TensorType


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise SignatureError(msg)


def _int(t: TensorType) -> bool:
    return t.dtype in ("i32", "i64")


def _media_merge(ts: Types, a: dict[str, Any]) -> Types:
    x, emb, rows = ts
    _need(x.rank == 2 and emb.rank == 2, f"media_merge of {x} and {emb}")
    _need(emb.shape[1] == x.shape[1], f"vision embeddings {emb} do not fit the hidden {x}")
    _need(_int(rows) and rows.shape == (emb.shape[0],), f"media rows {rows} do not fit {emb}")
    return [x]


def _patch_embed(ts: Types, a: dict[str, Any]) -> Types:
    x, w, b = ts
    _need(w.rank == 5, f"patch embedding weight {w} is not [E, C, tp, p, p]")
    k = w.shape[1] * w.shape[2] * w.shape[3] * w.shape[4]
    _need(x.rank == 2 and x.shape[1] == k, f"patch rows {x} are not [P, {k}]")
    _need(b.shape == (w.shape[0],), f"patch embedding bias {b} does not fit {w}")
    return [TensorType(x.dtype, (x.shape[0], w.shape[0]))]


def _pos_interp(ts: Types, a: dict[str, Any]) -> Types:
    index, weight, table = ts
    _need(_int(index) and index.rank == 2, f"interpolation indices {index} are not int [P, taps]")
    _need(weight.shape == index.shape, f"interpolation weights {weight} do not fit {index}")
    _need(table.rank == 2, f"position table {table} is not [G*G, E]")
    return [TensorType(table.dtype, (index.shape[0], table.shape[1]))]


def _layernorm(ts: Types, a: dict[str, Any]) -> Types:
    x, w, b = ts
    _need(w.shape == b.shape == (x.shape[-1],), f"layernorm weight/bias {w} {b} do not fit {x}")
    return [x]


def _rotary_2d(ts: Types, a: dict[str, Any]) -> Types:
    q, k, pos = ts
    _need(q == k, f"2-D rotary of {q} and {k}")
    _need(_int(pos) and pos.rank == 2 and pos.shape[1] == 2, f"positions {pos} are not [P, 2]")
    _need(a["head_dim"] % 4 == 0, "2-D rotary needs head_dim divisible by 4")
    _need(q.shape[-1] % a["head_dim"] == 0, f"{q} is not a multiple of head_dim")
    return [q, k]


def _vision_attention(ts: Types, a: dict[str, Any]) -> Types:
    q, k, v = ts
    _need(q == k == v, f"vision attention q/k/v {q} {k} {v}")
    _need(q.shape[-1] == a["heads"] * a["head_dim"], f"{q} is not [P, heads*head_dim]")
    return [q]


def _gelu(ts: Types, a: dict[str, Any]) -> Types:
    _need(a["approximate"] in ("none", "tanh"), f"gelu approximate {a['approximate']!r}")
    return [ts[0]]


def _merge_rows(ts: Types, a: dict[str, Any]) -> Types:
    (x,) = ts
    g = a["rows_per_token"]
    rows = x.shape[0]
    out = rows // g if isinstance(rows, int) else a["rows"]
    return [x.with_shape(out, x.shape[1] * g)]


VISION_SIGNATURES = [
    OpSig(
        "media_merge",
        ("x", "embeds", "rows"),
        ("y",),
        (),
        _media_merge,
        "y = x with rows[i] replaced by embeds[i] (vision embeddings over placeholder tokens)",
    ),
    OpSig(
        "patch_embed",
        ("x", "w", "bias"),
        ("y",),
        (),
        _patch_embed,
        "Conv3d with stride = kernel as a GEMM: y = x @ w.reshape(E, -1).T + bias",
    ),
    OpSig(
        "pos_embed_interp",
        ("index", "weight", "table"),
        ("y",),
        (),
        _pos_interp,
        "y[p] = sum_j weight[p, j] * table[index[p, j]] (bilinear resampling of the grid)",
    ),
    OpSig(
        "layernorm",
        ("x", "w", "bias"),
        ("y",),
        ("eps",),
        _layernorm,
        "y = (x - mean) / sqrt(var + eps) * w + bias",
    ),
    OpSig(
        "rotary_2d",
        ("q", "k", "positions"),
        ("q", "k"),
        ("head_dim", "theta"),
        _rotary_2d,
        "axial rotary: half of each head by the row, half by the column of its patch (f32)",
    ),
    OpSig(
        "vision_attention",
        ("q", "k", "v"),
        ("o",),
        ("heads", "head_dim", "scale"),
        _vision_attention,
        "bidirectional attention within each segment (one image or video frame) of the item",
    ),
    OpSig("gelu", ("x",), ("y",), ("approximate",), _gelu, "y = gelu(x) (tanh: approximated)"),
    OpSig(
        "merge_rows",
        ("x",),
        ("y",),
        ("rows_per_token", "rows"),
        _merge_rows,
        "each run of `rows_per_token` rows concatenated into one: [P, E] -> [P / g, g * E] (g = rows_per_token)",
    ),
]
