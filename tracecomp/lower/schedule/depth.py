"""How deep the scheduler lets an inlined expression grow: the cap that keeps every kernel's
expressions, and with them every recursive walk of the loop IR (building, printing,
fingerprinting, checking, emitting LLVM IR), bounded whatever the graph's depth.

Without it an unrolled loop (`x = tanh(x)` 20,000 times, or the backward of any long
chain, where each gradient is read once) fuses into one expression as deep as the loop is
long.  `too_deep` picks values to give buffers: along any chain of inlined ops, at most
MAX_OPS ops and about MAX_LEVELS levels of expression.  An op's own levels (`op_levels`)
come from building its expression on loads of its operands, once per kind of op (name,
attributes, types): erfinv alone is ~140 levels deep, tanh 2.
"""
from __future__ import annotations

from typing import Any, Hashable

from ...ir import CONSTANT, Graph, Op, Value
from ...ir.passes.cse import freeze
from ..loops import ir as L
from ..loops.walk import children
from .pointwise import Inliner

MAX_OPS = 48          # ops inlined along one chain (the inliner recurses ~3 frames per op)
MAX_LEVELS = 160      # expression levels along one chain (walks recurse ~2-3 frames per level)

MAX_CACHED = 4096
_levels: dict[Hashable, int] = {}      # op_levels by kind of op


def expression_depth(root: Any) -> int:
    """Levels of expression nodes under `root` (a node or a list of them): the longest path,
    each shared subexpression measured once (expressions are DAGs: walking every path
    would be exponential), iteratively; a statement adds no level."""
    depth: dict[int, int] = {}
    expanded: set[int] = set()
    stack: list[tuple[Any, bool]] = [(x, False) for x in (root if isinstance(root, list) else [root])
                                     if x is not None and not isinstance(x, int)]
    while stack:
        node, finish = stack.pop()
        key = id(node)
        if finish:
            below = max((depth[id(c)] for c in children(node)), default=0)
            depth[key] = below + (1 if isinstance(node, L.Expr) else 0)
        elif key not in expanded:         # (in a DAG, one expanded is finished before it is needed)
            expanded.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in children(node) if id(c) not in expanded)
    return max((depth[id(x)] for x in (root if isinstance(root, list) else [root])
                if x is not None and not isinstance(x, int)), default=0)


def op_levels(op: Op) -> int:
    """Levels `op`'s inlined expression adds above its operands' (at least 1)."""
    key = (op.name, tuple(sorted((k, freeze(v)) for k, v in op.attrs.items())),
           tuple(v.type for v in op.operands), tuple(r.type for r in op.results))
    try:
        found = _levels.get(key)
    except TypeError:             # an attribute that does not hash: measure every time
        return _measure(op)
    if found is None:
        if len(_levels) >= MAX_CACHED:          # (keys may hold array attributes: stay small)
            _levels.clear()
        found = _levels[key] = _measure(op)
    return found


def _measure(op: Op) -> int:
    inliner = Inliner({v: f"operand{i}" for i, v in enumerate(op.operands)})
    depth = 1
    for k, r in enumerate(op.results):
        index = tuple(L.Var(f"i{d}", L.INDEX) for d in range(r.type.ndim))
        try:
            depth = max(depth, expression_depth(inliner.op_at(op, k, index)))
        except Exception:         # an op that is never inlined: the scheduler says so itself
            pass
    return depth


def too_deep(graph: Graph, keep: set[Value]) -> set[Value]:
    """Values (not in `keep`) to give buffers so that no chain of inlined ops exceeds MAX_OPS
    ops or MAX_LEVELS levels.  An upper bound: an op's levels are added to the deepest of
    its operands'."""
    ops: dict[Value, int] = {}
    levels: dict[Value, int] = {}
    out: set[Value] = set()
    for op in graph.ops:
        if op.name == CONSTANT or all(r in keep for r in op.results):
            continue
        n = 1 + max((ops.get(u, 0) for u in op.operands), default=0)
        d = op_levels(op) + max((levels.get(u, 0) for u in op.operands), default=0)
        for r in op.results:
            if r in keep:
                continue
            if n > MAX_OPS or d > MAX_LEVELS:
                out.add(r)
            else:
                ops[r], levels[r] = n, d
    return out
