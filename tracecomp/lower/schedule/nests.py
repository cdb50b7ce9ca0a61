"""Kernel names and loop nests: what every scheduler module builds its kernels from.

`kernel_name` names a kernel after where its last op was called and what it computes;
`loop_nest` wraps statements in Loops over a shape, the outermost parallel when the nest
does enough work to pay for threads (tiles.parallel_min_work: the grain follows the vectors).
"""
from __future__ import annotations

import math
import os
import re

from ...ir import Op
from ...ops.table import by_ir_name
from ...core.symbolic import hint, shape_hint
from ..loops import index as I
from ..loops import ir as L
from .pointwise import VIEW_KINDS
from .tiles import parallel_min_work



def short_location(op: Op) -> str:
    """`mlp_py18` for an op at mlp.py:18: an identifier fragment ("" without a location)."""
    if op.loc is None:
        return ""
    stem, ext = os.path.splitext(os.path.basename(op.loc.file))
    stem = re.sub(r"[^A-Za-z0-9_]", "_", stem).strip("_")[:16] or "src"
    ext = re.sub(r"[^A-Za-z0-9]", "", ext)[:4]     # a generated frame's name: "x.py:codegen(f)"
    return f"{stem}_{ext or 'l'}{op.loc.line}"


def kernel_name(number: int, ops: list[Op]) -> str:
    """`k{number}_{where}_{what}`: where the kernel's last op was called, and the names of
    the ops it computes (views and casts left out; at most three: first, second, last)."""
    table = by_ir_name()
    names: list[str] = []
    for op in ops:
        short = op.name.split(".")[-1]
        kind = table[op.name].kind if op.name in table else None
        if kind not in VIEW_KINDS + ("cast",) and short not in names:
            names.append(short)
    if len(names) > 3:
        names = names[:2] + names[-1:]
    if not names:           # only views: name the last one
        names = [ops[-1].name.split(".")[-1] if ops else "copy"]
    where = short_location(ops[-1]) if ops else ""
    return "_".join(p for p in (f"k{number}", where, *names) if p)


class BufferTable(dict):
    """The scheduler's buffers by name; remembers, per prefix, how many of prefix0,
    prefix1, ... are taken (forgotten on any deletion), so that fresh_name does not scan
    them all again for every new buffer (quadratic in an unrolled loop's thousands)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.taken: dict[str, int] = {}

    def __delitem__(self, key):
        self.taken.clear()
        super().__delitem__(key)

    def pop(self, *args):
        self.taken.clear()
        return super().pop(*args)

    def popitem(self):
        self.taken.clear()
        return super().popitem()

    def clear(self):
        self.taken.clear()
        super().clear()


def fresh_name(buffers: dict, prefix: str) -> str:
    """The first of prefix0, prefix1, ... that names no buffer yet."""
    taken = buffers.taken if isinstance(buffers, BufferTable) else {}
    n = taken.get(prefix, 0)
    while f"{prefix}{n}" in buffers:
        n += 1
    taken[prefix] = n           # prefix0 .. prefix{n-1} are taken
    return f"{prefix}{n}"


def loop_nest(shape: tuple[int, ...], inner, prefix: str = "i") -> list:
    """Nested Loops over `shape`; `inner(index)` gives the innermost statements.
    The outermost loop is parallel when the nest is big enough to pay for threads."""
    index = tuple(L.Var(f"{prefix}{d}", L.INDEX) for d in range(len(shape)))
    body = inner(index)
    for d in reversed(range(len(shape))):
        body = [L.Loop(f"{prefix}{d}", I.dim(shape[d]), body)]
    if shape and math.prod(shape_hint(shape)) >= parallel_min_work() and hint(shape[0]) > 1:
        body[0].parallel = True
    return body
