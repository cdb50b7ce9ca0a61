"""The one traversal of the loop IR: which fields of a node are its children, and the
queries and rewrites built on that (every node, statements, loads, buffers read and
written, Var names, substitution, renaming a buffer), and a fingerprint for cache keys.

Passes decide buffer roles, donation safety and atomics from these walks, so a walk that
missed a field would be a silent miscompile.  CHILDREN is therefore the only place that
lists fields: a new node kind or field is added here once, and tests/lower/test_loops_walk.py
fails for any field of a node type that holds a node but is not listed.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Optional

from .ir import (SIZE_PREFIX, Accumulator, Binary, Buffer, Cast, CheckedIndex, Const, Expr, GuardedLoad, Kernel, Let, Load, Loop,
                 Matmul, PackB, Reduce, Select, Store, Unary, Var, View, Windows)

# The fields of each node type that hold nodes (or lists/tuples of them; int sizes and
# None are skipped), in evaluation order.  The other fields hold names, dtypes and flags.
CHILDREN: dict[type, tuple[str, ...]] = {
    Const: (),
    Var: (),
    Load: ("index",),
    GuardedLoad: ("index", "guard"),
    Unary: ("x",),
    Binary: ("a", "b"),
    Select: ("cond", "a", "b"),
    Cast: ("x",),
    CheckedIndex: ("index", "size"),
    Let: ("value",),
    Store: ("index", "value"),
    Loop: ("extent", "body"),
    Accumulator: ("init",),
    Reduce: ("extent", "accumulators", "body", "update"),
    View: ("offset", "strides"),
    Windows: ("offset", "batch_strides", "k_shape", "k_strides", "n_shape", "n_strides"),
    Matmul: ("out", "a", "b", "m", "n", "k", "batch", "epilogue", "b_windows"),
    PackB: ("b", "k", "n"),
    Buffer: ("shape",),
    Kernel: ("buffers", "body"),
}
STATEMENTS = (Let, Store, Loop, Reduce, Matmul, PackB)


_LEAVES = (int, bool, type(None))     # what a node's fields hold besides nodes: sizes, absent parts
_SEQUENCES = (list, tuple)


def children(node: Any) -> list:
    """The nodes `node` holds directly, in field order."""
    try:
        fields = CHILDREN[type(node)]
    except KeyError:
        raise TypeError(f"not a loop-IR node: {node!r}") from None
    out = []
    for f in fields:
        v = getattr(node, f)
        if type(v) in _SEQUENCES:
            out += [x for x in v if type(x) not in _LEAVES]
        elif type(v) not in _LEAVES:
            out.append(v)
    return out


def walk(root: Any) -> Iterator:
    """Every node under `root` (a node or a list of them; int sizes in the list are
    skipped), itself included, in pre-order; a node object shared by several parents (a
    common subexpression) comes once.  (The compiler's hottest Python loop: W8's step
    visits ~90,000 nodes per scheduling, so children() is inlined here.)"""
    seen: set[int] = set()
    stack = [x for x in reversed(root) if type(x) not in _LEAVES] if type(root) in _SEQUENCES else [root]
    pop, push, table = stack.pop, stack.append, CHILDREN
    while stack:
        node = pop()
        key = id(node)
        if key in seen:
            continue
        seen.add(key)
        yield node
        try:
            fields = table[type(node)]
        except KeyError:
            raise TypeError(f"not a loop-IR node: {node!r}") from None
        for f in reversed(fields):
            v = getattr(node, f)
            if type(v) in _SEQUENCES:
                for x in reversed(v):
                    if type(x) not in _LEAVES:
                        push(x)
            elif type(v) not in _LEAVES:
                push(v)


def fingerprint(root: Any, buffers: Optional[dict[str, str]] = None) -> str:
    """Text that determines `root` (nodes, lists and plain values) and names every node
    object once: `repr` would spell a shared subexpression out at each of its uses, which
    for a deep DAG (a special function's expansion) runs to millions of characters.
    `buffers` renames buffers in the text (see `kernel_shape_text`)."""
    lines: list[str] = []
    names: dict[int, str] = {}
    rename = buffers or {}

    def text(x, field: str = "") -> str:
        if isinstance(x, (list, tuple)):
            inner = ", ".join(text(v) for v in x)
            return f"[{inner}]" if isinstance(x, list) else f"({inner})"
        if not dataclasses.is_dataclass(x) or isinstance(x, type):
            return repr(rename.get(x, x) if field in _BUFFER_FIELDS else x)
        if id(x) not in names:
            fields = ", ".join(f"{f.name}={text(getattr(x, f.name), _field(x, f.name))}" for f in dataclasses.fields(x))
            lines.append(f"{type(x).__name__}({fields})")
            names[id(x)] = f"#{len(lines) - 1}"
        return names[id(x)]
    return "\n".join(lines + [text(root)])


NAMING_FIELDS = ("buffer", "workspace", "b_packed", "row_table", "column_table")    # fields that name a buffer
_BUFFER_FIELDS = NAMING_FIELDS + ("buffer name",)


def _field(node: Any, name: str) -> str:
    """The field's role for renaming: a Buffer's `name` is a buffer name, a Kernel's is not."""
    return "buffer name" if name == "name" and isinstance(node, Buffer) else name


def kernel_shape_text(kernel: Kernel) -> str:
    """What a kernel computes up to names: its fingerprint without its name and with its
    buffers named by position.  Two kernels with the same text are one function called on
    different buffers (the AdamW update of every parameter of one shape)."""
    positions = {b.name: f"#{i}" for i, b in enumerate(kernel.buffers)}
    return fingerprint(dataclasses.replace(kernel, name=""), positions)


def statements(body: list) -> Iterator:
    """The statements of `body` and of every Loop and Reduce in it, in pre-order."""
    for s in body:
        yield s
        yield from statements([c for c in children(s) if isinstance(c, STATEMENTS)])


def loads(root: Any) -> list[Load]:
    """Every Load under `root` (Matmul operands are Views: see buffers_read)."""
    return [n for n in walk(root) if isinstance(n, Load)]


def buffers_accessed(root: Any) -> tuple[set[str], set[str]]:
    """(buffers read, buffers written) under `root`, in one walk.  Read: by Loads, by a
    Matmul's operands (b's windows and packed copy too), by its output when it accumulates, and by
    PackB's source.  Written: by Stores, a Matmul's output and its packing workspace, PackB's
    buffer, and the error record by CheckedIndex."""
    read: set[str] = set()
    written: set[str] = set()
    for n in walk(root):
        t = type(n)
        if t is Load or t is GuardedLoad:
            read.add(n.buffer)
        elif t is Store or t is CheckedIndex:
            written.add(n.buffer)
        elif t is Matmul:
            read.update((n.a.buffer, n.b.buffer))
            if n.b_windows is not None:
                w = n.b_windows
                read.update(b for b in (w.buffer, w.row_table, w.column_table) if b is not None)
            if n.accumulate:
                read.add(n.out.buffer)
            if n.b_packed is not None:
                read.add(n.b_packed)
            written.update(b for b in (n.out.buffer, n.workspace) if b is not None)
        elif t is PackB:
            read.add(n.b.buffer)
            written.add(n.buffer)
    return read, written


def buffers_read(root: Any) -> set[str]:
    return buffers_accessed(root)[0]


def buffers_written(root: Any) -> set[str]:
    return buffers_accessed(root)[1]


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
    Views, a Matmul's workspace, a window's tables)."""
    memo: dict = {}

    def go(node):
        return substitute(node, rule, memo)

    def rule(node):
        renamed = {f: new for f in NAMING_FIELDS if getattr(node, f, None) == old}
        return _rebuild(dataclasses.replace(node, **renamed), go) if renamed else None
    return go(root)
