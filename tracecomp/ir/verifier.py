"""The IR verifier: `verify(graph)` checks the invariants every pass and backend relies on.

Checked, op by op in order:
- dominance: every operand is a graph input or a result of an earlier op; outputs too;
- wiring: each result points back to its op and index; no value is defined twice;
- names: `tc.constant` (one ndarray `value` attribute matching its result type) or
  `tc.<full name>` of an ops.yaml entry;
- arguments: the operands and attributes rebuild the schema's arguments
  (`OpDef.arguments_from`);
- types: the recorded result types equal what the table's shape rules infer.  Composite
  ops are exempt: their types come from tracing their decomposition, which needs the
  tensor API that ir/ does not import.
Each failure raises IRError saying what is wrong, expected versus actual, how to fix it
where that is known, and the offending op's printed line.
"""
from __future__ import annotations

import difflib
import os
from typing import Any, NoReturn

import numpy as np

from ..core.errors import IRError, TracecompError
from ..ops import rules
from ..ops.table import OpDef, by_ir_name
from .graph import CONSTANT, Graph, Op, Value
from .printer import print_graph
from ..core.types import TensorType


def verify(graph: Graph) -> None:
    """Raise IRError at the first broken invariant of `graph`; return None if it holds."""
    _Verifier(graph).run()


class _Verifier:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.defined: set[Value] = set()
        self.definer = {r: (i, op) for i, op in enumerate(graph.ops) for r in op.results}
        self._lines: list[str] | None = None

    def run(self) -> None:
        for i, v in enumerate(self.graph.inputs):
            if v.op is not None or v in self.defined:
                self.fail(None, None, f"input #{i} is not a fresh input value",
                          "a value with no defining op, listed once", repr(v),
                          hint="create inputs with Graph(name, types) or Graph.add_input")
            self.defined.add(v)
        for i, op in enumerate(self.graph.ops):
            self.check_operands(i, op)
            self.check_results(i, op)
            self.check_op(i, op)
            self.defined.update(op.results)
        for j, v in enumerate(self.graph.outputs):
            if v not in self.defined:
                self.fail(None, None, f"output #{j} ({v!r}) is not defined in the graph",
                          "a graph input or a result of one of the graph's ops",
                          hint="outputs are set after the ops that compute them are added")

    # ------------------------------------------------------------ structure

    def check_operands(self, i: int, op: Op) -> None:
        for j, v in enumerate(op.operands):
            if v in self.defined:
                continue
            if v in self.definer and self.definer[v][0] >= i:
                k, producer = self.definer[v]
                where = ("by this op itself" if k == i
                         else f"later, by op #{k} '{producer.name}' at {producer.loc}")
                self.fail(i, op, f"operand #{j} is used before it is defined",
                          "every operand defined by a graph input or an earlier op", f"defined {where}",
                          hint=_reorder_hint(self.graph))
            self.fail(i, op, f"operand #{j} ({v!r}) is not defined in this graph",
                      "a graph input or a result of an earlier op",
                      "a value from no input or op of this graph (from another graph, or from "
                      "an op a pass removed without replacing its uses?)")

    def check_results(self, i: int, op: Op) -> None:
        for j, r in enumerate(op.results):
            if r.op is not op or r.index != j:
                self.fail(i, op, f"result #{j} is not wired to this op",
                          f"value.op is this op and value.index == {j}",
                          f"value.op is {r.op!r}, value.index == {r.index}",
                          hint="create ops with Graph.add_op, which wires results")
            if r in self.defined:
                self.fail(i, op, f"result #{j} is already defined earlier (SSA values are defined once)")

    # ------------------------------------------------------------ semantics

    def check_op(self, i: int, op: Op) -> None:
        if op.name == CONSTANT:
            return self.check_constant(i, op)
        opdef = by_ir_name().get(op.name)
        if opdef is None:
            close = _close_names(op.name, list(by_ir_name()) + [CONSTANT])
            self.fail(i, op, f"unknown op '{op.name}'",
                      "'tc.constant' or 'tc.' + the full name of an ops.yaml entry",
                      hint=f"did you mean {' or '.join(repr(c) for c in close)}?" if close else None)
        try:
            args = opdef.arguments_from([v.type for v in op.operands], op.attrs)
        except ValueError as e:
            self.fail(i, op, f"its operands and attributes do not match the schema: {e}",
                      f"the arguments of {opdef.schema} ({opdef.where})",
                      hint="Tensor arguments are operands in schema order (or attributes holding a "
                      "scalar or None), every other argument is an attribute")
        if opdef.kind == "composite":
            return None
        self.check_types(i, op, opdef, args)

    def check_types(self, i: int, op: Op, opdef: OpDef, args: dict[str, Any]) -> None:
        try:
            expected = rules.infer(opdef, args)
        except (TracecompError, TypeError, ValueError, KeyError, IndexError) as e:
            self.fail(i, op, f"the shape rule of '{opdef.full_name}' ({opdef.where}) rejects "
                      f"its arguments: {e}")
        actual = [r.type for r in op.results]
        if expected != actual:
            self.fail(i, op, f"the recorded result types do not match the shape rule of "
                      f"'{opdef.full_name}' ({opdef.where})", _types(expected), _types(actual),
                      hint="result types must come from tracecomp.ops.rules.infer")

    def check_constant(self, i: int, op: Op) -> None:
        value = op.attrs.get("value")
        if op.operands or list(op.attrs) != ["value"] or not isinstance(value, np.ndarray):
            self.fail(i, op, "a constant takes no operands and exactly one attribute",
                      "no operands and attrs {'value': <ndarray>}",
                      f"{len(op.operands)} operand(s) and attrs {sorted(op.attrs)}")
        if len(op.results) != 1:
            self.fail(i, op, "a constant has exactly one result", "1 result", f"{len(op.results)}")
        t = op.results[0].type
        if value.shape != t.shape or value.dtype != t.dtype.np:
            self.fail(i, op, "the constant's value does not match its result type", str(t),
                      f"an array of shape {value.shape} and dtype {value.dtype}")

    # ------------------------------------------------------------ reporting

    def fail(self, i: int | None, op: Op | None, what: str, expected: str | None = None,
             actual: str | None = None, hint: str | None = None) -> NoReturn:
        head = f"verify @{self.graph.name}: "
        if op is not None:
            head += f"op #{i} '{op.name}'" + (f" at {op.loc}: " if op.loc else ": ")
        lines = [head + what]
        if expected is not None:
            lines.append(f"  expected: {expected}")
        if actual is not None:
            lines.append(f"  actual:   {actual}")
        if hint:
            lines.append(f"  fix: {hint}")
        if op is not None:
            lines += ["  the op:", f"    {self.printed(i + 1, op)}"]
        elif i is None and "output" in what:
            lines += ["  the return:", f"    {self.printed(len(self.graph.ops) + 1, None)}"]
        raise IRError("\n".join(lines))

    def printed(self, line: int, op: Op | None) -> str:
        """Line `line` of the printed graph (line 0 is the header, then one line per op)."""
        if self._lines is None:
            try:
                self._lines = print_graph(self.graph).splitlines()
            except TracecompError:     # an attribute the printer refuses: fall back to repr
                self._lines = []
        if line < len(self._lines):
            return self._lines[line].strip()
        if op is None:
            return f"return of {len(self.graph.outputs)} value(s)"
        return f"{op.name}({len(op.operands)} operands) {op.attrs!r} at {op.loc}"


def _types(types: list[TensorType]) -> str:
    return "(" + ", ".join(str(t) for t in types) + ")"


def _reorder_hint(graph: Graph) -> str:
    """Whether reordering the ops would fix a use-before-definition (the data flow is acyclic)."""
    from .nx import topological_order    # networkx only on this error path
    try:
        topological_order(graph)
    except IRError as e:
        return f"the data flow itself is broken: {e}"
    return ("the data flow is acyclic: emit ops in a topological order "
            "(tracecomp.ir.nx.topological_order(graph) gives one)")


def _close_names(name: str, names: list[str]) -> list[str]:
    """Up to three names close to `name`, best first; between equally close ones, the one
    that keeps more of its start ('tc.ad' -> 'tc.add' before 'tc.pad': typos keep the prefix)."""
    def key(c: str):
        return (-difflib.SequenceMatcher(None, name, c).ratio(), -len(os.path.commonprefix([name, c])))
    return sorted(difflib.get_close_matches(name, names, n=6), key=key)[:3]
