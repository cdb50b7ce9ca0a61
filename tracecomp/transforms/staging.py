"""Running a traced graph with value-dependent steps (library/unbacked.py) in stages.

The graph's inputs are the call's arrays, then the host steps' results (their shapes hold
the steps' fresh sizes: `move_results_last` puts them there after tracing).  Per call,
each step in trace order gets its operands from a stage program (the ops of the graph
that compute them from the call's arrays and the earlier steps' results, compiled once;
none where the operands are inputs already), runs on the host, and its results are
checked against their types; then the whole graph runs as one DynamicProgram, whose size
parameters those results carry.  A count may be 0: the programs here take sizes >= 0.

At a count of 0 a kernel may still read row -1 of a buffer of that size: cat evaluates each
piece at an index clamped into [0, size - 1] and selects afterwards.  An empty step result
therefore gets a row of zeros in front of it (valid indices), so such a read of an index
input passes its check; a temporary of count size has no such row (its value is discarded
by the select, but an index read from it could fail its check spuriously).
"""
from __future__ import annotations

import numpy as np

from ..core.errors import ShapeError
from ..core.symbolic import Dim
from ..ir import Graph, Value
from ..tensors import pytree


def move_results_last(graph: Graph, steps: list) -> int:
    """Put the steps' results after every other input (closed-over tensors are met in the
    trace after some steps); the number of other inputs."""
    results = {v for s in steps for v in s.results}
    graph.inputs = [v for v in graph.inputs if v not in results] + [v for s in steps for v in s.results]
    return len(graph.inputs) - len(results)


class StagedProgram:
    """The compiled stages of `lowered` (a stages.Lowered with `host_steps`), called like a
    compiled program."""

    def __init__(self, lowered):
        from ..runtime.compiled import DynamicProgram
        self.graph, self.steps = lowered.graph, lowered.host_steps
        self.base = len(self.graph.inputs) - sum(len(s.results) for s in self.steps)
        self.stages = [self._stage(i, type(lowered), lowered.fastmath) for i in range(len(self.steps))]
        self.final = DynamicProgram(lowered.cpu_program, lowered.fastmath, least_size=0)
        counts = {n for s in self.steps for v in s.results for d in v.type.shape if isinstance(d, Dim)
                  for n in d.names()}
        # (the traced graph: its ops are those eager runs; softmax decomposes to amax only later)
        self.empty_reductions = _empty_reductions(self.graph, counts)

    def _stage(self, i: int, lowered_type, fastmath):
        """A callable from the arrays known before step i to its operands' arrays."""
        step = self.steps[i]
        known = self.graph.inputs[:self.base] + [v for s in self.steps[:i] for v in s.results]
        if all(v in known for v in step.operands):
            return None
        sub, mapping = Graph(f"{self.graph.name}_{step.name}_stage{i}"), {}
        for v in known:
            mapping[v] = sub.add_input(v.type)
        for op in _producers(self.graph, step.operands):
            copy = sub.add_op(op.name, [mapping[v] for v in op.operands], op.attrs,
                              [r.type for r in op.results], op.loc, op.regions)
            mapping.update(zip(op.results, copy.results))
        sub.outputs = [mapping[v] for v in step.operands]
        from ..runtime.compiled import DynamicProgram
        from .pipeline import optimize
        stage = lowered_type(sub, optimize(sub), pytree.LEAF, set(), fastmath=fastmath)
        return DynamicProgram(stage.cpu_program, fastmath, least_size=0) if stage.dynamic else stage.compiled

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        arrays: dict[Value, np.ndarray] = dict(zip(self.graph.inputs[:self.base], inputs))
        for step, stage in zip(self.steps, self.stages):
            # (a stage takes every array known so far: the inputs, the earlier steps' results)
            operands = [arrays[v] for v in step.operands] if stage is None else stage(list(arrays.values()))
            results = step.fn(*[np.asarray(a) for a in operands])
            for v, a in zip(step.results, results):
                arrays[v] = _checked(step, v, a)
        inputs = [arrays[v] for v in self.graph.inputs]
        self._refuse_empty(dict(zip((d for v in self.graph.inputs for d in v.type.shape),
                                    (n for a in inputs for n in np.shape(a)))))
        return self.final(inputs)

    def _refuse_empty(self, sizes: dict) -> None:
        """A max/min/arg-reduction over a count that is 0 raises as it does eagerly (the
        compiled loop would return its start value)."""
        for name, dims, where in self.empty_reductions:
            for d in dims:
                if sizes.get(d) == 0:
                    raise ShapeError(f"{name}: cannot reduce over an empty dim (the value-dependent "
                                     f"size {d} is 0)\n  at {where}")


_NO_IDENTITY = ("max", "min", "amax", "amin", "argmax", "argmin", "aminmax")


def _empty_reductions(graph: Graph, counts: set) -> list:
    """(op, the count Dims it reduces over, its location) of the graph's reductions that
    have no value for an empty dim (eagerly an error)."""
    out = []
    for op in graph.ops:
        base = op.name.removeprefix("tc.").split(".")[0]
        source = op.loc.source if op.loc is not None else None
        if base not in _NO_IDENTITY or not op.operands or source is not None and \
                source.removeprefix("tc.").split(".")[0] not in _NO_IDENTITY + ("logsumexp",):
            continue        # (a composite such as softmax returns early on no elements, eagerly)
        shape = op.operands[0].type.shape
        dims = op.attrs.get("dim")
        dims = range(len(shape)) if dims is None else [dims] if isinstance(dims, int) else dims
        reduced = [shape[d] for d in dims if isinstance(shape[d], Dim) and set(shape[d].names()) & counts]
        if reduced:
            out.append((base, reduced, op.loc))
    return out


def _producers(graph: Graph, values: list[Value]) -> list:
    """The ops that `values` depend on, in graph order."""
    needed, wanted = set(), set(values)
    for op in reversed(graph.ops):
        if any(r in wanted for r in op.results):
            needed.add(op)
            wanted.update(op.operands)
    return [op for op in graph.ops if op in needed]


def _checked(step, v: Value, a: np.ndarray) -> np.ndarray:
    """A step's result as its graph input takes it: its dtype, and its static dims as traced
    (output_size given to repeat_interleave is one), C-contiguous."""
    a = np.array(a, dtype=v.type.dtype.np, order="C", copy=None)     # (ascontiguousarray makes 0-d 1-d)
    shape = v.type.shape
    if a.ndim != len(shape) or any(not isinstance(d, Dim) and d != n for d, n in zip(shape, a.shape)):
        raise ShapeError(f"{step.name}: its result has shape {list(a.shape)}, but the trace expected "
                         f"{list(shape)}\n  at {step.where}")
    if a.size == 0 and a.ndim:
        # the kernels clamp a speculative read (cat's other arm) into [0, size - 1], which is
        # row -1 of an empty count: give it a row of zeros there, valid indices
        row = np.zeros((1,) + a.shape[1:], a.dtype)     # (NumPy's [1:] of it keeps the row's address)
        return np.ndarray(a.shape, a.dtype, row, row.nbytes)
    return a
