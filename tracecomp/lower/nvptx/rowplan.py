"""Whether a `rows` launch may hold its rows in registers (rowcache.py emits it so), and
with how many threads: the planning half, which launch.py asks before any code exists."""
from __future__ import annotations

from typing import Optional

from ..loops.ir import INDEX, Let, Load, Loop, Reduce, Store, Var
from ..loops.walk import statements, substitute, var_names, walk
from .shareable import cooperative

CACHE_MAX_EXTENT = 8192      # longest row held in registers (16 elements a thread at 512)
CACHE_MAX_VALUES = 64        # registers of cached elements a thread may hold
SENTINEL = "__row"


def canonical(index: tuple, var: str) -> tuple:
    """The index with the pass var renamed, so passes with their own vars share keys."""
    return tuple(substitute(i, lambda n: Var(SENTINEL, INDEX) if n == Var(var, INDEX) else None) for i in index)


def row_threads(extent: int) -> int:
    return 256 if extent <= 4096 else 512


def cache_extent(kernel, body: list) -> Optional[int]:
    """E when the row body (statements inside the outer loops) may be held in registers."""
    passes = [s for s in body if isinstance(s, (Reduce, Loop))]
    if not passes or any(not isinstance(s, (Let, Store, Reduce, Loop)) for s in body):
        return None
    extent = passes[0].extent
    if not isinstance(extent, int) or extent > CACHE_MAX_EXTENT or any(p.extent != extent for p in passes):
        return None
    keys: dict[str, set] = {}
    written: set[str] = set()
    for p in passes:
        inner = statements(p.body)
        if any(isinstance(s, (Loop, Reduce)) for s in inner):
            return None
        if isinstance(p, Reduce) and (not cooperative(p) or any(isinstance(s, Store) for s in inner)):
            return None
        for n in walk(p.body if isinstance(p, Loop) else [*p.body, *p.update]):
            if isinstance(n, (Load, Store)) and any(p.var in var_names(i) for i in n.index):
                keys.setdefault(n.buffer, set()).add((type(n), canonical(n.index, p.var)))
            if isinstance(n, Store):
                written.add(n.buffer)
    outside = [s for s in body if not isinstance(s, (Reduce, Loop))]
    for name in written:
        forms = keys.get(name, set())
        if len({k for _, k in forms}) != 1 or any(t not in (Load, Store) for t, _ in forms):
            return None
        if any(name == n.buffer for n in walk(outside) if isinstance(n, (Load, Store))):
            return None
        for p in passes:      # every access of it in a pass goes through the key
            for n in walk(p.body if isinstance(p, Loop) else [*p.body, *p.update]):
                if isinstance(n, (Load, Store)) and n.buffer == name and not any(p.var in var_names(i) for i in n.index):
                    return None
    per_thread = -(-extent // row_threads(extent))
    if len({(b, k) for b, forms in keys.items() for _, k in forms}) * per_thread > CACHE_MAX_VALUES:
        return None
    return extent
