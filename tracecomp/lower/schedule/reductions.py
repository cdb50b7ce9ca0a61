"""The loop-IR statements of one reduction's output element: sum/mean/prod/amax/amin/all/any,
argmax/argmin (and max.dim/min.dim), var/std.

`statements_at(sched, op, index, tag)` gives `(stmts, values)`: the Reduce loops (and Lets)
that compute the element of `op`'s results at output `index`, and one expression per result
reading their final accumulators.  The scheduler either stores the values (a reduction
kernel of its own) or binds them to Lets inside a row kernel (schedule/rows.py).  Every
name the statements define outside their Reduce bodies ends with `tag`, so the statements
of several reductions can share one scope.  `row_rank(op)` says whether a reduction runs
over the innermost dims of its input, and over how many outer dims it is parallel.
"""
from __future__ import annotations

import math

from ...core import dtypes as dt
from ...ir import Op, Value
from ...ops import rules
from ...ops.table import by_ir_name
from ...core.symbolic import hint
from ..loops import index as I
from ..loops import ir as L
from ..loops.exprs import cast, const

ROW_KINDS = ("reduction", "arg_reduction", "variance")

_LIMITS = {"amax": dt.lowest, "amin": dt.highest}
_COMBINE = {"sum": "add", "mean": "add", "prod": "mul", "amax": "maximum", "amin": "minimum",
            "all": "and", "any": "or"}
_INIT = {"sum": 0, "mean": 0, "prod": 1, "all": True, "any": False}


def reduced_dims(op: Op) -> tuple[tuple[int, ...], bool]:
    """(the reduced dims of `op`'s input, whether the output keeps them as size 1)."""
    opdef = by_ir_name()[op.name]
    args = opdef.arguments_from(op.operands, op.attrs)
    ndim = args["self"].type.ndim
    if opdef.kind == "arg_reduction":
        dim = args.get("dim")
        dims = tuple(range(ndim)) if dim is None else ((dim % ndim,) if ndim else ())
        return dims, bool(args.get("keepdim")) and dim is not None
    return tuple(rules.normalize_dims(opdef, args.get("dim"), ndim)), bool(args.get("keepdim"))


def row_rank(op: Op) -> int:
    """k >= 1 when `op` reduces exactly the input dims k, k+1, ..., ndim-1 (its rows are the
    innermost, contiguous dims and its results are indexed by the k outer dims); else 0."""
    if by_ir_name()[op.name].kind not in ROW_KINDS:
        return 0
    dims, _ = reduced_dims(op)
    ndim = op.operands[0].type.ndim
    if not dims or tuple(sorted(dims)) != tuple(range(ndim - len(dims), ndim)):
        return 0
    return ndim - len(dims)


COLUMN_MIN_INNER = 2      # kept contiguous elements below which a column plan does not pay


def column_plan(sched, op: Op):
    """(combine, init, divisor) when `op` is a plain reduction (sum/mean/prod/amax/amin/all/any)
    whose input's innermost dims, at least COLUMN_MIN_INNER elements of them, are kept: a bias
    gradient's sum(0), say.  Such a reduction accumulates into its output row by row
    (schedule._column_reduction); None otherwise."""
    opdef = by_ir_name()[op.name]
    if opdef.kind != "reduction" or opdef.impl not in _COMBINE or len(op.results) != 1:
        return None
    dims, _ = reduced_dims(op)
    shape = op.operands[0].type.shape
    if not dims or not shape:
        return None
    inner = math.prod(shape[max(dims) + 1:])
    if hint(inner) < COLUMN_MIN_INNER:
        return None
    t = op.result.type.dtype
    init = _LIMITS[opdef.impl](t) if opdef.impl in _LIMITS else _INIT[opdef.impl]
    divisor = math.prod(shape[d] for d in dims) if opdef.impl == "mean" else None
    return _COMBINE[opdef.impl], init, divisor


def column_arg_plan(op: Op):
    """(better, limit) when `op` is max.dim or min.dim (values and indices) over one dim
    whose inner dims, at least COLUMN_MIN_INNER elements of them, are kept: a max-pool's
    max over im2col's window axis.  It then updates both outputs row by row in memory
    order (schedule._column_arg_reduction); None otherwise."""
    opdef = by_ir_name()[op.name]
    if opdef.kind != "arg_reduction" or len(op.results) != 2:
        return None
    dims, _ = reduced_dims(op)
    shape = op.operands[0].type.shape
    if len(dims) != 1 or hint(math.prod(shape[dims[0] + 1:])) < COLUMN_MIN_INNER:
        return None
    t = op.operands[0].type.dtype
    return ("gt", dt.lowest(t)) if opdef.impl == "max" else ("lt", dt.highest(t))


def arg_takes(better: str, v: L.Expr, best: L.Expr, t) -> L.Expr:
    """Whether v replaces the extreme so far: better, or the first NaN (NaN counts as extreme)."""
    take: L.Expr = L.Binary(better, v, best, dt.BOOL)
    if t.is_floating_point:
        nan_now = L.Binary("and", L.Binary("ne", v, v, dt.BOOL), L.Binary("eq", best, best, dt.BOOL), dt.BOOL)
        take = L.Binary("or", take, nan_now, dt.BOOL)
    return take


def output_index(op: Op, outer: I.Index) -> I.Index:
    """The index of a row reduction's results at the outer index `outer` (row_rank dims)."""
    dims, keepdim = reduced_dims(op)
    return tuple(outer) + (I.ic(0),) * len(dims) if keepdim else tuple(outer)


def statements_at(sched, op: Op, index: I.Index, tag: str = "") -> tuple[list, list[L.Expr]]:
    """The statements computing `op`'s results at output `index`, and their values."""
    opdef = sched.table[op.name]
    args = opdef.arguments_from(op.operands, op.attrs)
    build = {"reduction": _reduction, "arg_reduction": _arg_reduction, "variance": _variance}[opdef.kind]
    return build(sched, op, args, index, tag)


def _reduced_index(out_index, in_shape, dims, keepdim, walks: dict):
    """The input index of a reduction: reduced dim d at `walks[d]`, the others at the output's."""
    outs = iter(out_index)
    index = []
    for d in range(len(in_shape)):
        if d in walks:
            index.append(walks[d])
            if keepdim:
                next(outs)
        else:
            index.append(next(outs))
    return tuple(index)


def _walk(dims, in_shape, r: L.Var) -> dict:
    """The reduced dims `dims` walked row-major by the flat var `r`."""
    return dict(zip(dims, I.delinearize(r, tuple(in_shape[d] for d in dims))))


def _split(dims, ndim: int):
    """(outer, inner) when the reduced dims end in a run over the input's last dims (its
    contiguous rows) and others lie outside it: BatchNorm's (0, 2, 3) of NCHW is (0,), (2, 3).
    One flat walk over both has a division per element and a stride that jumps between rows,
    which keeps LLVM from vectorizing it; an inner loop over the rows does not.  Else None."""
    dims = sorted(dims)
    inner = [ndim - 1] if dims and dims[-1] == ndim - 1 else []
    while inner and inner[0] - 1 in dims:
        inner.insert(0, inner[0] - 1)
    outer = [d for d in dims if d not in inner]
    return (outer, inner) if inner and outer else None


def _reduce_loop(sched, x: Value, dims, keepdim, out_index, accs, update, tag: str, combine=None):
    """A Reduce over `dims` of `x`: `update(accs, value, r)` gives the accumulators' new values.
    With `combine` (per accumulator, the associative fn its update applies: "add" for a sum),
    a Reduce over the outer dims of _split around one over the inner rows, whose partials,
    from the accumulators' inits, the outer one combines."""
    shape = x.type.shape
    split = _split(dims, len(shape)) if combine is not None else None
    x_var = f"x{tag}"
    if split is None:
        r = L.Var(f"r{tag}", L.INDEX)
        value = sched.inliner.value_at(x, _reduced_index(out_index, shape, dims, keepdim, _walk(sorted(dims), shape, r)))
        extent = math.prod(shape[d] for d in dims)
        return L.Reduce(r.name, I.dim(extent), accs, [L.Let(x_var, value)],
                        update([L.Var(a.name, a.dtype) for a in accs], L.Var(x_var, value.dtype), r))
    (outer, inner), ro, ri = split, L.Var(f"ro{tag}", L.INDEX), L.Var(f"ri{tag}", L.INDEX)
    walks = {**_walk(outer, shape, ro), **_walk(inner, shape, ri)}
    value = sched.inliner.value_at(x, _reduced_index(out_index, shape, dims, keepdim, walks))
    parts = [L.Accumulator(f"{a.name}_row", a.dtype, a.init) for a in accs]
    # the flat position, for updates that read it (none of the combinable ones do)
    r = L.Binary("add", L.Binary("mul", ro, I.ic(math.prod(shape[d] for d in inner)), L.INDEX), ri, L.INDEX)
    rows = L.Reduce(ri.name, I.dim(math.prod(shape[d] for d in inner)), parts, [L.Let(x_var, value)],
                    update([L.Var(a.name, a.dtype) for a in parts], L.Var(x_var, value.dtype), r))
    return L.Reduce(ro.name, I.dim(math.prod(shape[d] for d in outer)), accs, [rows],
                    [L.Binary(fn, L.Var(a.name, a.dtype), L.Var(p.name, p.dtype), a.dtype)
                     for fn, a, p in zip(combine, accs, parts)])


def _reduction(sched, op: Op, args: dict, index, tag: str):
    opdef, x, out = sched.table[op.name], args["self"], op.result.type
    dims = rules.normalize_dims(opdef, args.get("dim"), x.type.ndim)
    keep, impl, acc_t = bool(args.get("keepdim")), opdef.impl, out.dtype
    init = _LIMITS[impl](acc_t) if impl in _LIMITS else _INIT[impl]

    def update(accs, v, r):
        return [L.Binary(_COMBINE[impl], accs[0], cast(v, acc_t), acc_t)]

    acc = f"acc{tag}"
    loop = _reduce_loop(sched, x, dims, keep, index, [L.Accumulator(acc, acc_t, const(init, acc_t))], update, tag,
                        [_COMBINE[impl]])
    value: L.Expr = L.Var(acc, acc_t)
    if impl == "mean":
        n = math.prod(x.type.shape[d] for d in dims)
        value = L.Binary("div", value, const(n, acc_t), acc_t)
    return [loop], [value]


def _arg_reduction(sched, op: Op, args: dict, index, tag: str):
    """argmax/argmin and max.dim/min.dim: the first extreme element; NaN counts as extreme."""
    opdef, x = sched.table[op.name], args["self"]
    t = x.type.dtype
    dims, keep = reduced_dims(op)
    better = "gt" if opdef.impl == "max" else "lt"
    limit = _LIMITS["amax" if opdef.impl == "max" else "amin"](t)

    def update(accs, v, r):
        take = arg_takes(better, v, accs[0], t)
        return [L.Select(take, v, accs[0], t), L.Select(take, r, accs[1], L.INDEX)]

    best, at = f"best{tag}", f"at{tag}"
    accs = [L.Accumulator(best, t, const(limit, t)), L.Accumulator(at, L.INDEX, I.ic(0))]
    loop = _reduce_loop(sched, x, dims, keep, index, accs, update, tag)
    values = [L.Cast(L.Var(at, L.INDEX), dt.INT64)]
    if len(op.results) == 2:
        values.insert(0, L.Var(best, t))
    return [loop], values


def _variance(sched, op: Op, args: dict, index, tag: str):
    """Two passes per output element: the mean, then the sum of squared deviations."""
    opdef, x, out = sched.table[op.name], args["self"], op.result.type
    dims = rules.normalize_dims(opdef, args.get("dim"), x.type.ndim)
    keep, t = bool(args.get("keepdim")), out.dtype
    n = math.prod(x.type.shape[d] for d in dims)
    correction = args.get("correction")
    ddof = 1 if correction is None else correction
    s, mean, m2 = f"s{tag}", f"mean{tag}", f"m2{tag}"
    total = _reduce_loop(sched, x, dims, keep, index, [L.Accumulator(s, t, const(0, t))],
                         lambda a, v, r: [L.Binary("add", a[0], cast(v, t), t)], tag, ["add"])
    mean_let = L.Let(mean, L.Binary("div", L.Var(s, t), const(n, t), t))

    def squares(a, v, r):
        d = L.Binary("sub", cast(v, t), L.Var(mean, t), t)
        return [L.Binary("add", a[0], L.Binary("mul", d, d, t), t)]
    second = _reduce_loop(sched, x, dims, keep, index, [L.Accumulator(m2, t, const(0, t))], squares, tag, ["add"])
    var = L.Binary("div", L.Var(m2, t), const(max(n - ddof, 0), t), t)
    return [total, mean_let, second], [L.Unary("sqrt", var, t) if opdef.impl == "std" else var]
