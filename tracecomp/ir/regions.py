"""Ops with regions (ops.yaml `kind: region`): what each one's operands, block arguments,
yields and results are.  The one place that says it: the tracer builds these ops with it,
the verifier checks them with it, and every backend reads the operand groups from it.

A region is a Graph: its inputs are the block arguments, its outputs what it yields.
Regions are isolated from above: a value from outside reaches a region only as an
operand of the op, passed on as a block argument (the "consts").

  tc.scan {length, num_consts, num_carry, reverse}   regions (body)        MLIR's scf.for
      operands  consts..., init..., xs...        (num_consts, num_carry, the rest)
      body      (consts..., carry..., x...) -> (carry..., y...)
                where x is one row of xs (xs[i], its leading dim dropped); a carry keeps
                its init's type
      results   carry..., ys...                  ys[i] is step i's y: (length, *y.shape)
      Steps i = 0 .. length-1, or length-1 .. 0 when reversed; length 0 returns init and
      empty ys.
  tc.while_loop {num_consts}                         regions (cond, body)  MLIR's scf.while
      operands  consts..., init...
      cond      (consts..., carry...) -> (bool[],)
      body      (consts..., carry...) -> (carry...)
      results   carry...                         the first carry for which cond is false
  tc.cond                                            regions (then, else)  MLIR's scf.if
      operands  pred (bool[]), operands...
      then/else (operands...) -> (results...)    both yield the same types
      results   the yields of the branch that pred chooses
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core import dtypes as dt
from ..core.types import TensorType
from .graph import Graph, Op, Value

SCAN, WHILE, COND = "tc.scan", "tc.while_loop", "tc.cond"
BOOL_SCALAR = TensorType((), dt.BOOL)


class RegionError(ValueError):
    """A region op whose parts do not fit together; the verifier adds the op's line."""


@dataclass(frozen=True)
class Signature:
    """What an op with regions must look like: each region's block argument and yield
    types, and the op's result types."""
    arguments: tuple[tuple[TensorType, ...], ...]     # per region
    yields: tuple[tuple[TensorType, ...], ...]        # per region
    results: tuple[TensorType, ...]


def row_type(t: TensorType) -> TensorType:
    """One row of a scanned tensor: its leading dim dropped."""
    return TensorType(t.shape[1:], t.dtype)


def stacked_type(t: TensorType, length) -> TensorType:
    return TensorType((length, *t.shape), t.dtype)


def scan_groups(op: Op) -> tuple[list[Value], list[Value], list[Value]]:
    """(consts, init, xs) among a tc.scan's operands."""
    k, c = op.attrs["num_consts"], op.attrs["num_carry"]
    return op.operands[:k], op.operands[k:k + c], op.operands[k + c:]


def while_groups(op: Op) -> tuple[list[Value], list[Value]]:
    """(consts, init) among a tc.while_loop's operands."""
    k = op.attrs["num_consts"]
    return op.operands[:k], op.operands[k:]


def signature(name: str, operand_types: list[TensorType], attrs: dict, yields: list[list[TensorType]]) -> Signature:
    """The signature a region op with these operands and attributes must have.  `yields`,
    what its regions yield, decides the types the body alone determines (a scan's ys, a
    cond's results).  Raises RegionError when the operands or attributes do not fit."""
    if name == SCAN:
        k, c, length = attrs.get("num_consts"), attrs.get("num_carry"), attrs.get("length")
        _counts(name, k, c, len(operand_types))
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise RegionError(f"tc.scan: length must be an int >= 0, got {length!r}")
        consts, init, xs = operand_types[:k], operand_types[k:k + c], operand_types[k + c:]
        for i, t in enumerate(xs):
            if not t.shape or t.shape[0] != length:
                raise RegionError(f"tc.scan: scanned operand #{i} has type {t}, whose leading dim "
                                  f"must be the length {length}")
        body = tuple(consts) + tuple(init) + tuple(row_type(t) for t in xs)
        ys = tuple(yields[0][c:]) if yields else ()
        return Signature((body,), (tuple(init) + ys,), tuple(init) + tuple(stacked_type(t, length) for t in ys))
    if name == WHILE:
        k = attrs.get("num_consts")
        _counts(name, k, 0, len(operand_types))
        args = tuple(operand_types)
        return Signature((args, args), ((BOOL_SCALAR,), tuple(operand_types[k:])), tuple(operand_types[k:]))
    if name == COND:
        if not operand_types or operand_types[0] != BOOL_SCALAR:
            raise RegionError(f"tc.cond: the predicate must be a 0-d bool tensor, got "
                              f"{operand_types[0] if operand_types else 'nothing'}")
        args = tuple(operand_types[1:])
        results = tuple(yields[0]) if yields else ()
        return Signature((args, args), (results, results), results)
    raise RegionError(f"{name} is not an op with regions")


def _counts(name: str, consts, carry, operands: int) -> None:
    for label, n in (("num_consts", consts), ("num_carry", carry)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise RegionError(f"{name}: {label} must be an int >= 0, got {n!r}")
    if consts + carry > operands:
        raise RegionError(f"{name}: num_consts + num_carry = {consts + carry} exceeds its "
                          f"{operands} operands")


def op_signature(op: Op) -> Signature:
    return signature(op.name, [v.type for v in op.operands], op.attrs,
                     [[v.type for v in r.outputs] for r in op.regions])


def check(op: Op, names: tuple[str, ...]) -> None:
    """Raise RegionError unless `op` (whose ops.yaml entry names `names` regions) has
    regions of the signature its operands and attributes call for, and those results."""
    if len(op.regions) != len(names):
        raise RegionError(f"{op.name} holds {len(op.regions)} region(s), expected "
                          f"{len(names)} ({', '.join(names)})")
    sig = op_signature(op)
    for region, label, args, yields in zip(op.regions, names, sig.arguments, sig.yields):
        got = tuple(v.type for v in region.inputs)
        if got != args:
            raise RegionError(f"{op.name}: region '{label}' takes {_types(got)}, expected {_types(args)}")
        got = tuple(v.type for v in region.outputs)
        if got != yields:
            raise RegionError(f"{op.name}: region '{label}' yields {_types(got)}, expected {_types(yields)}")
    got = tuple(r.type for r in op.results)
    if got != sig.results:
        raise RegionError(f"{op.name}: results {_types(got)}, expected {_types(sig.results)}")


def _types(types) -> str:
    return "(" + ", ".join(map(str, types)) + ")"


def walk_graphs(graph: Graph):
    """`graph` and every region inside it, outermost first (iteratively: nesting is shallow,
    but nothing here should depend on that)."""
    stack = [graph]
    while stack:
        g = stack.pop()
        yield g
        stack.extend(r for op in reversed(g.ops) for r in reversed(op.regions))
