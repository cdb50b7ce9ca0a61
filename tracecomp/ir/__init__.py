"""The SSA graph IR: typed values, ops named after ops.yaml, text form, verifier, passes.

This package knows nothing of tensors, dispatch or backends: a Graph is plain data.
"""
from ..core.types import TensorType
from ..core.locations import Location
from .graph import CONSTANT, Graph, Op, Value

__all__ = ["CONSTANT", "Graph", "Op", "Value", "TensorType", "Location"]
