"""Buffer reuse: outputs written into the memory of donated inputs, and updates written into
the memory of the values they replace.

`update_in_place(program)`: a kernel that starts by copying a temp T into its result R and
then changes some elements of R (a scatter: item assignment, index_put, scatter_add, ...)
updates T's memory instead when nothing reads T afterwards.  T is renamed to R everywhere
(T's producers write R) and the copy is dropped, so a chain of k assignments into an
n-element tensor costs the updated elements rather than k copies of n.


`donate(program, donated)` takes the positions of donated function inputs and lets an
output reuse a donated input's buffer where that is safe, by renaming the output buffer to
the input's everywhere (kernels, Program.outputs).  The kernel that writes the output then
reads and writes the one buffer through one pointer, so the code generators' `noalias`
promise still holds.  Program.donated lists the input buffers that now hold outputs.

An output O may take a donated input X's buffer when O has X's shape and dtype, exactly one
kernel W writes O, X is not itself returned, no kernel after W reads X, and W reads X not at
all or only as one pointwise loop nest whose every Load of X is at the very element being
stored.  Everything else keeps a fresh output.  Notably a matmul whose epilogue reads X
(an SGD step `w - lr * (x.T @ g)`) is refused: the packed kernel stores each K-block's
partial products into the output tile before the epilogue runs, so the epilogue would read
partial sums where X was.  Each donated input serves at most one output; outputs are
matched in order.  A program with loops or branches (Program.steps) donates nothing: its
regions' kernels read the outer buffers through bound names, which these checks do not
follow.  update_in_place runs before the regions are expanded, while each region op is
one Pending kernel (schedule/control.py) that names the buffers it uses, and renames in
its step too.
"""
from __future__ import annotations

import dataclasses

from ..loops import ir as L
from ..loops.walk import buffers_read, buffers_written, loads, rename_buffer
from .control import rename_outer


def donate(program, donated: set[int]) -> dict[int, int]:
    """Rename outputs into donated inputs' buffers where safe; {output position: input position}."""
    reused: dict[int, int] = {}
    if program.steps is not None:
        return reused
    free = [i for i in sorted(donated) if program.inputs[i] not in program.outputs]
    for k, out in enumerate(program.outputs):
        b = program.buffers.get(out)
        if b is None or b.role != "output" or out in program.outputs[:k]:
            continue
        for i in free:
            x = program.inputs[i]
            xb = program.buffers[x]
            if (xb.shape, xb.dtype) == (b.shape, b.dtype) and _safe(program, out, x):
                _rename(program, out, x)
                program.donated.append(x)
                free.remove(i)
                reused.update((q, i) for q, o in enumerate(program.outputs) if o == x)
                break
    return reused


def update_in_place(program) -> None:
    """Drop the leading copy of every kernel that copies a dead temp into its result."""
    for w, kernel in enumerate(program.kernels):
        copied = _leading_copy(kernel.body)
        if copied is None:
            continue
        out, src = copied
        sb, ob = program.buffers[src], program.buffers[out]
        if (sb.role != "temp" or (sb.shape, sb.dtype) != (ob.shape, ob.dtype)
                or any(f.buffer == src for f in program.fills)
                or any(_reads(k, src) for k in program.kernels[w + 1:])
                or src in buffers_read(kernel.body[1:]) | buffers_written(kernel.body[1:])):
            continue
        program.kernels[w] = dataclasses.replace(kernel, body=kernel.body[1:])
        _rename(program, src, out)


def _leading_copy(body: list) -> tuple[str, str] | None:
    """(R, T) if `body` starts with a loop nest storing Load(T) into R at the nest's index."""
    if not body or not isinstance(body[0], L.Loop):
        return None
    nest, inner = [], [body[0]]
    while len(inner) == 1 and isinstance(inner[0], L.Loop):
        nest.append(inner[0].var)
        inner = inner[0].body
    if len(inner) != 1 or not isinstance(inner[0], L.Store) or not isinstance(inner[0].value, L.Load):
        return None
    store, index = inner[0], tuple(L.Var(v, L.INDEX) for v in nest)
    if store.index != index or store.value.index != index or store.value.buffer == store.buffer:
        return None
    return store.buffer, store.value.buffer


def _safe(program, out: str, x: str) -> bool:
    writers = [n for n, k in enumerate(program.kernels) if _stores(k, out)]
    if len(writers) != 1:
        return False
    w = writers[0]
    if any(_reads(k, x) for k in program.kernels[w + 1:]):
        return False
    kernel = program.kernels[w]
    return not _reads(kernel, x) or _pointwise_reads_only(kernel.body, out, x)


def _stores(kernel: L.Kernel, name: str) -> bool:
    return any(b.name == name and b.role == "output" for b in kernel.buffers)


def _reads(kernel: L.Kernel, name: str) -> bool:
    return any(b.name == name for b in kernel.buffers)


def _pointwise_reads_only(body: list, out: str, x: str) -> bool:
    """`body` is one perfect loop nest storing `out` at the nest's own index, and every Load
    of `x` in the stored value is at that same index."""
    nest = []
    while len(body) == 1 and isinstance(body[0], L.Loop):
        nest.append(body[0].var)
        body = body[0].body
    if len(body) != 1 or not isinstance(body[0], L.Store) or body[0].buffer != out:
        return False
    store = body[0]
    if store.index != tuple(L.Var(v, L.INDEX) for v in nest):
        return False
    return all(ld.index == store.index for ld in loads(store.value) if ld.buffer == x)


def _rename(program, old: str, new: str) -> None:
    """Buffer `old` becomes `new` in every kernel and in the outputs; `old` disappears."""
    for n, k in enumerate(program.kernels):
        if not _reads(k, old):
            continue
        buffers: dict[str, L.Buffer] = {}
        for b in k.buffers:
            b = dataclasses.replace(b, name=new) if b.name == old else b
            if b.name not in buffers or b.role == "output":
                buffers[b.name] = b
        program.kernels[n] = dataclasses.replace(k, buffers=list(buffers.values()),
                                                 body=rename_buffer(k.body, old, new))
    program.outputs = [new if o == old else o for o in program.outputs]
    rename_outer(program, old, new)
    del program.buffers[old]
