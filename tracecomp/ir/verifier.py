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
  tensor API that ir/ does not import;
- regions: only ops of ops.yaml's `kind: region` hold regions; their regions (block
  arguments and yields) and results must fit their operands (ir/regions.py `check`, in
  place of a shape rule); then each region is verified as a graph of its own by these
  same rules (recursively), and is isolated from above: an operand or output inside it
  that is a value of an enclosing graph is an error.
Each failure raises IRError saying what is wrong, expected versus actual, how to fix it
where that is known, and the offending op's printed line (an op with regions on one
line, its regions elided; names as in the whole function's text).  A failure inside a
region says first which op and region it is in.
"""
from __future__ import annotations

import difflib
import os
from typing import Any, NoReturn

import numpy as np

from ..core.errors import IRError, TracecompError
from ..ops import rules
from ..ops.table import OpDef, by_ir_name
from . import regions as R
from .graph import CONSTANT, Graph, Op, Value
from .printer import YIELD, format_op, return_line, value_names, yield_line
from ..core.types import TensorType


def verify(graph: Graph) -> None:
    """Raise IRError at the first broken invariant of `graph`; return None if it holds."""
    _Verifier(graph).run()


class _Verifier:
    def __init__(self, graph: Graph, parent: "_Verifier | None" = None, path: tuple[str, ...] = ()):
        self.graph = graph
        self.parent = parent          # the verifier of the graph whose op holds this region
        self.path = path              # ("op #2 'tc.scan' at f.py:3", "region 'body'", ...)
        self.root: Graph = parent.root if parent else graph
        self.defined: set[Value] = set()
        self.definer = {r: (i, op) for i, op in enumerate(graph.ops) for r in op.results}
        self._names: dict[Value, str] | None = None

    def outer_definition(self, v: Value) -> str | None:
        """Where an enclosing graph defines `v` (None if none does): isolation's message."""
        level = self.parent
        while level is not None:
            if v in level.definer:
                k, producer = level.definer[v]
                return f"op #{k} '{producer.name}'" + (f" at {producer.loc}" if producer.loc else "")
            if v in level.graph.inputs:
                k = level.graph.inputs.index(v)
                if level.parent is None:
                    return f"the function's argument #{k}"
                return f"block argument #{k} of the enclosing {level.path[-1]}"
            level = level.parent
        return None

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
            if v in self.defined:
                continue
            self.check_isolated(None, None, f"output #{j}", v, "a result of one of its ops")
            self.fail(None, None, f"output #{j} ({v!r}) is not defined in the graph",
                      "a graph input or a result of one of the graph's ops",
                      hint="outputs are set after the ops that compute them are added")

    # ------------------------------------------------------------ structure

    def check_isolated(self, i, op, what: str, v: Value, defined: str) -> None:
        """Fail if `v`, not defined in this region, is a value of a graph around it."""
        outer = self.outer_definition(v)
        if outer is not None:
            self.fail(i, op, f"{what} ({self.name(v)}) is defined outside the region, by {outer}: "
                      "regions are isolated from above",
                      f"a block argument of the region or {defined}", hint=_ISOLATION_HINT)

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
            self.check_isolated(i, op, f"operand #{j}", v, "a result of an earlier op in it")
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
        opdef = by_ir_name().get(op.name)
        if op.regions and (op.name == CONSTANT or (opdef is not None and opdef.kind != "region")):
            self.fail(i, op, f"it holds {len(op.regions)} region(s), but only ops of kind 'region' "
                      f"in ops.yaml (tc.scan, tc.while_loop, tc.cond) hold regions", "no regions")
        if op.name == CONSTANT:
            return self.check_constant(i, op)
        if opdef is None:
            close = _close_names(op.name, list(by_ir_name()) + [CONSTANT])
            hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else None
            if op.name == YIELD:
                hint = (f"'{YIELD}' exists only in the text, as a region's terminator: a region "
                        f"graph yields its outputs")
            self.fail(i, op, f"unknown op '{op.name}'",
                      "'tc.constant' or 'tc.' + the full name of an ops.yaml entry", hint=hint)
        try:
            args = opdef.arguments_from([v.type for v in op.operands], op.attrs)
        except ValueError as e:
            self.fail(i, op, f"its operands and attributes do not match the schema: {e}",
                      f"the arguments of {opdef.schema} ({opdef.where})",
                      hint="Tensor arguments are operands in schema order (or attributes holding a "
                      "scalar or None), every other argument is an attribute")
        if opdef.kind == "composite":
            return None
        if opdef.kind == "region":
            return self.check_regions(i, op, opdef)
        self.check_types(i, op, opdef, args)

    def check_regions(self, i: int, op: Op, opdef: OpDef) -> None:
        """How the regions fit the op (their block arguments and yields: the interface),
        then each region as a graph of its own."""
        try:
            R.check(op, opdef.regions)
        except R.RegionError as e:
            self.fail(i, op, str(e), hint="ir/regions.py gives each region op's operands, block "
                      "arguments, yields and results")
        at = f" at {op.loc}" if op.loc else ""
        for label, region in zip(opdef.regions, op.regions):
            _Verifier(region, self, self.path + (f"op #{i} '{op.name}'{at}", f"region '{label}'")).run()

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
        head = f"verify @{self.root.name}: " + (f"in {', '.join(self.path)}: " if self.path else "")
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
            lines += ["  the op:", f"    {self.printed(op)}"]
        elif i is None and "output" in what:
            what = "the return" if self.parent is None else "the region's terminator"
            lines += [f"  {what}:", f"    {self.printed(None)}"]
        raise IRError("\n".join(lines))

    def names(self) -> dict[Value, str]:
        """Each value's name in the whole function's text (computed once, on a failure)."""
        if self.parent is not None:
            return self.parent.names()
        if self._names is None:
            self._names = value_names(self.graph)
        return self._names

    def name(self, v: Value) -> str:
        return self.names().get(v) or repr(v)

    def printed(self, op: Op | None) -> str:
        """The op's text (one line, regions elided), or the return / yield's."""
        names = dict(self.names())      # printing names undefined values %undefN: a copy's
        try:
            if op is not None:
                return format_op(op, names)
            return (return_line if self.parent is None else yield_line)(self.graph, names)
        except TracecompError:     # an attribute the printer refuses: fall back to repr
            if op is None:
                return f"return of {len(self.graph.outputs)} value(s)"
            return f"{op.name}({len(op.operands)} operands) {op.attrs!r} at {op.loc}"


_ISOLATION_HINT = ("pass the value in as an operand of the region op (one of its consts) "
                   "and use the block argument it becomes")


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
