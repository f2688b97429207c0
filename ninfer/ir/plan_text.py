"""The text form of a plan (what `ninfer compile` prints): a summary, and with `verbose` the
weights and every call, where the rows of identical layers are printed once.

Folding: a call belongs to the layer of its first output (`%L<i>.…`), a weight to its
`model.layers.<i>.` prefix. Inside a layer's rows `L<i>` reads `L*` and `L<i-1>` reads `L*-1`
(the residual add that joins two layers), `layers.<i>.` reads `layers.*.`, and the attrs
`layer` / `cache` lose their number, so layers that run the same kernels on the same shapes
print the same rows and are shown once: `layers 1-28 (x28):`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ninfer.ir.plan_sections import section_dict
from ninfer.ir.printer import format_attrs

if TYPE_CHECKING:
    from ninfer.ir.plan import KernelCall, Plan

_CALL_LAYER = re.compile(r"^L(\d+)\.")
_WEIGHT_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def summary_lines(plan: Plan) -> list[str]:
    L: list[str] = []
    L.append(f"plan {plan.name} ({plan.architecture}) device={plan.device} dtype={plan.dtype}")
    options = section_dict(plan.options)
    L.append("options: " + " ".join(f"{k}={options[k]}" for k in sorted(options)))
    L.append("passes: " + " -> ".join(plan.passes))
    L.append("fused: " + " ".join(f"{k}={v}" for k, v in plan.fusions.items()))
    if plan.parallel is not None:
        L.extend(parallel_lines(plan))
    if plan.model.get("declared"):
        declared = sorted(plan.model["declared"].items())
        L.append("declared: " + " ".join(f"{k}({v})" for k, v in declared))
    if plan.model.get("capture"):  # hidden states a drafter reads (CompileOptions.capture)
        L.append("capture: " + " ".join(f"{k}=%{v}" for k, v in plan.model["capture"].items()))
    if plan.model.get("media"):  # an MTP head of a vision plan (ir/models/mtp.py)
        L.append(f"media: {plan.model['media']}")
    if plan.vision is not None:
        v = plan.vision
        L.append(
            f"vision: blocks={v.blocks} hidden={v.hidden} heads={v.heads} "
            f"patch={v.temporal_patch_size}x{v.patch_size}x{v.patch_size} merge={v.merge_size} "
            f"pos_grid={v.grid_side}x{v.grid_side} out={v.out_hidden} calls={len(plan.vision_calls)} "
            "(one run per image or video) mrope=3-axis"
        )
    kv = plan.kv
    L.append(
        f"kv: dtype={kv.dtype} page_size={kv.page_size} pages={kv.num_pages} "
        f"capacity={kv.capacity_tokens} tokens layers={_ranges(kv.layers) or 'none'} "
        f"bytes/token={kv.bytes_per_token}"
    )
    if kv.k_layout is not None:
        L.append(f"  k: {kv.k_layout}")
        L.append(f"  v: {kv.v_layout}")
    st = plan.state
    if st.layers:
        L.append(
            f"state: slots={st.slots} bytes/slot={st.bytes_per_slot} layers={_ranges(st.layers)}"
        )
        L.append(f"  {st.layout}")
    else:
        L.append("state: none")
    L.append("ledger:")
    for e in plan.ledger.entries:
        L.append(f"  {e.item:<12} {e.bytes:>16,} B  {e.detail}")
    L.append(f"  {'total':<12} {plan.ledger.total:>16,} B  of budget {plan.ledger.budget:,} B")
    buckets = " ".join(map(str, plan.cuda_graph_buckets)) or "none"
    L.append(f"cuda graph buckets: {buckets}")
    L.append("kernels: " + " ".join(f"{k}x{v}" for k, v in plan.kernels.items()))
    return L + launch_lines(plan)


def parallel_lines(plan: Plan) -> list[str]:
    """Tensor parallelism: the rank, how many weights it holds a part of, and each distinct
    collective (kind, the value it moves per rank, how many calls) in first-use order."""
    p = plan.parallel
    assert p is not None
    weights = plan.weights()
    sharded = sum(1 for w in weights if w.shards)
    head = f"tensor parallel: rank {p.rank} of {p.world} (torch.distributed: nccl on cuda, "
    L = [head + f"gloo on cpu); weights: {sharded} sharded, {len(weights) - sharded} replicated"]
    seen: dict[tuple[str, str, str], int] = {}
    for c in plan.calls:
        if c.op in ("all_reduce", "all_gather"):
            where = _CALL_LAYER.sub("L*.", c.inputs[0])
            key = (
                c.op,
                where,
                f"{plan.buffers[c.inputs[0]].type} -> {plan.buffers[c.outputs[0]].type}",
            )
            seen[key] = seen.get(key, 0) + 1
    L.append(f"collectives: all_reduce x{p.all_reduce} all_gather x{p.all_gather}")
    for (op, where, types), count in seen.items():
        L.append(f"  {op:<10} x{count:<3} {where}: {types}")
    return L


def launch_lines(plan: Plan) -> list[str]:
    """The GEMMs whose kernel depends on the rows of x (`launch` attrs), one line per distinct
    weight shape and launch table: the kernel and launch shape per row range, and which of
    them each CUDA Graph decode bucket replays."""
    groups: dict[tuple, list[str]] = {}
    for c in plan.calls:
        if "launch" in c.attrs:
            w = next(n for n in c.inputs if plan.buffers[n].kind == "weight")
            act = "swiglu(x)" if c.attrs.get("act") == "swiglu" else "x"
            key = (c.kernel, plan.buffers[w].type, act, json.dumps(c.attrs["launch"]))
            groups.setdefault(key, []).append(re.sub(r"layers\.\d+\.", "layers.*.", w))
    if not groups:
        return []
    L = ["gemm launches (rows of x: kernel[launch shape]):"]
    for (kernel, wtype, act, launches), names in groups.items():
        table = json.loads(launches)
        rows = ", ".join(
            f"{_span(lo, hi)} {k}[{','.join(map(str, cfg))}]" for lo, hi, k, cfg in table
        )
        by_bucket: list[tuple[int, str]] = []
        for b in plan.cuda_graph_buckets:
            by_bucket.append((b, next((k for lo, hi, k, _ in table if lo <= b <= hi), kernel)))
        buckets = "; ".join(
            f"{_ranges([b for b, k in by_bucket if k == name])} {name}"
            for name in dict.fromkeys(k for _, k in by_bucket)
        )
        label = names[0] if len(set(names)) == 1 else f"{len(names)} weights"
        L.append(f"  x{len(names)} @{label} {wtype} @ {act}: {rows}, else {kernel}")
        if buckets:
            L.append(f"      decode graph buckets: {buckets}")
    return L


def _span(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def verbose_lines(plan: Plan) -> list[str]:
    L = ["weights:"]
    L += _folded(
        plan.weights(), lambda b: _layer_of(_WEIGHT_LAYER, b.name), _weight_row(plan), "  "
    )
    L.append("calls:")
    calls = list(enumerate(plan.calls))
    L += _folded(calls, lambda ic: _layer_of(_CALL_LAYER, ic[1].outputs[0]), _call_row(plan), "  ")
    L.append("outputs: " + ", ".join("%" + o for o in plan.outputs))
    return L


def _layer_of(pattern: re.Pattern[str], name: str) -> int | None:
    m = pattern.search(name)
    return int(m.group(1)) if m else None


def _relative(text: str, layer: int) -> str:
    """`text` with layer `layer`'s numbers replaced (see the module docstring)."""
    text = re.sub(rf"\bL{layer}\.", "L*.", text)
    if layer > 0:
        text = re.sub(rf"\bL{layer - 1}\.", "L*-1.", text)
    text = re.sub(rf"layers\.{layer}\.", "layers.*.", text)
    text = re.sub(
        rf"\bkv\.L{layer}\b|\bstate\.L{layer}\b",
        lambda m: m.group(0)[: -len(str(layer))] + "*",
        text,
    )
    return re.sub(rf"\blayer={layer}\b", "layer=*", text)


def _weight_row(plan: Plan) -> Callable[[object, int | None], str]:
    # GGUF blocks stay packed for the cpu.* kernels that read them (cpu_weights=packed); every
    # other reader gets them dequantised when the weights are loaded
    packed = {n for c in plan.calls if c.kernel.startswith("cpu.") for n in c.inputs}
    # (a float bias the same call reads stays as it is: only block formats are listed packed)

    def row(b, layer: int | None) -> str:  # b: BufferSpec
        how = b.layout if b.layout == "plain" else f"{b.layout}({len(b.sources)})"
        fmt = b.format
        if (fmt or "").startswith("gguf:"):
            fmt += " (packed)" if b.name in packed else " (dequantised at load)"
        text = f"@{b.name}: {b.type} {fmt} {how}"
        return text if layer is None else _relative(text, layer)

    return row


def _call_row(plan: Plan) -> Callable[[tuple[int, KernelCall], int | None], str]:
    def row(ic: tuple[int, KernelCall], layer: int | None) -> str:
        i, c = ic
        ins = ", ".join(("@" if plan.buffers[n].kind == "weight" else "%") + n for n in c.inputs)
        outs = ", ".join("%" + n for n in c.outputs)
        types = ", ".join(plan.buffers[n].type for n in c.outputs)
        text = f"{c.kernel:<32} {outs} = {c.op}({ins}){format_attrs(c.attrs)} : {types}"
        if layer is None:
            return f"{i:>3} {text}"
        return _relative(text, layer)

    return row


def _folded(items: Iterable, layer_of: Callable, row: Callable, indent: str) -> list[str]:
    """Rows of `items` in order; each run of one layer's items becomes a block, and a block
    identical (after `_relative`) to an earlier one is printed with it, not again."""
    blocks: list[tuple[int | None, list]] = []
    for item in items:
        layer = layer_of(item)
        if layer is None or not blocks or blocks[-1][0] != layer:
            blocks.append((layer, [item]))
        else:
            blocks[-1][1].append(item)
    bodies: dict[tuple[str, ...], list[int]] = {}
    for layer, members in blocks:
        if layer is not None:
            bodies.setdefault(tuple(row(m, layer) for m in members), []).append(layer)
    out: list[str] = []
    printed: set[tuple[str, ...]] = set()
    for layer, members in blocks:
        if layer is None:
            out += [indent + row(m, None) for m in members]
            continue
        body = tuple(row(m, layer) for m in members)
        if body in printed:
            continue
        printed.add(body)
        layers = bodies[body]
        head = (
            f"layer {layers[0]}"
            if len(layers) == 1
            else f"layers {_ranges(layers)} (x{len(layers)})"
        )
        out.append(f"{indent}{head}:")
        out += [f"{indent}  {text}" for text in body]
    return out


def _ranges(ns: list[int] | tuple[int, ...]) -> str:
    """[0, 1, 2, 4, 6, 7] -> "0-2,4,6-7"."""
    if not ns:
        return ""
    parts: list[str] = []
    start = prev = ns[0]
    for n in [*ns[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ",".join(parts)
