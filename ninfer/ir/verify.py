"""The IR verifier: the invariants every phase of the pipeline must keep.

1. Names are unique across inputs, weights and op outputs (SSA), and every input of an op is
   defined before the op.
2. Every op's kind is known, its arity and attributes fit its signature, and its declared
   output types equal what the signature infers from its input types.
3. Graph outputs are defined; every cache an op names is declared in `meta["caches"]`.
4. Once kernels are assigned (`meta["kernels_assigned"]`), every op has one.
"""

from __future__ import annotations

from ninfer.ir.graph import Graph
from ninfer.ir.ops import SignatureError, infer


class VerifyError(ValueError):
    """A graph breaks an IR invariant (an internal error: passes must never produce one)."""


def verify(graph: Graph) -> Graph:
    """Check `graph`; raise VerifyError naming the first broken invariant. Returns the graph."""
    defined: set[str] = set()
    for name in list(graph.inputs) + list(graph.weights):
        if name in defined:
            raise VerifyError(f"{name!r} defined twice")
        defined.add(name)
    for name, w in graph.weights.items():
        if w.name != name:
            raise VerifyError(f"weight {name!r} is registered under a different name {w.name!r}")
        if not w.sources:
            raise VerifyError(f"weight {name!r} has no artifact sources")
    caches = graph.meta.get("caches", {})
    for i, op in enumerate(graph.ops):
        where = f"op #{i} {op.kind} -> {', '.join(op.outputs)}"
        for name in op.inputs:
            if name not in defined:
                raise VerifyError(f"{where}: input {name!r} is used before it is defined")
        try:
            expected = infer(op.kind, [graph.type_of(n) for n in op.inputs], op.attrs)
        except SignatureError as e:
            raise VerifyError(f"{where}: {e}") from None
        if len(expected) != len(op.outputs):
            raise VerifyError(
                f"{where}: produces {len(expected)} values, declares {len(op.outputs)}"
            )
        for name, t in zip(op.outputs, expected):
            if name in defined:
                raise VerifyError(f"{where}: {name!r} defined twice")
            if graph.values.get(name) != t:
                raise VerifyError(
                    f"{where}: {name!r} declared {graph.values.get(name)}, signature gives {t}"
                )
            defined.add(name)
        if "cache" in op.attrs and op.attrs["cache"] not in caches:
            raise VerifyError(f"{where}: cache {op.attrs['cache']!r} is not declared")
        if graph.meta.get("kernels_assigned") and not op.kernel:
            raise VerifyError(f"{where}: no kernel assigned")
    for name in graph.outputs:
        if name not in defined:
            raise VerifyError(f"output {name!r} is not defined")
    extra = set(graph.values) - {o for op in graph.ops for o in op.outputs}
    if extra:
        raise VerifyError(f"values without a producing op: {sorted(extra)[:3]}")
    return graph
