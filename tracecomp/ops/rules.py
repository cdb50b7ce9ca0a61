"""Shape and dtype rules: from argument types to result types, one function per kind.

`infer(op, args)` takes the op's arguments by name, with every Tensor argument given as
its TensorType (a list of them for Tensor[]; a Python number where an elementwise op
was passed a scalar) and returns the result TensorTypes.  Eager execution, the tracer
and the IR verifier all call this, so all three agree on every shape and dtype.
"""
from __future__ import annotations

import math

import numpy as np
from typing import Any, Callable

from ..core import dtypes as dt
from ..core.dtypes import DType
from ..core.errors import ArgumentError, DTypeError, ShapeError
from ..core.symbolic import Dim, DynamicShapeError, is_dynamic
from ..core.types import TensorType
from .table import OpDef, per_kind
from .windows import windows

RULES: dict[str, Callable[[OpDef, dict[str, Any]], list[TensorType]]] = {}


rule = per_kind(RULES)


def infer(op: OpDef, args: dict[str, Any]) -> list[TensorType]:
    if op.kind not in RULES:
        raise ShapeError(f"{op.full_name}: no shape rule for kind '{op.kind}'")
    for name, allowed in op.choices:
        if args.get(name) not in allowed:
            raise ArgumentError(f"{op.full_name}: argument '{name}' must be one of "
                                f"{', '.join(map(repr, allowed))}, got {args.get(name)!r}")
    return [_addressable(op, t) for t in RULES[op.kind](op, args)]


MAX_BYTES = 2 ** 63 - 1      # a tensor's bytes must fit the int64 sizes and offsets of the code


def _addressable(op: OpDef, t: TensorType) -> TensorType:
    """`t`, if its bytes fit int64 (sizes, strides and offsets in every backend are int64)."""
    if all(isinstance(d, int) for d in t.shape) and t.numel * t.dtype.itemsize > MAX_BYTES:
        raise ShapeError(f"{op.full_name}: a result of shape {t.shape} ({t.dtype.label}) has "
                         f"{t.numel} elements, more bytes than a 64-bit size can count")
    return t


# ---------------------------------------------------------------- shared helpers

def normalize_dim(op: OpDef, dim: int, ndim: int | tuple[int, ...], arg: str = "dim", extra: int = 0) -> int:
    """Map a possibly negative dim into [0, ndim + extra); 0-d tensors accept dim 0 and -1.

    `ndim` may be the tensor's shape instead, so that the error can show it."""
    shape = ndim if isinstance(ndim, tuple) else None
    ndim = len(shape) if shape is not None else ndim
    size = max(ndim + extra, 1)
    if not -size <= dim < size:
        what = f"of shape {shape}" if shape is not None else f"with {ndim} dims"
        raise ShapeError(f"{op.full_name}: argument '{arg}' is {dim}, out of range for a tensor "
                         f"{what} (expected {-size} <= {arg} < {size})")
    return dim % size


def normalize_dims(op: OpDef, dims, ndim: int | tuple[int, ...], arg: str = "dim") -> tuple[int, ...]:
    """None or () means all dims (PyTorch's sum(dim=None)); duplicates are an error.

    `ndim` may be the tensor's shape instead, so that errors can show it."""
    shape, ndim = (ndim, len(ndim)) if isinstance(ndim, tuple) else (ndim, ndim)
    if dims is None or (isinstance(dims, (tuple, list)) and len(dims) == 0):
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    out = tuple(normalize_dim(op, d, shape, arg) for d in dims)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op.full_name}: argument '{arg}' repeats a dim: {tuple(dims)}")
    return tuple(d for d in out if ndim > 0)


def broadcast_shapes(op: OpDef | str, named: list[tuple[str, tuple[int, ...]]]) -> tuple[int, ...]:
    """NumPy broadcasting over (argument name, shape) pairs; errors name both arguments and
    the op (an OpDef, or the name of the composite asking)."""
    ndim = max((len(s) for _, s in named), default=0)
    out = [1] * ndim
    owner = [None] * ndim
    for name, shape in named:
        for i, d in enumerate(shape):
            j = ndim - len(shape) + i
            if d == out[j] or d == 1:
                continue
            if out[j] != 1:
                shapes = ", ".join(f"'{n}' {tuple(s)}" for n, s in named)
                who = op if isinstance(op, str) else op.full_name
                raise ShapeError(f"{who}: shapes cannot broadcast: {shapes}; dim {j - ndim} "
                                 f"is {out[j]} in '{owner[j]}' but {d} in '{name}'")
            out[j], owner[j] = d, name
    return tuple(out)


def _tensor(op: OpDef, args: dict, name: str) -> TensorType:
    t = args[name]
    if not isinstance(t, TensorType):
        raise ShapeError(f"{op.full_name}: argument '{name}' must be a Tensor, got {type(t).__name__}")
    return t


def _check_accepts(op: OpDef, dtype: DType, what: str) -> None:
    ok = {"any": True, "numeric": dtype is not dt.BOOL, "float": dtype.is_floating_point,
          "integral": not dtype.is_floating_point}[op.accepts]
    if not ok:
        raise DTypeError(f"{op.full_name}: {what} has dtype {dtype.label}, but this op accepts "
                         f"{op.accepts} dtypes only")


# ---------------------------------------------------------------- elementwise

def elementwise_dtypes(op: OpDef, args: dict[str, Any]) -> tuple[DType, DType]:
    """(compute dtype, result dtype) of an elementwise op, by its table `dtype` rule."""
    dims, zero, scalars = [], [], []
    for name in op.promote:
        v = args.get(name)
        if isinstance(v, TensorType):
            (dims if v.ndim else zero).append(v.dtype)
        elif v is not None:
            if isinstance(v, int) and not isinstance(v, bool) and not -2**63 <= v < 2**63:
                raise DTypeError(f"{op.full_name}: argument '{name}' is the Python int {v}, which "
                                 "does not fit in int64")
            scalars.append(dt.scalar_dtype(v))
    common = dt.result_type(dims, zero, scalars)
    if op.dtype_rule == "logical":
        return dt.BOOL, dt.BOOL
    _check_accepts(op, common, "the promoted input")
    if op.dtype_rule == "bool":
        return common.compute, dt.BOOL
    if op.dtype_rule == "float" and not common.is_floating_point:
        common = dt.DEFAULT_FLOAT
    if common.is_integer:
        _check_int_scalars(op, args, common)
    return common.compute, common       # half types compute in float32, round once at the end


def _check_int_scalars(op: OpDef, args: dict[str, Any], dtype: DType) -> None:
    """A Python int must fit the integer dtype it computes in (PyTorch refuses to wrap it);
    an integer tensor to a negative Python-int power is refused, as in PyTorch."""
    info = np.iinfo(dtype.np)
    for name in op.promote:
        v = args.get(name)
        if isinstance(v, int) and not isinstance(v, bool) and not info.min <= v <= info.max:
            raise DTypeError(f"{op.full_name}: argument '{name}' is the Python int {v}, which does not "
                             f"fit in {dtype.label} without overflow")
    exponent = args.get("exponent")
    if op.name == "pow" and isinstance(exponent, int) and not isinstance(exponent, bool) and exponent < 0:
        raise DTypeError(f"{op.full_name}: integers to negative integer powers are not allowed "
                         f"(exponent {exponent}); use a float tensor")


# Elementwise arguments that select (where's condition, masked_fill's mask): PyTorch takes
# bool tensors only, and a float one would be true where nonzero eagerly but not compiled.
BOOL_ARGUMENTS = ("condition", "mask")


@rule("elementwise")
def _elementwise(op: OpDef, args: dict[str, Any]) -> list[TensorType]:
    tensors = [(a.name, args[a.name]) for a in op.schema.tensor_arguments
               if isinstance(args.get(a.name), TensorType)]
    if not tensors:
        names = ", ".join(f"'{a.name}'" for a in op.schema.tensor_arguments)
        raise ArgumentError(f"{op.full_name}: needs at least one Tensor among {names}, got only "
                            f"Python scalars ({', '.join(repr(args.get(a.name)) for a in op.schema.tensor_arguments)})")
    for name, t in tensors:
        if name in BOOL_ARGUMENTS and t.dtype is not dt.BOOL:
            raise DTypeError(f"{op.full_name}: '{name}' must be a bool tensor (as in PyTorch), got "
                             f"{t.dtype.label}; compare it, e.g. {name} != 0")
    shape = broadcast_shapes(op, [(n, t.shape) for n, t in tensors])
    result = elementwise_dtypes(op, args)[1]
    _check_alpha(op, args.get("alpha"), result)
    return [TensorType(shape, result)]


def _check_alpha(op: OpDef, alpha, result: DType) -> None:
    """PyTorch's alpha_check: an integral result would silently truncate a float alpha."""
    if isinstance(alpha, bool) and result is not dt.BOOL:
        raise DTypeError(f"{op.full_name}: a bool 'alpha' is only supported for bool results, "
                         f"got a {result.label} result")
    if isinstance(alpha, float) and not result.is_floating_point:
        raise DTypeError(f"{op.full_name}: argument 'alpha' must not be a float ({alpha}) when the "
                         f"result dtype is {result.label}; use an int alpha or floating point inputs")


# ---------------------------------------------------------------- reductions

def reduced_shape(op: OpDef, shape: tuple[int, ...], dims: tuple[int, ...], keepdim: bool):
    if keepdim:
        return tuple(1 if i in dims else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in dims)


def _reduction_dtype(op: OpDef, x: TensorType, requested: DType | None) -> DType:
    if requested is not None:
        return requested
    if op.impl in ("all", "any"):
        return dt.BOOL
    if op.impl in ("sum", "prod") and not x.dtype.is_floating_point:
        return dt.INT64
    if op.impl in ("mean", "var", "std") and not x.dtype.is_floating_point:
        hint = ".float() or pass dtype=" if any(a.name == "dtype" for a in op.schema.arguments) else ".float()"
        raise DTypeError(f"{op.full_name}: argument 'self' must have a floating point dtype, got "
                         f"{x.dtype.label} of shape {x.shape} (cast with {hint})")
    return x.dtype


@rule("scan")
def _scan(op: OpDef, args):
    """cumsum/cumprod (integers accumulate in int64), cummax/cummin (values and int64
    indices), logcumsumexp (floating point only)."""
    x = _tensor(op, args, "self")
    normalize_dim(op, args["dim"], x.shape)
    if op.impl == "logaddexp" and not x.dtype.is_floating_point:
        raise DTypeError(f"{op.full_name}: argument 'self' must have a floating point dtype, got "
                         f"{x.dtype.label} of shape {x.shape} (cast with .float())")
    if op.impl in ("max", "min"):
        return [TensorType(x.shape, x.dtype), TensorType(x.shape, dt.INT64)]
    return [TensorType(x.shape, _reduction_dtype(op, x, args.get("dtype")))]


@rule("sort")
def _sort(op: OpDef, args):
    """argsort: int64 positions along dim, the input's shape."""
    x = _tensor(op, args, "self")
    normalize_dim(op, args["dim"], x.shape)
    return [TensorType(x.shape, dt.INT64)]


@rule("search")
def _search(op: OpDef, args):
    """searchsorted: for each value, its insertion point in the innermost dim of the sorted
    sequence (one sequence for all values, or one per row of the leading dims)."""
    seq, values = _tensor(op, args, "sorted_sequence"), _tensor(op, args, "self")
    if seq.ndim == 0:
        raise ShapeError(f"{op.full_name}: sorted_sequence must have at least 1 dim, got a 0-d tensor")
    if seq.ndim > 1 and seq.shape[:-1] != values.shape[:-1]:
        raise ShapeError(f"{op.full_name}: sorted_sequence of shape {seq.shape} and self of shape "
                         f"{values.shape} must agree in all dims but the last (or the sequence be 1-D)")
    sorter = args.get("sorter")
    if sorter is not None and (_tensor(op, args, "sorter").shape != seq.shape or sorter.dtype != dt.INT64):
        raise ShapeError(f"{op.full_name}: sorter must be an int64 tensor of sorted_sequence's shape "
                         f"{seq.shape}, got {sorter.dtype.label} of shape {sorter.shape}")
    side = args.get("side")
    if side not in (None, "left", "right"):
        raise ArgumentError(f"{op.full_name}: side must be 'left' or 'right', got {side!r}")
    if side == "left" and args.get("right"):
        raise ArgumentError(f"{op.full_name}: side='left' and right=True contradict each other")
    return [TensorType(values.shape, dt.INT32 if args.get("out_int32") else dt.INT64)]


@rule("reduction")
def _reduction(op: OpDef, args: dict[str, Any]) -> list[TensorType]:
    x = _tensor(op, args, "self")
    _check_accepts(op, x.dtype, "'self'")
    dims = normalize_dims(op, args.get("dim"), x.shape)
    if op.impl in ("amax", "amin") and any(x.shape[d] == 0 for d in dims):
        raise ShapeError(f"{op.full_name}: cannot reduce over an empty dim of shape {x.shape}")
    shape = reduced_shape(op, x.shape, dims, bool(args.get("keepdim", False)))
    return [TensorType(shape, _reduction_dtype(op, x, args.get("dtype")))]


@rule("arg_reduction")
def _arg_reduction(op: OpDef, args: dict[str, Any]) -> list[TensorType]:
    """argmax/argmin, and max.dim/min.dim which also return the values."""
    x = _tensor(op, args, "self")
    dim = args.get("dim")
    if dim is None:
        shape = (1,) * x.ndim if args.get("keepdim") else ()
        dims = tuple(range(x.ndim))
    else:
        d = normalize_dim(op, dim, x.shape)
        dims = (d,) if x.ndim else ()       # a 0-d tensor takes dim 0 or -1 and stays 0-d
        shape = reduced_shape(op, x.shape, dims, bool(args.get("keepdim")))
    if any(x.shape[d] == 0 for d in dims):
        raise ShapeError(f"{op.full_name}: cannot reduce over an empty dim of shape {x.shape}")
    index = TensorType(shape, dt.INT64)
    return [TensorType(shape, x.dtype), index] if len(op.schema.returns) == 2 else [index]


@rule("variance")
def _variance(op: OpDef, args: dict[str, Any]) -> list[TensorType]:
    x = _tensor(op, args, "self")
    dims = normalize_dims(op, args.get("dim"), x.shape)
    shape = reduced_shape(op, x.shape, dims, bool(args.get("keepdim", False)))
    return [TensorType(shape, _reduction_dtype(op, x, None))]


# ---------------------------------------------------------------- matmul

@rule("matmul")
def _matmul(op: OpDef, args: dict[str, Any]) -> list[TensorType]:
    """torch.matmul: 1-D is a vector, 2-D a matrix, more dims batch and broadcast."""
    a, b = _tensor(op, args, "self"), _tensor(op, args, "other")
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"{op.full_name}: both arguments need at least 1 dim, got shapes "
                         f"{a.shape} and {b.shape}")
    if a.dtype != b.dtype:
        raise DTypeError(f"{op.full_name}: both arguments need the same dtype, got "
                         f"{a.dtype.label} and {b.dtype.label}")
    if a.dtype is dt.BOOL:
        raise DTypeError(f"{op.full_name}: bool tensors are not supported")
    ash = a.shape if a.ndim > 1 else (1,) + a.shape
    bsh = b.shape if b.ndim > 1 else b.shape + (1,)
    if ash[-1] != bsh[-2]:
        raise ShapeError(f"{op.full_name}: inner dims do not match: 'self' {a.shape} @ 'other' "
                         f"{b.shape} ({ash[-1]} != {bsh[-2]})")
    batch = broadcast_shapes(op, [("self", ash[:-2]), ("other", bsh[:-2])])
    shape = batch + (ash[-2] if a.ndim > 1 else None, bsh[-1] if b.ndim > 1 else None)
    return [TensorType(tuple(d for d in shape if d is not None), a.dtype)]


# ---------------------------------------------------------------- shape and view ops

def infer_size(op: OpDef, shape, numel: int, arg: str = "shape", dims=None) -> tuple[int, ...]:
    """Resolve one -1 in a requested shape; the element count must stay the same.  With the
    input's `dims`, sizes found on both sides cancel first: a dynamic size divides exactly
    only by a single term, and a window count (h - k + 3) is no single term."""
    shape = tuple(shape)
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise ShapeError(f"{op.full_name}: '{arg}' {shape} may hold only one -1 and no other negative size")
    known, rest = math.prod(d for d in shape if d != -1), numel
    if -1 in shape and dims is not None and any(isinstance(d, Dim) for d in dims):
        rest, known = _cancelled(dims, [d for d in shape if d != -1])
    if -1 in shape:
        if isinstance(rest, Dim) and known != 0:    # (a floor division would not multiply back)
            inferred = rest.divided_exactly(known)
        elif known == 0 or rest % known:
            raise ShapeError(f"{op.full_name}: cannot infer the -1 in '{arg}' {shape} for {numel} elements")
        else:
            inferred = rest // known
        shape = tuple(inferred if d == -1 else d for d in shape)
    if not equal_sizes(math.prod(shape), numel):       # (dynamic sizes: maybe guarded)
        raise ShapeError(f"{op.full_name}: '{arg}' {shape} is invalid for an input of {numel} elements")
    return shape


def _cancelled(dims, known) -> tuple:
    """(the product of `dims`, of `known`) with the factors equal in structure on both sides left out."""
    rest, left = list(dims), []
    for d in known:
        same = next((i for i, r in enumerate(rest) if type(r) is type(d) and
                     (r.terms == d.terms if isinstance(d, Dim) else r == d)), None)
        if same is None:
            left.append(d)
        else:
            rest.pop(same)
    return math.prod(rest), math.prod(left)


@rule("reshape")
def _reshape(op: OpDef, args):
    x = _tensor(op, args, "self")
    return [TensorType(infer_size(op, args["shape"], x.numel, dims=x.shape), x.dtype)]


@rule("permute")
def _permute(op: OpDef, args):
    x = _tensor(op, args, "self")
    dims = tuple(normalize_dim(op, d, x.shape, "dims") for d in args["dims"])
    if sorted(dims) != list(range(x.ndim)):
        raise ShapeError(f"{op.full_name}: 'dims' {tuple(args['dims'])} is not a permutation of "
                         f"the {x.ndim} dims of a tensor of shape {x.shape}")
    return [TensorType(tuple(x.shape[d] for d in dims), x.dtype)]


def flip_dims(op: OpDef, dims, shape) -> tuple[int, ...]:
    """The dims flip reverses, normalized; an empty list reverses none (not all, as sum's)."""
    return normalize_dims(op, dims, tuple(shape), "dims") if len(dims) else ()


@rule("flip")
def _flip(op: OpDef, args):
    x = _tensor(op, args, "self")
    flip_dims(op, args["dims"], x.shape)
    return [TensorType(x.shape, x.dtype)]


@rule("expand")
def _expand(op: OpDef, args):
    x = _tensor(op, args, "self")
    size = tuple(args["size"])
    if len(size) < x.ndim:
        raise ShapeError(f"{op.full_name}: 'size' {size} has fewer dims than the input {x.shape}")
    lead = len(size) - x.ndim
    out = []
    for i, s in enumerate(size):
        have = x.shape[i - lead] if i >= lead else None
        if s == -1:
            if have is None:
                raise ShapeError(f"{op.full_name}: -1 is not allowed for a new leading dim in 'size' {size}")
            s = have
        elif have not in (None, 1, s):
            raise ShapeError(f"{op.full_name}: cannot expand shape {x.shape} to {size}: dim {i} is "
                             f"{have}, which is not 1")
        out.append(s)
    return [TensorType(tuple(out), x.dtype)]


@rule("squeeze")
def _squeeze(op: OpDef, args):
    x = _tensor(op, args, "self")
    dim = args.get("dim")
    # squeeze(x) squeezes every size-1 dim, squeeze(x, ()) none (PyTorch), unlike a reduction's dim=()
    dims = () if isinstance(dim, (tuple, list)) and len(dim) == 0 else normalize_dims(op, dim, x.shape)
    return [TensorType(tuple(d for i, d in enumerate(x.shape) if not (i in dims and d == 1)), x.dtype)]


@rule("unsqueeze")
def _unsqueeze(op: OpDef, args):
    x = _tensor(op, args, "self")
    d = normalize_dim(op, args["dim"], x.shape, extra=1)
    return [TensorType(x.shape[:d] + (1,) + x.shape[d:], x.dtype)]


@rule("select")
def _select(op: OpDef, args):
    x = _tensor(op, args, "self")
    if x.ndim == 0:
        raise ShapeError(f"{op.full_name}: cannot index a 0-d tensor")
    d = normalize_dim(op, args["dim"], x.shape)
    i = args["index"]
    if not -x.shape[d] <= i < x.shape[d]:
        raise ShapeError(f"{op.full_name}: index {i} is out of bounds for dim {d} with size {x.shape[d]}")
    return [TensorType(x.shape[:d] + x.shape[d + 1:], x.dtype)]


def slice_bounds(size: int, start, end, step: int) -> tuple[int, int, int]:
    """Python slice semantics (clamped, negatives from the end), positive steps only.  A
    dynamic size (symbolic.Dim) takes the same steps; the comparisons it cannot decide are
    answered while tracing and kept as guards (symbolic.answering_at)."""
    if isinstance(size, int):
        start, end, _ = slice(start, end, step).indices(size)
        return start, max(end, start), step

    def clamp(i, default):
        if i is None:
            return default
        i = wrap_index(i, size)
        return 0 if i < 0 else size if i > size else i
    start, end = clamp(start, 0), clamp(end, size)
    return start, end if end > start else start, step


def equal_sizes(a, b) -> bool:
    """a == b; for dynamic sizes the algebra cannot equate (a size and a floor division of
    another: the src of a strided slice_scatter), equal at the traced call's sizes, and kept
    as two order guards (symbolic.answering_at) that later calls must meet."""
    if a == b:
        return True
    if not (is_dynamic(a) or is_dynamic(b)):
        return False
    try:
        return a >= b and a <= b
    except DynamicShapeError:
        return False


def wrap_index(i: int, size):
    """An index counted from the end (negative) as one from the start; without `%`, which a
    dynamic size cannot take."""
    return i + size if i < 0 else i


@rule("slice")
def _slice(op: OpDef, args):
    x = _tensor(op, args, "self")
    d = normalize_dim(op, args["dim"], x.shape)
    if args["step"] <= 0:
        raise ShapeError(f"{op.full_name}: 'step' must be greater than zero, got {args['step']}")
    start, end, step = slice_bounds(x.shape[d], args["start"], args["end"], args["step"])
    n = (end - start + step - 1) // step
    return [TensorType(x.shape[:d] + (n,) + x.shape[d + 1:], x.dtype)]


def cat_kept(shapes) -> list[int]:
    """The tensors cat joins: all but PyTorch's legacy empty ones of shape (0,), which it skips
    whatever the others' shapes (they still take part in type promotion)."""
    kept = [i for i, s in enumerate(shapes) if tuple(s) != (0,)]
    return kept if kept else [0]


@rule("cat")
def _cat(op: OpDef, args):
    ts = args["tensors"]
    if not ts:
        raise ShapeError(f"{op.full_name}: expects a non-empty list of tensors")
    for i, t in enumerate(ts):
        if t.ndim == 0:
            raise ShapeError(f"{op.full_name}: tensors[{i}] is 0-d (shape ()); a zero-dimensional "
                             "tensor cannot be concatenated (use stack, or unsqueeze it first)")
    kept = cat_kept([t.shape for t in ts])
    first = ts[kept[0]]
    d = normalize_dim(op, args["dim"], first.shape)
    dtype = first.dtype
    for t in ts:
        dtype = dt.promote_types(dtype, t.dtype)
    for i in kept:
        t = ts[i]
        if t.ndim != first.ndim or any(a != b for j, (a, b) in enumerate(zip(t.shape, first.shape)) if j != d):
            raise ShapeError(f"{op.full_name}: tensors[{i}] has shape {t.shape}, which does not match "
                             f"tensors[{kept[0]}] {first.shape} outside dim {d}")
    total = sum(ts[i].shape[d] for i in kept)
    return [TensorType(first.shape[:d] + (total,) + first.shape[d + 1:], dtype)]


def split_sizes(op: OpDef, size: int, split) -> list[int]:
    """Sizes of the pieces: an int splits into equal chunks (last smaller), a list is explicit."""
    if isinstance(split, int):
        if split <= 0 and size > 0:
            raise ShapeError(f"{op.full_name}: split size must be positive, got {split}")
        return [min(split, size - i) for i in range(0, size, split)] if size else [0]
    if sum(split) != size or any(s < 0 for s in split):
        raise ShapeError(f"{op.full_name}: split sizes {tuple(split)} do not add up to the dim size {size}")
    return list(split)


@rule("split")
def _split(op: OpDef, args):
    x = _tensor(op, args, "self")
    d = normalize_dim(op, args["dim"], x.shape)
    sizes = split_sizes(op, x.shape[d], args["split_size"])
    return [TensorType(x.shape[:d] + (s,) + x.shape[d + 1:], x.dtype) for s in sizes]


def _check_index(op: OpDef, index: TensorType, name: str = "index"):
    if index.dtype not in (dt.INT32, dt.INT64):
        raise DTypeError(f"{op.full_name}: '{name}' must be an int32 or int64 tensor, got {index.dtype.label}")


@rule("index_select")
def _index_select(op: OpDef, args):
    x, index = _tensor(op, args, "self"), _tensor(op, args, "index")
    _check_index(op, index)
    if index.ndim > 1:
        raise ShapeError(f"{op.full_name}: 'index' must be 0-D or 1-D, got shape {index.shape}")
    d = normalize_dim(op, args["dim"], x.shape)
    n = index.shape[0] if index.ndim else 1
    return [TensorType(x.shape[:d] + (n,) + x.shape[d + 1:] if x.ndim else (), x.dtype)]


@rule("gather")
def _gather(op: OpDef, args):
    x, index = _tensor(op, args, "self"), _tensor(op, args, "index")
    _check_index(op, index)
    d = normalize_dim(op, args["dim"], x.shape)
    # As in PyTorch: a 0-d self gathers like a one-element vector, and an empty index
    # gathers nothing whatever its shape.
    shape = x.shape if x.ndim else (1,) * min(index.ndim, 1)
    if index.numel == 0:
        return [TensorType(index.shape, x.dtype)]
    if index.ndim != len(shape) or any(i > s for j, (i, s) in enumerate(zip(index.shape, shape)) if j != d):
        raise ShapeError(f"{op.full_name}: 'index' shape {index.shape} must have the same number of "
                         f"dims as 'self' {x.shape} and be no larger outside dim {d}")
    return [TensorType(index.shape, x.dtype)]


@rule("scatter")
def _scatter(op: OpDef, args):
    """torch.scatter and scatter_add: index, src and self have the same number of dims; index is no larger
    than src in any dim and no larger than self outside `dim`; self and src share a dtype."""
    x, index, src = _tensor(op, args, "self"), _tensor(op, args, "index"), _tensor(op, args, "src")
    _check_index(op, index)
    d = normalize_dim(op, args["dim"], x.shape)
    if src.dtype != x.dtype:
        raise DTypeError(f"{op.full_name}: 'self' ({x.dtype.label}) and 'src' ({src.dtype.label}) "
                         "must have the same dtype")
    if index.numel == 0:              # scatters nothing, whatever the shapes (as in PyTorch)
        return [TensorType(x.shape, x.dtype)]
    if not index.ndim == src.ndim == x.ndim or \
            any(i > s for i, s in zip(index.shape, src.shape)) or \
            any(i > s for j, (i, s) in enumerate(zip(index.shape, x.shape)) if j != d):
        raise ShapeError(f"{op.full_name}: 'index' {index.shape} must have as many dims as 'self' "
                         f"{x.shape} and 'src' {src.shape}, be no larger than 'src' in any dim and "
                         f"no larger than 'self' outside dim {d}")
    return [TensorType(x.shape, x.dtype)]


@rule("index_add")
def _index_add(op: OpDef, args):
    """torch.index_add: source has self's shape with dim's size replaced by the index's length."""
    x, index, src = _tensor(op, args, "self"), _tensor(op, args, "index"), _tensor(op, args, "source")
    _check_index(op, index)
    if index.ndim > 1:
        raise ShapeError(f"{op.full_name}: 'index' must be 0-D or 1-D, got shape {index.shape}")
    d = normalize_dim(op, args["dim"], x.shape)
    if src.dtype != x.dtype:
        raise DTypeError(f"{op.full_name}: 'self' ({x.dtype.label}) and 'source' ({src.dtype.label}) "
                         "must have the same dtype")
    n = index.shape[0] if index.ndim else 1
    want = x.shape[:d] + (n,) + x.shape[d + 1:] if x.ndim else ()
    if src.shape != want and not (src.ndim == 0 and n == 1 and x.ndim <= 1):
        raise ShapeError(f"{op.full_name}: 'source' has shape {src.shape}, expected {want} ('self' "
                         f"{x.shape} with dim {d} of the index's length {n})")
    _check_alpha(op, args.get("alpha"), x.dtype)
    return [TensorType(x.shape, x.dtype)]


def _backward_input_sizes(op: OpDef, args) -> tuple[int, ...]:
    sizes = tuple(args["input_sizes"])
    if any(s < 0 for s in sizes):
        raise ShapeError(f"{op.full_name}: 'input_sizes' {sizes} has a negative dim")
    return sizes


@rule("select_backward")
def _select_backward(op: OpDef, args):
    """The gradient of select: grad_output has input_sizes without `dim`."""
    g, sizes = _tensor(op, args, "grad_output"), _backward_input_sizes(op, args)
    if not sizes:
        raise ShapeError(f"{op.full_name}: 'input_sizes' must have at least one dim")
    d = normalize_dim(op, args["dim"], sizes)
    if not -sizes[d] <= args["index"] < sizes[d]:
        raise ShapeError(f"{op.full_name}: index {args['index']} is out of bounds for dim {d} with size {sizes[d]}")
    if g.shape != sizes[:d] + sizes[d + 1:]:
        raise ShapeError(f"{op.full_name}: 'grad_output' has shape {g.shape}, but selecting dim {d} of "
                         f"{sizes} gives {sizes[:d] + sizes[d + 1:]}")
    return [TensorType(sizes, g.dtype)]


@rule("slice_backward")
def _slice_backward(op: OpDef, args):
    """The gradient of slice: grad_output has input_sizes with `dim` sliced start:end:step."""
    g, sizes = _tensor(op, args, "grad_output"), _backward_input_sizes(op, args)
    d = normalize_dim(op, args["dim"], sizes)
    if args["step"] <= 0:
        raise ShapeError(f"{op.full_name}: 'step' must be greater than zero, got {args['step']}")
    start, end, step = slice_bounds(sizes[d], args["start"], args["end"], args["step"])
    want = sizes[:d] + ((end - start + step - 1) // step,) + sizes[d + 1:]
    if len(g.shape) != len(want) or not all(equal_sizes(a, b) for a, b in zip(g.shape, want)):
        raise ShapeError(f"{op.full_name}: 'grad_output' has shape {g.shape}, but slicing dim {d} of "
                         f"{sizes} by {args['start']}:{args['end']}:{args['step']} gives {want}")
    return [TensorType(sizes, g.dtype)]


def window_counts(op: OpDef, spatial, kernel, dilation, padding, stride) -> tuple[int, ...]:
    """The number of sliding-window positions per spatial dim (im2col's blocks), with
    PyTorch's checks on the window parameters (ops/windows.py, shared with the layers)."""
    return tuple(windows(op.full_name, spatial, kernel, dilation, padding, stride))


@rule("im2col")
def _im2col(op: OpDef, args):
    """(N, C, H, W) or (C, H, W) -> (N, C*kh*kw, L) or (C*kh*kw, L): every window's values
    as a column, L windows (F.unfold)."""
    x = _tensor(op, args, "self")
    if x.ndim not in (3, 4) or 0 in x.shape[-3:]:
        raise ShapeError(f"{op.full_name}: expected a 3-D or 4-D input with nonzero channels and "
                         f"spatial dims, got shape {x.shape}")
    k = tuple(args["kernel_size"])
    counts = window_counts(op, x.shape[-2:], k, args["dilation"], args["padding"], args["stride"])
    return [TensorType(x.shape[:-3] + (x.shape[-3] * k[0] * k[1], counts[0] * counts[1]), x.dtype)]


@rule("col2im")
def _col2im(op: OpDef, args):
    """im2col's adjoint (F.fold): (N, C*kh*kw, L) -> (N, C, H, W), overlapping windows summed."""
    x = _tensor(op, args, "self")
    k, size = tuple(args["kernel_size"]), tuple(args["output_size"])
    if x.ndim not in (2, 3) or 0 in x.shape[-2:]:
        raise ShapeError(f"{op.full_name}: expected a 2-D or 3-D input with nonzero dims, got shape {x.shape}")
    if len(size) != 2 or any(s < 1 for s in size):
        raise ShapeError(f"{op.full_name}: 'output_size' must be 2 positive ints, got {size}")
    counts = window_counts(op, size, k, args["dilation"], args["padding"], args["stride"])
    if x.shape[-2] % (k[0] * k[1]):
        raise ShapeError(f"{op.full_name}: the input's dim {x.ndim - 2} ({x.shape[-2]}) must divide by the "
                         f"kernel's {k[0]} * {k[1]} positions")
    if x.shape[-1] != counts[0] * counts[1]:
        raise ShapeError(f"{op.full_name}: the input's last dim ({x.shape[-1]}) must be the number of "
                         f"windows in output_size {size}: {counts[0]} * {counts[1]} = {counts[0] * counts[1]}")
    return [TensorType(x.shape[:-2] + (x.shape[-2] // (k[0] * k[1]),) + size, x.dtype)]


def pad_pairs(op: OpDef, pad, shape: tuple) -> list[tuple[int, int]]:
    """constant_pad_nd's `pad` as a (before, after) pair for every dim of `shape`: pad lists
    the pairs from the last dim backwards, and the dims it does not reach get (0, 0)."""
    pad = tuple(pad)
    n = len(pad) // 2
    if len(pad) % 2:
        raise ShapeError(f"{op.full_name}: 'pad' {pad} must hold (before, after) pairs, but its "
                         f"length {len(pad)} is odd")
    if n > len(shape):
        raise ShapeError(f"{op.full_name}: 'pad' {pad} pads {n} dims, but the input of shape {shape} "
                         f"has only {len(shape)}")
    pairs = [(0, 0)] * (len(shape) - n) + [(pad[2 * k], pad[2 * k + 1]) for k in reversed(range(n))]
    for d, (size, (lo, hi)) in enumerate(zip(shape, pairs)):
        if isinstance(size, int) and size + lo + hi < 0:
            raise ShapeError(f"{op.full_name}: dim {d} of the input of shape {shape} has size {size}; "
                             f"padding it by ({lo}, {hi}) gives the negative size {size + lo + hi}")
    return pairs


@rule("attention")
def _attention(op: OpDef, args):
    """The fused attention.  impl forward: output (..., L, Ev) and logsumexp (..., L); impl
    backward: the gradients of query, key and value.  Query (..., L, E), key (..., S, E) and
    value (..., S, Ev) share their batch dims (scaled_dot_product_attention broadcasts them
    first); attn_mask, bool or in the query's dtype, broadcasts to the scores (..., L, S)."""
    q, k, v = (_tensor(op, args, n) for n in ("query", "key", "value"))
    shapes = f"query {q.shape}, key {k.shape}, value {v.shape}"
    if min(q.ndim, k.ndim, v.ndim) < 2 or not q.dtype.is_floating_point or not q.dtype == k.dtype == v.dtype:
        raise DTypeError(f"{op.full_name}: expects floating-point query, key and value of one dtype and at "
                         f"least 2 dims, got {shapes} ({q.dtype.label}, {k.dtype.label}, {v.dtype.label})")
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2] or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ShapeError(f"{op.full_name}: query, key and value must share their batch dims, the query's and "
                         f"key's feature sizes and the key's and value's lengths must match: {shapes}")
    if args["dropout_p"] != 0:
        raise ArgumentError(f"{op.full_name}: dropout_p must be 0, got {args['dropout_p']} (the fused kernel has "
                            "no dropout; scaled_dot_product_attention takes its unfused path for dropout_p > 0)")
    batch, scores = q.shape[:-2], q.shape[:-1] + (k.shape[-2],)
    if args.get("attn_mask") is not None:
        mask = _tensor(op, args, "attn_mask")
        if args["is_causal"]:
            raise ArgumentError(f"{op.full_name}: give attn_mask or is_causal=True, not both")
        if mask.dtype not in (dt.BOOL, q.dtype):
            raise DTypeError(f"{op.full_name}: attn_mask must be bool or {q.dtype.label} like the query, "
                             f"got {mask.dtype.label}")
        if broadcast_shapes(op, [("attn_mask", mask.shape), ("the scores", scores)]) != scores:
            raise ShapeError(f"{op.full_name}: attn_mask of shape {mask.shape} must broadcast to the scores' "
                             f"shape {scores} ({shapes})")
    out = TensorType(q.shape[:-1] + (v.shape[-1],), q.dtype)
    lse = TensorType(batch + (q.shape[-2],), q.dtype.compute)     # float32 for half queries, as PyTorch's
    if op.impl == "forward":
        return [out, lse]
    for name, want in (("grad_out", out), ("out", out), ("logsumexp", lse)):
        t = _tensor(op, args, name)
        if t != want:
            raise ShapeError(f"{op.full_name}: '{name}' must be {want.dtype.label} of shape {want.shape}, got "
                             f"{t.dtype.label} of shape {t.shape} ({shapes})")
    return [TensorType(q.shape, q.dtype), TensorType(k.shape, k.dtype), TensorType(v.shape, v.dtype)]


@rule("constant_pad_nd")
def _constant_pad_nd(op: OpDef, args):
    x = _tensor(op, args, "self")
    pairs = pad_pairs(op, args["pad"], x.shape)
    return [TensorType(tuple(n + lo + hi for n, (lo, hi) in zip(x.shape, pairs)), x.dtype)]


@rule("cast")
def _cast(op: OpDef, args):
    x = _tensor(op, args, "self")
    return [TensorType(x.shape, args["dtype"])]


# ---------------------------------------------------------------- factories

def _size(op: OpDef, size) -> tuple[int, ...]:
    if any(s < 0 for s in size):
        raise ShapeError(f"{op.full_name}: 'size' {tuple(size)} has a negative dim")
    return tuple(size)


@rule("full")
def _full(op: OpDef, args):
    dtype = args.get("dtype") or dt.scalar_dtype(args["fill_value"])
    return [TensorType(_size(op, args["size"]), dtype)]


@rule("random")
def _random(op: OpDef, args):
    dtype = args.get("dtype") or dt.DEFAULT_FLOAT
    if not dtype.is_floating_point:
        raise DTypeError(f"{op.full_name}: random tensors must be floating point, got {dtype.label}")
    return [TensorType(_size(op, args["size"]), dtype)]


def arange_length(op: OpDef, start, end, step) -> int:
    if step == 0:
        raise ShapeError(f"{op.full_name}: 'step' must be nonzero")
    if any(map(is_dynamic, (start, end, step))):
        # arange(x.shape[1]): the length is a size too, for integer bounds and steps of 1 or -1
        if is_dynamic(step) or step not in (1, -1) or any(isinstance(v, float) for v in (start, end)):
            raise DynamicShapeError(f"{op.full_name}: with a dynamic bound ({start}, {end}) the step must be "
                                    f"the integer 1 or -1 (got {step!r}), so that the length is a size")
        if is_dynamic(start):
            raise DynamicShapeError(f"{op.full_name}: the start ({start}) must be a number, not a dynamic "
                                    "size (the end may be one: arange(x.shape[1]))")
        length = (end - start) * step
        if length < 0:
            raise ShapeError(f"{op.full_name}: upper bound and lower bound inconsistent with step sign "
                             f"(start={start}, end={end}, step={step})")
        return length
    if (end - start) * step < 0:
        raise ShapeError(f"{op.full_name}: upper bound and lower bound inconsistent with step sign "
                         f"(start={start}, end={end}, step={step})")
    return max(0, math.ceil((end - start) / step))


@rule("arange")
def _arange(op: OpDef, args):
    dtype = args.get("dtype")
    if dtype is None:
        floats = any(isinstance(args.get(k), float) for k in ("start", "end", "step"))
        dtype = dt.DEFAULT_FLOAT if floats else dt.INT64
    start, end, step = arange_bounds(args, dtype)
    return [TensorType((arange_length(op, start, end, step),), dtype)]


def arange_bounds(args: dict[str, Any], dtype: DType) -> tuple:
    """(start, end, step) as arange counts them: for an integer dtype each is truncated to
    an integer first, as PyTorch does (arange(0.0, -8.000001, -4.0) in int64 is [0, -4])."""
    bounds = args.get("start", 0), args["end"], args.get("step", 1)
    if dtype.is_floating_point:
        return bounds
    return tuple(int(v) if isinstance(v, float) else v for v in bounds)    # ints and sizes stay
