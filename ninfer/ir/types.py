"""Tensor types of the IR: an element dtype and a shape of integer or symbolic dimensions.

Symbolic dimensions are short names bound per step by the runtime:

    T  tokens computed in the step (all chunks, prefill and decode rows together)
    R  rows that return logits (one per chunk that wants them)
    K  top-k experts chosen per token (MoE)

A `TensorType` prints as `f32[T,64]`; the printer and verifier rely on that stable form.
"""

from __future__ import annotations

from dataclasses import dataclass

Dim = int | str

# Element dtypes. Weight values carry their *storage* format separately (see graph.Weight);
# their dtype here is the dtype a kernel reads after any dequantisation.
DTYPES = ("f32", "bf16", "f16", "i32", "i64")

# Compute-dtype names as users spell them -> IR dtype.
COMPUTE_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}

DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "i32": 4, "i64": 8}


@dataclass(frozen=True)
class TensorType:
    """dtype + shape. Shapes are tuples of ints and symbolic names (`"T"`, `"R"`)."""

    dtype: str
    shape: tuple[Dim, ...]

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}")
        for d in self.shape:
            if not (isinstance(d, str) or (isinstance(d, int) and d >= 0)):
                raise ValueError(f"bad dimension {d!r} in {self.shape}")

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"

    @property
    def rank(self) -> int:
        return len(self.shape)

    def with_shape(self, *shape: Dim) -> TensorType:
        return TensorType(self.dtype, tuple(shape))

    def numel(self, bindings: dict[str, int]) -> int:
        """Element count with symbolic dims bound (`bindings["T"] = 512`)."""
        n = 1
        for d in self.shape:
            n *= bindings[d] if isinstance(d, str) else d
        return n

    def nbytes(self, bindings: dict[str, int]) -> int:
        return self.numel(bindings) * DTYPE_BYTES[self.dtype]

    @staticmethod
    def parse(text: str) -> TensorType:
        """Inverse of `str()`: `"f32[T,64]"` -> TensorType("f32", ("T", 64))."""
        dtype, rest = text.split("[", 1)
        body = rest.rstrip("]")
        dims: list[Dim] = []
        for part in body.split(",") if body else []:
            dims.append(int(part) if part.lstrip("-").isdigit() else part)
        return TensorType(dtype, tuple(dims))
