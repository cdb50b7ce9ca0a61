"""Nodes of the eager autograd graph (seeds 002 and 004): Node, Edge, AccumulateGrad.

A tensor made by a differentiable op points at the op's node (`grad_fn`) and says which
output it is (`_output_nr`); a node's `next_edges` lead, per differentiable tensor input
of the forward op, to the node that made that input (or to the leaf's AccumulateGrad).
Running a node turns gradients of its forward outputs into gradients of its inputs by
the op's derivatives.yaml formulas.  Node classes are named like PyTorch's (`MulBackward0`).
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

from ..core.errors import TracecompError
from ..core.locations import BACKWARD
from .derivatives import Derivative
from ..tensors.tensor import Tensor


class AutogradError(TracecompError, RuntimeError):
    """Backward through a freed graph, a missing formula, a root that needs no grad, ..."""


class Edge(NamedTuple):
    node: "Node"
    input_nr: int


class Node:
    """One backward function; subclasses only rename it."""

    def __init__(self, next_edges: list[Edge | None], num_outputs: int, loc=None):
        self.next_edges = next_edges
        self.num_outputs = num_outputs     # how many gradients flow in (the forward op's outputs)
        self.loc = loc                     # the forward op's source location
        self.retained: dict[int, Any] = {}  # output_nr -> tensor that called retain_grad()

    @property
    def next_functions(self) -> tuple:
        return tuple((e.node, e.input_nr) if e else (None, 0) for e in self.next_edges)

    def name(self) -> str:
        return type(self).__name__

    @property
    def source_op(self) -> str | None:
        """The IR name of the forward op this node differentiates (None for a leaf)."""
        return None

    @property
    def origin(self):
        """The location of the ops this node records: its forward op's line, in the
        backward phase, derived from that op (None when the forward op had no location)."""
        return None if self.loc is None else self.loc.derived(BACKWARD, self.source_op)

    def __repr__(self) -> str:
        return f"<{self.name()}>"

    def apply(self, grads: list) -> list:
        raise NotImplementedError

    def release(self) -> None:
        pass


class AccumulateGrad(Node):
    """The sink for a leaf tensor: gradients arriving here are added to `variable.grad`."""

    def __init__(self, variable):
        super().__init__([], 1)
        self.variable = variable

    def apply(self, grads: list) -> list:
        return []


class FormulaNode(Node):
    """Backward of one op call: saved arguments and outputs, formulas from derivatives.yaml."""

    def __init__(self, derivative: Derivative, args: dict[str, Any], outputs: list,
                 slots: list[tuple[str, int | None]], next_edges: list[Edge | None], loc=None):
        super().__init__(next_edges, len(outputs), loc)
        self.derivative = derivative
        self.slots = slots                  # slot i: (argument name, index into a Tensor[] or None)
        self.saved: dict[str, Any] | None = dict(args)
        self.saved_outputs: list | None = list(outputs)
        self.input_types = [_slot_value(args, s)._type for s in slots]
        self.versions = _saved_versions(derivative, args, outputs)

    @property
    def source_op(self) -> str:
        return self.derivative.op.ir_name

    def release(self) -> None:
        self.saved = self.saved_outputs = None

    def apply(self, grads: list) -> list:
        from .backward import apply_formulas     # (the engine imports nodes: applying is its job)
        for name, t, version in self.versions:
            if t._version != version:
                raise AutogradError(
                    f"one of the variables needed for gradient computation has been modified by an "
                    f"inplace operation: {name} of {self.name()}, a {t.dtype.label} tensor of shape "
                    f"{t.shape}, is at version {t._version}; expected version {version} instead")
        if self.saved is None:
            raise AutogradError(
                f"trying to backward through the graph a second time (or to read the saved "
                f"tensors of {self.name()} after they were freed): its saved values were released "
                "by the first backward. Pass retain_graph=True to the first backward() if you "
                "need to backward through it again.")
        return apply_formulas(self, grads)


def _saved_versions(derivative: Derivative, args: dict, outputs: list) -> list:
    """(name, tensor, version) of each tensor the derivative's formulas read: a later
    in-place change to one of them makes this node's backward raise (PyTorch's rule)."""
    from ..ops.formula import free_names
    read: set[str] = set()
    for f in derivative.formulas:
        if f.expr is not None:
            read |= free_names(f.expr, values_only=True)
    found = []
    for name, v in args.items():
        if name in read:
            found += [(name, t, t._version) for t in (v if isinstance(v, (list, tuple)) else [v])
                      if isinstance(t, Tensor)]
    names = [r.name for r in derivative.op.schema.returns]
    for k, t in enumerate(outputs):
        name = names[k] if k < len(names) else None      # a Tensor[] return has more outputs
        if isinstance(t, Tensor) and ({"result", f"result{k}"} | ({name} if name else set())) & read:
            found.append((name or "result", t, t._version))
    return found


def _slot_value(args: dict[str, Any], slot: tuple[str, int | None]):
    name, index = slot
    return args[name] if index is None else args[name][index]


@functools.cache
def node_class(name: str) -> type:
    """A FormulaNode subclass per derivatives.yaml entry, so type(t.grad_fn).__name__ reads well."""
    return type(name, (FormulaNode,), {})
