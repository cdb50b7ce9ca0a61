"""Graph, Op and Value: the SSA data structure every stage of the compiler shares.

Invariants (checked by the verifier): every operand is a graph input or a result of an
earlier op; op names are `tc.<op>[.<overload>]` from ops.yaml; attribute values are
one of bool, int, float, str, tuple of ints, DType or a NumPy array (constants).

An op of ops.yaml's `kind: region` (tc.scan, tc.while_loop, tc.cond) also holds
`regions`: each a Graph of its own whose inputs are the block arguments and whose
outputs are what the region yields.  Regions are isolated from above: a value from
outside reaches a region only as an operand of its op (ir/regions.py says which).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from ..core.dtypes import is_float_array_dtype
from ..core.types import TensorType
from ..core.locations import Location

CONSTANT = "tc.constant"    # the one op outside ops.yaml: a literal array, attrs {"value": array}


@dataclass(eq=False)
class Value:
    """One SSA value: a graph input (op is None) or result `index` of `op`."""
    type: TensorType
    op: "Op | None" = None
    index: int = 0

    def __repr__(self) -> str:
        producer = self.op.name if self.op else "input"
        return f"<Value {producer}#{self.index}: {self.type}>"


@dataclass(eq=False)
class Op:
    name: str
    operands: list[Value]
    attrs: dict[str, Any]
    results: list[Value] = field(default_factory=list)
    loc: Location | None = None
    regions: list["Graph"] = field(default_factory=list)    # bodies of control-flow ops

    @property
    def result(self) -> Value:
        assert len(self.results) == 1, f"{self.name} has {len(self.results)} results"
        return self.results[0]

    def __repr__(self) -> str:
        return f"<Op {self.name} at {self.loc}>"


def attrs_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for k, x in a.items():
        y = b[k]
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)
                    and x.dtype == y.dtype and x.shape == y.shape
                    and np.array_equal(x, y, equal_nan=is_float_array_dtype(x.dtype))):
                return False
        elif type(x) is not type(y) or (x != y and not (x != x and y != y)):
            return False
    return True


class Graph:
    """A function: typed inputs, ops in a valid (topological) order, outputs."""

    def __init__(self, name: str = "main", inputs: Iterable[TensorType] = ()):
        self.name = name
        self.inputs: list[Value] = [Value(t) for t in inputs]
        self.ops: list[Op] = []
        self.outputs: list[Value] = []

    def add_input(self, type: TensorType) -> Value:
        v = Value(type)
        self.inputs.append(v)
        return v

    def add_op(self, name: str, operands: list[Value], attrs: dict[str, Any],
               result_types: list[TensorType], loc: Location | None = None,
               regions: Iterable["Graph"] = ()) -> Op:
        op = Op(name, list(operands), dict(attrs), [], loc, list(regions))
        op.results = [Value(t, op, i) for i, t in enumerate(result_types)]
        self.ops.append(op)
        return op

    def users(self) -> dict[Value, list[Op]]:
        """Each value's consuming ops (outputs are not ops; see `outputs`)."""
        uses: dict[Value, list[Op]] = {}
        for op in self.ops:
            for v in op.operands:
                uses.setdefault(v, []).append(op)
        return uses

    def __eq__(self, other: object) -> bool:
        """Structural equality: same inputs, ops (names, attrs, types, locs, wiring), outputs."""
        if not isinstance(other, Graph) or self.name != other.name:
            return False
        if [v.type for v in self.inputs] != [v.type for v in other.inputs]:
            return False
        if len(self.ops) != len(other.ops) or len(self.outputs) != len(other.outputs):
            return False
        mapping = dict(zip(self.inputs, other.inputs))
        for a, b in zip(self.ops, other.ops):
            if (a.name != b.name or a.loc != b.loc or not attrs_equal(a.attrs, b.attrs)
                    or [r.type for r in a.results] != [r.type for r in b.results]
                    or len(a.operands) != len(b.operands) or a.regions != b.regions
                    or any(mapping.get(x) is not y for x, y in zip(a.operands, b.operands))):
                return False
            mapping.update(zip(a.results, b.results))
        return all(mapping.get(x) is y for x, y in zip(self.outputs, other.outputs))

    __hash__ = None  # mutable

    def __str__(self) -> str:
        from .printer import print_graph      # (the printer imports this module: a cycle by nature)
        return print_graph(self)
