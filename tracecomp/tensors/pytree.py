"""Flattening nested tuples/lists/dicts (and registered classes) into leaves and a hashable
structure, and back."""
from __future__ import annotations

import struct
from typing import Any, Callable

import numpy as np

LEAF = "*"
REGISTERED = "registered"
_NODES: dict[type, tuple[Callable, Callable]] = {}


def register_pytree_node(cls: type, flatten_fn: Callable, unflatten_fn: Callable,
                         constants_fn: Callable | None = None) -> None:
    """Let instances of `cls` hold tensors in pytrees, as JAX's register_pytree_node:
    flatten_fn(obj) -> (children, aux) with aux hashable (what is not a child: a name, a
    config), unflatten_fn(aux, children) -> obj.  tc.grad, tc.trace and the other transforms
    then take and return them (tc.nn.Module registers itself this way).  constants_fn(aux),
    if given, says which children (by position) tc.grad leaves alone: a Module's buffers."""
    if not isinstance(cls, type):
        raise TypeError(f"register_pytree_node takes a class, got {cls!r}")
    _NODES[cls] = (flatten_fn, unflatten_fn, constants_fn)


# class -> fast(x, is_leaf): (cache_key(structure), leaves, scratch) of flatten(x, is_leaf),
# from a memo the class keeps valid (nn.Module's), or None: tc.trace's per-call path for
# arguments that are whole models, which would otherwise be walked and hashed at every call.
# The leaves list is the same object while the memo holds; scratch is a dict that lives as
# long as it, where a caller keeps what it derived from the leaves.
_FAST: dict[type, Callable[[Any, Callable], Any]] = {}


def register_fast_flatten(cls: type, fast: Callable[[Any, Callable], Any]) -> None:
    _FAST[cls] = fast


def fast_flatten(x: Any, is_leaf: Callable[[Any], bool]):
    """(structure key, leaves) of `x` from its class's memo, or None."""
    fast = _FAST.get(type(x))
    return None if fast is None else fast(x, is_leaf)


def flatten(tree: Any, is_leaf: Callable[[Any], bool]) -> tuple[list, Any]:
    """Leaves in order and a hashable description of the structure around them."""
    leaves: list = []
    return leaves, _walk(tree, is_leaf, leaves)


# The recursions here are module-level functions, not closures: a recursive closure is a
# reference cycle, which would keep a call's tensors (inputs, fresh outputs) alive until the
# garbage collector runs, so each compiled call would fault in new pages instead of
# reusing the memory just freed.
def _walk(x: Any, is_leaf: Callable[[Any], bool], leaves: list) -> Any:
    if is_leaf(x):
        leaves.append(x)
        return LEAF
    if isinstance(x, tuple) and hasattr(x, "_fields"):     # named tuples keep their class
        return (type(x), tuple(_walk(y, is_leaf, leaves) for y in x))
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, tuple(_walk(y, is_leaf, leaves) for y in x))
    if isinstance(x, dict):
        return ("dict", tuple((k, _walk(x[k], is_leaf, leaves)) for k in x))
    node = _NODES.get(type(x))
    if node is not None:
        children, aux = node[0](x)
        return ((REGISTERED, type(x), aux), tuple(_walk(y, is_leaf, leaves) for y in children))
    return ("static", x)          # Python scalars, None, strings: part of the structure


def tree_map(fn: Callable, tree: Any, *rest: Any) -> Any:
    """fn applied leaf by leaf (tensors, arrays, numbers) to `tree` and the trees in `rest`,
    which have its structure (JAX's tree_map): `tc.tree_map(lambda p, g: p - lr * g, model, grads)`.
    Where a tree of `rest` has None (tc.grad's gradient of a buffer), the leaf stays as it is."""
    def is_leaf(x):
        return x is None or is_array_or_number(x)
    leaves, structure = flatten(tree, is_leaf)
    others = [flatten(r, is_leaf) for r in rest]
    for i, (ls, _) in enumerate(others):
        if len(ls) != len(leaves):
            raise ValueError(f"tree_map: tree {i + 1} has {len(ls)} leaves, the first has {len(leaves)}")
    out = []
    for j, x in enumerate(leaves):
        args = [ls[j] for ls, _ in others]
        # None stays None, and a None in another tree (a buffer's gradient) keeps the leaf
        out.append(x if x is None or any(a is None for a in args) else fn(x, *args))
    return unflatten(structure, out)


def is_array_or_number(x: Any) -> bool:
    """A leaf of a pytree the transforms work on: a tensor, a NumPy array or scalar, any
    DLPack array, a Python number."""
    from .tensor import Tensor
    return isinstance(x, (Tensor, np.ndarray, np.generic, int, float)) or hasattr(x, "__dlpack__")


def unflatten(structure: Any, leaves: list) -> Any:
    return _build(structure, iter(leaves))


def _build(s: Any, it) -> Any:
    if s == LEAF:
        return next(it)
    kind, body = s
    if kind == "static":
        return body
    if kind == "dict":
        return {k: _build(v, it) for k, v in body}
    items = [_build(v, it) for v in body]
    if isinstance(kind, tuple):                  # (REGISTERED, class, aux)
        return _NODES[kind[1]][1](kind[2], items)
    if isinstance(kind, type):
        return kind(*items)
    return tuple(items) if kind == "tuple" else items


def cache_key(structure: Any) -> Any:
    """`structure` as a dictionary key: every static value (and dict key) by its type and
    bit pattern, so that 1, 1.0 and True, or 0.0 and -0.0, are different keys (they can
    trace different programs) and a NaN equals itself (one trace, not one per call)."""
    if structure == LEAF:
        return LEAF
    kind, body = structure
    if kind == "static":
        return ("static", _typed(body))
    if kind == "dict":
        return ("dict", tuple((_typed(k), cache_key(v)) for k, v in body))
    return (kind, tuple(cache_key(v) for v in body))


def _typed(x: Any) -> tuple:
    if isinstance(x, float):
        return (type(x), struct.pack("<d", x))
    if isinstance(x, np.generic):
        return (type(x), x.tobytes())
    if isinstance(x, complex):
        return (type(x), struct.pack("<dd", x.real, x.imag))
    return (type(x), x)


def leaf_paths(structure: Any, prefix: str = "") -> list[str]:
    """A readable path (`args[1]['w']`) for each leaf and static value, for retrace messages."""
    return [path for path, _ in _entries(structure, prefix)]


def constant_leaves(structure: Any) -> list[bool]:
    """Per leaf, in order: whether a registered node marks it (or a child above it) as a
    constant for tc.grad (constants_fn of register_pytree_node)."""
    out: list[bool] = []
    _mark_constants(structure, False, out)
    return out


def _mark_constants(s: Any, constant: bool, out: list) -> None:
    if s == LEAF:
        out.append(constant)
        return
    kind, body = s
    if kind == "static":
        return
    if kind == "dict":
        for _, v in body:
            _mark_constants(v, constant, out)
        return
    marked: set = set()
    if isinstance(kind, tuple) and kind[0] == REGISTERED and _NODES[kind[1]][2] is not None:
        marked = set(_NODES[kind[1]][2](kind[2]))
    for i, v in enumerate(body):
        _mark_constants(v, constant or i in marked, out)


def array_paths(structure: Any, prefix: str = "") -> list[str]:
    """The paths of the leaves alone (leaf_paths without the static values), in order."""
    return [p for p, v in _entries(structure, prefix) if v is LEAF]


def static_values(structure: Any) -> list:
    """Parallel to leaf_paths: LEAF for each leaf, the value itself for each static value."""
    return [value for _, value in _entries(structure, "")]


def _entries(structure: Any, prefix: str) -> list[tuple[str, Any]]:
    """(path, LEAF or the static value) for each leaf and static value, in order."""
    out: list[tuple[str, Any]] = []
    _walk_entries(structure, prefix, out)
    return out


def _walk_entries(s: Any, path: str, out: list) -> None:
    if s == LEAF:
        out.append((path, LEAF))
        return
    kind, body = s
    if kind == "static":
        out.append((path, body))
    elif kind == "dict":
        for k, v in body:
            _walk_entries(v, f"{path}[{k!r}]", out)
    else:
        for i, v in enumerate(body):
            _walk_entries(v, f"{path}[{i}]", out)


# ---------------------------------------------------------------- as JSON (exported metadata)

def structure_to_json(structure) -> Any:
    """A pytree structure (pytree.flatten) as JSON: "*" for a tensor leaf, {"tuple": [...]},
    {"list": [...]}, {"dict": [[key, ...], ...]} (string keys), {"static": value}; None when
    something (a non-string key, an unserializable static) has no JSON form."""

    def walk(st):
        if st == LEAF:
            return LEAF
        kind, body = st
        if kind == "static":
            if body is None or isinstance(body, (bool, int, float, str)):
                return {"static": body}
            raise ValueError
        if kind == "dict":
            if not all(isinstance(k, str) for k, _ in body):
                raise ValueError
            return {"dict": [[k, walk(v)] for k, v in body]}
        if isinstance(kind, tuple):              # a registered class: no JSON form
            raise ValueError
        return {"list" if kind == "list" else "tuple": [walk(v) for v in body]}
    try:
        return walk(structure)
    except ValueError:
        return None


def structure_from_json(js):
    if js == LEAF:
        return LEAF
    (kind, body), = js.items()
    if kind == "static":
        return ("static", body)
    if kind == "dict":
        return ("dict", tuple((k, structure_from_json(v)) for k, v in body))
    return (kind, tuple(structure_from_json(v) for v in body))


def output_paths(js) -> list[str]:
    """'result[1][0]' for each tensor leaf of a JSON structure, in order."""
    out: list[str] = []

    def walk(node, path):
        if node == "*":
            out.append(path)
            return
        (kind, body), = node.items()
        if kind == "dict":
            for k, v in body:
                walk(v, f"{path}[{k!r}]")
        elif kind != "static":
            for i, v in enumerate(body):
                walk(v, f"{path}[{i}]")
    if js is not None:
        walk(js, "result")
    return out
