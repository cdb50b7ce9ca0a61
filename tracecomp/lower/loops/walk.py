"""The one traversal of the loop IR: which fields of a node are its children, and the
queries and rewrites built on that (every node, statements, loads, buffers read and
written, Var names, substitution, renaming a buffer), and a fingerprint for cache keys.

Passes decide buffer roles, donation safety and atomics from these walks, so a walk that
missed a field would be a silent miscompile.  CHILDREN is therefore the only place that
lists fields: a new node kind or field is added here once, and tests/test_loops_walk.py
fails for any field of a node type that holds a node but is not listed.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Optional

from .ir import (SIZE_PREFIX, Accumulator, Binary, Buffer, Cast, Const, Expr, Kernel, Let, Load, Loop,
                 Matmul, Reduce, Select, Store, Unary, Var, View)

# The fields of each node type that hold nodes (or lists/tuples of them; int sizes and
# None are skipped), in evaluation order.  The other fields hold names, dtypes and flags.
CHILDREN: dict[type, tuple[str, ...]] = {
    Const: (),
    Var: (),
    Load: ("index",),
    Unary: ("x",),
    Binary: ("a", "b"),
    Select: ("cond", "a", "b"),
    Cast: ("x",),
    Let: ("value",),
    Store: ("index", "value"),
    Loop: ("extent", "body"),
    Accumulator: ("init",),
    Reduce: ("extent", "accumulators", "body", "update"),
    View: ("offset", "strides"),
    Matmul: ("out", "a", "b", "m", "n", "k", "batch", "epilogue"),
    Buffer: ("shape",),
    Kernel: ("buffers", "body"),
}
STATEMENTS = (Let, Store, Loop, Reduce, Matmul)


def children(node: Any) -> list:
    """The nodes `node` holds directly, in field order."""
    try:
        fields = CHILDREN[type(node)]
    except KeyError:
        raise TypeError(f"not a loop-IR node: {node!r}") from None
    out = []
    for f in fields:
        v = getattr(node, f)
        if isinstance(v, (list, tuple)):
            out.extend(x for x in v if x is not None and not isinstance(x, int))
        elif v is not None and not isinstance(v, int):
            out.append(v)
    return out


def walk(root: Any) -> Iterator:
    """Every node under `root` (a node or a list of them; int sizes in the list are
    skipped), itself included, in pre-order; a node object shared by several parents (a
    common subexpression) comes once."""
    seen: set[int] = set()
    stack = list(reversed(root)) if isinstance(root, (list, tuple)) else [root]
    while stack:
        node = stack.pop()
        if isinstance(node, int) or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(reversed(children(node)))


def fingerprint(root: Any) -> str:
    """Text that determines `root` (nodes, lists and plain values) and names every node
    object once: `repr` would spell a shared subexpression out at each of its uses, which
    for a deep DAG (a special function's expansion) runs to millions of characters."""
    lines: list[str] = []
    names: dict[int, str] = {}

    def text(x) -> str:
        if isinstance(x, (list, tuple)):
            inner = ", ".join(map(text, x))
            return f"[{inner}]" if isinstance(x, list) else f"({inner})"
        if not dataclasses.is_dataclass(x) or isinstance(x, type):
            return repr(x)
        if id(x) not in names:
            fields = ", ".join(f"{f.name}={text(getattr(x, f.name))}" for f in dataclasses.fields(x))
            lines.append(f"{type(x).__name__}({fields})")
            names[id(x)] = f"#{len(lines) - 1}"
        return names[id(x)]
    return "\n".join(lines + [text(root)])


def statements(body: list) -> Iterator:
    """The statements of `body` and of every Loop and Reduce in it, in pre-order."""
    for s in body:
        yield s
        yield from statements([c for c in children(s) if isinstance(c, STATEMENTS)])


def loads(root: Any) -> list[Load]:
    """Every Load under `root` (Matmul operands are Views: see buffers_read)."""
    return [n for n in walk(root) if isinstance(n, Load)]


def buffers_read(root: Any) -> set[str]:
    """Buffers whose elements are read: by Loads, by a Matmul's operands, and by its
    output when it accumulates."""
    out: set[str] = set()
    for n in walk(root):
        if isinstance(n, Load):
            out.add(n.buffer)
        elif isinstance(n, Matmul):
            out.update((n.a.buffer, n.b.buffer))
            if n.accumulate:
                out.add(n.out.buffer)
    return out


def buffers_written(root: Any) -> set[str]:
    """Buffers written: by Stores, a Matmul's output and its packing workspace."""
    out: set[str] = set()
    for n in walk(root):
        if isinstance(n, Store):
            out.add(n.buffer)
        elif isinstance(n, Matmul):
            out.update(b for b in (n.out.buffer, n.workspace) if b is not None)
    return out


def var_names(root: Any) -> set[str]:
    """The names of the Vars under `root`."""
    return {n.name for n in walk(root) if isinstance(n, Var)}


def size_params(root: Any) -> list[str]:
    """The size parameters (Vars named SIZE_PREFIX...) that `root` mentions anywhere:
    extents, buffer shapes, indices and values.  Sorted, so every kernel of a program takes
    them in one order."""
    return sorted(n for n in var_names(root) if n.startswith(SIZE_PREFIX))


def count_exprs(root: Any) -> int:
    """Distinct expression objects under `root`: the size of the code it generates."""
    return sum(isinstance(n, Expr) for n in walk(root))


def substitute(root: Any, rule: Callable[[Any], Optional[Any]], memo: Optional[dict] = None) -> Any:
    """`root` (a node or a list of them) with every node for which `rule` returns a
    replacement replaced by it (its children are not visited); other nodes are rebuilt
    from their substituted children.  Unchanged expressions are kept as they are, so
    shared subexpressions stay shared; statements are always fresh objects, since passes
    mutate them (a Loop's `parallel`, its `body`).  Pass one `memo` to several calls to
    share the work on expressions they have in common."""
    memo = {} if memo is None else memo

    def go(node):
        if isinstance(node, (list, tuple)):
            return type(node)(go(x) for x in node)
        if node is None or isinstance(node, int):
            return node
        hit = memo.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        new = rule(node)
        if new is None:
            new = _rebuild(node, go)
        memo[id(node)] = (node, new)
        return new
    return go(root)


def _rebuild(node: Any, go: Callable) -> Any:
    changes = {}
    for f in CHILDREN[type(node)]:
        v = getattr(node, f)
        new = go(v)
        if isinstance(v, (list, tuple)) and all(a is b for a, b in zip(new, v)):
            new = v
        if new is not v:
            changes[f] = new
    if isinstance(node, Expr):       # frozen: share it when nothing changed
        return dataclasses.replace(node, **changes) if changes else node
    return dataclasses.replace(node, **changes)


def rename_buffer(root: Any, old: str, new: str) -> Any:
    """`root` with buffer `old` called `new` wherever a node names it (Loads, Stores,
    Views, a Matmul's workspace)."""
    memo: dict = {}

    def go(node):
        return substitute(node, rule, memo)

    def rule(node):
        renamed = {f: new for f in ("buffer", "workspace") if getattr(node, f, None) == old}
        return _rebuild(dataclasses.replace(node, **renamed), go) if renamed else None
    return go(root)
