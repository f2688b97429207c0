"""Typed graph IR: tensor types, ops with signatures, builders per architecture, verifier,
stable text printer. Imports nothing of the runtime and never torch."""

from ninfer.ir.graph import Graph, Op, Weight
from ninfer.ir.printer import print_graph
from ninfer.ir.types import TensorType
from ninfer.ir.verify import VerifyError, verify

__all__ = ["Graph", "Op", "TensorType", "VerifyError", "Weight", "print_graph", "verify"]
