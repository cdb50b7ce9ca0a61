"""Scheduling tc.matmul: one loop-IR Matmul per op, and the epilogue fusion after it.

`matmul_body(sched, op, args)` gives the statement for every torch.matmul case: batch dims
are the broadcast batch of both operands (stride 0 where an operand broadcasts), a 1-D
left operand is one row (m = 1), a 1-D right operand one column (n = 1), and the output
view drops those dims again.  An operand is read in place when its expression at a
symbolic index is a Load whose indices are affine in that index: a buffer, or views of
one (permute/mT, expand, slice, select, unsqueeze/squeeze), so a transposed operand costs
nothing.  Anything else (an elementwise producer, a reshape that merges dims) is first
computed into a temp buffer by a copy kernel of its own; conv2d's window matrix as `b`
is computed in the product's kernel and also described in place (schedule/implicit_gemm.py).  Float products big enough for
the packed kernel get a workspace buffer sized by schedule/tiles.py (a temp, so the runtime's
workspace planning places it).

`fuse_epilogues(program)` then folds a consumer into the product: when a matmul writes a
temp buffer T that exactly one later kernel reads, and that kernel is one pointwise loop
nest storing V (same shape and dtype as T) whose every Load of T is at the nest's own
index, the Matmul writes V instead, with the stored expression as its epilogue (Loads of
T become the accumulator, the nest's indices become the Matmul's).  The fused kernel
takes the consumer's place in the order (everything either kernel reads exists by then),
its number and its name's location, computes the ops of both (Program.kernel_ops), and T
disappears.  Repeated until nothing changes, so a chain the scheduler split at a
multi-use value (tanh(y) * tanh(y)) folds in as well: the epilogue so far replaces the
accumulator in the next one, one shared expression object that the code generators
evaluate once.  So relu(x @ w + b), gelu(x @ w) or x @ w + residual is one kernel.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Optional

from ...ir import Op
from ...core.symbolic import hint, is_dynamic
from ..loops import index as I
from ..loops import ir as L
from ..loops.walk import substitute
from .depth import MAX_LEVELS, expression_depth
from .implicit_gemm import window_operand
from .nests import fresh_name, kernel_name
from .operands import half_source, operand_view
from .tiles import max_threads, uses_packed, workspace_elements


def matmul_body(sched, op: Op, args: dict) -> list:
    a, b, out = args["self"], args["other"], op.result
    ash, bsh = a.type.shape, b.type.shape
    m = ash[-2] if len(ash) > 1 else 1
    n = bsh[-1] if len(bsh) > 1 else 1
    k = ash[-1]
    batch = out.type.shape[:out.type.ndim - (len(ash) > 1) - (len(bsh) > 1)]
    dtype = out.type.dtype
    packed = uses_packed(dtype, hint(m), hint(n), hint(k))
    # (a run-time batch: a workspace for every thread, as its work items are counted at run time)
    matrices = max_threads() if any(is_dynamic(d) for d in batch) else math.prod(batch)
    fills, windows = [], None
    found = window_operand(sched, half_source(sched, b), batch) if packed else None     # conv2d: implicit GEMM
    # every Matmul reads half operands widened (loops/check_matmul.py), packed or not (the
    # loop expansion, the GPU's tiles): no float32 copy of a half input
    a, b = half_source(sched, a), b if found is not None else half_source(sched, b)
    a_view = operand_view(sched, a, batch, row=len(ash) > 1, col=True)
    if found is not None:
        fills, b_view, windows = found
    else:
        b_view = operand_view(sched, b, batch, row=True, col=len(bsh) > 1)
    out_view = operand_view(sched, out, batch, row=len(ash) > 1, col=len(bsh) > 1)
    workspace = None
    if packed:
        workspace = fresh_name(sched.buffers, "w")
        known = [None if is_dynamic(d) else d for d in (m, n, k)]       # run-time sizes: unbounded
        operands = tuple(sched.buffers[v.buffer].dtype for v in (a_view, b_view))     # (they pick the tiles)
        size = workspace_elements(dtype, *known, matrices, operands)
        if windows is not None:         # the kernel may pack b from the (half) input instead
            size = max(size, workspace_elements(dtype, *known, matrices,
                                                (operands[0], sched.buffers[windows.buffer].dtype)))
        sched.buffers[workspace] = L.Buffer(workspace, dtype, (size,), "temp")
    index = tuple(f"b{d}" for d in range(len(batch))) + ("i", "j")
    return fills + [L.Matmul(out_view, a_view, b_view, I.dim(m), I.dim(n), I.dim(k), tuple(I.dim(d) for d in batch),
                             index=index, workspace=workspace, b_windows=windows)]


# ---------------------------------------------------------------- epilogue fusion

def fuse_epilogues(program) -> None:
    """Fold each matmul's lone pointwise consumer into it (see the module docstring), in
    one pass over the kernels: a fused kernel sits where its consumer was, later, so that
    its output, which may again have one pointwise reader, is tried in turn.  (Restarting
    the scan after each fusion, as this did, was quadratic in an unrolled loop's matmuls;
    a kernel that failed before a fusion cannot succeed after it, as its reader would be
    the fused kernel, which ends in a Matmul.)"""
    kernels = program.kernels
    readers: dict[str, dict[int, L.Kernel]] = {}        # buffer -> kernels touching it, by id
    for k in kernels:
        for b in k.buffers:
            readers.setdefault(b.name, {})[id(k)] = k
    i, fused_any = 0, False
    while i < len(kernels):
        km = kernels[i]
        done = _fuse_one(program, km, readers)
        if done is None:
            i += 1
            continue
        kp, fused = done
        for b in km.buffers + kp.buffers:
            touching = readers.get(b.name, {})
            touching.pop(id(km), None)
            touching.pop(id(kp), None)
        for b in fused.buffers:
            readers.setdefault(b.name, {})[id(fused)] = fused
        j = next(j for j in itertools.chain(range(i + 1, len(kernels)), range(i)) if kernels[j] is kp)
        kernels[j] = fused
        del kernels[i]
        i = min(i, j)                # (a reader before its matmul: try the fused kernel next)
        fused_any = True
    if fused_any:
        program.kernel_ops = {k.name: program.kernel_ops[k.name] for k in kernels}     # kernel order


def _fuse_one(program, km: L.Kernel, readers: dict) -> Optional[tuple[L.Kernel, L.Kernel]]:
    """(km's reader, the fused kernel) when km's matmul fused into its lone reader; else None."""
    s = km.body[-1] if km.body and isinstance(km.body[-1], L.Matmul) else None
    if s is not None and len(km.body) > 1 and s.b_windows is None:      # only b's fill may precede it
        s = None
    if s is None or program.buffers[s.out.buffer].role != "temp":
        return None
    others = [k for key, k in readers.get(s.out.buffer, {}).items() if key != id(km)]
    fused = _fuse(km, s, others[0], program.buffers) if len(others) == 1 else None
    if fused is None:
        return None
    kp = others[0]
    del program.buffers[s.out.buffer]
    readers.pop(s.out.buffer, None)
    ops = program.kernel_ops.pop(km.name, []) + program.kernel_ops.pop(kp.name, [])
    fused.name = kernel_name(int(kp.name.split("_", 1)[0][1:]), ops)
    program.kernel_ops[fused.name] = ops
    return kp, fused


def _fuse(km: L.Kernel, s: L.Matmul, kp: L.Kernel, buffers: dict) -> Optional[L.Kernel]:
    loops, body = [], kp.body
    while len(body) == 1 and isinstance(body[0], L.Loop):
        loops.append(body[0])
        body = body[0].body
    if len(body) != 1 or not isinstance(body[0], L.Store):
        return None
    store, t = body[0], buffers[s.out.buffer]
    target = buffers[store.buffer]
    nest = tuple(L.Var(lp.var, L.INDEX) for lp in loops)
    # The consumer may read T reshaped (conv2d's (N, 1, C, H*W) product read as (N, C, H, W)):
    # both buffers are dense, so the product writes the target in T's shape, and the
    # consumer's indices are the matmul's, relinearized.
    if target.dtype != t.dtype or store.index != nest or tuple(lp.extent for lp in loops) != tuple(target.shape) \
            or not _same_static_size(target.shape, t.shape):
        return None
    dims = _logical_dims(s, t.shape)
    if dims is None:
        return None
    reshaped = tuple(target.shape) != tuple(t.shape)
    at = I.reshape(nest, tuple(target.shape), tuple(t.shape)) if reshaped else nest
    if reshaped:
        dims = list(I.reshape(tuple(dims), tuple(t.shape), tuple(target.shape)))
    mapping = {lp.var: d for lp, d in zip(loops, dims)}
    misplaced = []

    def rewrite(e: L.Expr) -> Optional[L.Expr]:
        if isinstance(e, L.Load) and e.buffer == t.name:
            if e.index != at:
                misplaced.append(e)
            return L.Var(s.acc, t.dtype) if s.epilogue is None else s.epilogue
        if isinstance(e, L.Var) and e.name in mapping:
            return mapping[e.name]
        return None
    epilogue = substitute(store.value, rewrite)
    if misplaced or expression_depth(epilogue) > MAX_LEVELS:   # (chained epilogues: depth.py's cap)
        return None
    fused = dataclasses.replace(s, out=dataclasses.replace(s.out, buffer=store.buffer), epilogue=epilogue)
    roles: dict[str, L.Buffer] = {}
    for b in km.buffers + kp.buffers:
        if b.name != t.name and (b.name not in roles or b.role == "output"):
            roles[b.name] = b
    return L.Kernel(kp.name, list(roles.values()), km.body[:-1] + [fused], list(kp.sizes))   # renamed by the caller


def _same_static_size(a, b) -> bool:
    if tuple(a) == tuple(b):
        return True
    try:         # symbolic sizes compare as polynomials: (s0*s1, n) read as (s0, s1, n)
        return math.prod(I.symbolic(d) for d in a) == math.prod(I.symbolic(d) for d in b)
    except ValueError:
        return False


def _logical_dims(s: L.Matmul, shape: tuple[int, ...]) -> Optional[list[L.Expr]]:
    """For each dim of the dense output buffer, the Matmul index it walks (0 if size 1)."""
    names = s.index
    try:         # sizes and strides as ints or symbolic Dims (run-time sizes: tc.export's dynamic=)
        extents = [I.symbolic(e) for e in (*s.batch, s.m, s.n)]
        strides = [I.symbolic(st) for st in s.out.strides]
        shape = [I.symbolic(d) for d in shape]
    except ValueError:
        return None
    dims: list[L.Expr] = []
    for d, size in enumerate(shape):
        if size == 1:
            dims.append(I.ic(0))
            continue
        dense = math.prod(shape[d + 1:])
        match = [q for q in range(len(extents)) if extents[q] == size and strides[q] == dense]
        if len(match) != 1:
            return None
        dims.append(L.Var(names[match[0]], L.INDEX))
    return dims
