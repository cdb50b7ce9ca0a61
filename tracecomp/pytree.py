"""Flattening nested tuples/lists/dicts into leaves and a hashable structure, and back."""
from __future__ import annotations

from typing import Any, Callable

LEAF = "*"


def flatten(tree: Any, is_leaf: Callable[[Any], bool]) -> tuple[list, Any]:
    """Leaves in order and a hashable description of the structure around them."""
    leaves: list = []

    def walk(x):
        if is_leaf(x):
            leaves.append(x)
            return LEAF
        if isinstance(x, tuple) and hasattr(x, "_fields"):     # named tuples keep their class
            return (type(x), tuple(walk(y) for y in x))
        if isinstance(x, (tuple, list)):
            return (type(x).__name__, tuple(walk(y) for y in x))
        if isinstance(x, dict):
            return ("dict", tuple((k, walk(x[k])) for k in x))
        return ("static", x)          # Python scalars, None, strings: part of the structure
    return leaves, walk(tree)


def unflatten(structure: Any, leaves: list) -> Any:
    it = iter(leaves)

    def build(s):
        if s == LEAF:
            return next(it)
        kind, body = s
        if kind == "static":
            return body
        if kind == "dict":
            return {k: build(v) for k, v in body}
        items = [build(v) for v in body]
        if isinstance(kind, type):
            return kind(*items)
        return tuple(items) if kind == "tuple" else items
    return build(structure)


def leaf_paths(structure: Any, prefix: str = "") -> list[str]:
    """A readable path (`args[1]['w']`) for each leaf and static value, for retrace messages."""
    out: list[str] = []

    def walk(s, path):
        if s == LEAF:
            out.append(path)
            return
        kind, body = s
        if kind == "static":
            out.append(path)
        elif kind == "dict":
            for k, v in body:
                walk(v, f"{path}[{k!r}]")
        else:
            for i, v in enumerate(body):
                walk(v, f"{path}[{i}]")
    walk(structure, prefix)
    return out
