"""NumPy kernels, derived from ops.yaml: the CPU dispatch key's eager kernels and the
reference interpreter's.

`run(op, args, out_types)` gets the op's arguments by name (Tensor arguments as NumPy
arrays, or Python scalars where an elementwise op took one) and the result types the
shape rules computed; it returns one array per result, with exactly those shapes and
dtypes.  Elementwise ops evaluate their table formula on arrays; other kinds have one
kernel per kind family below.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..core.errors import BackendError, OutOfMemoryError, ShapeError
from ..core.types import TensorType
from . import elementwise, rules
from .table import OpDef, per_kind
from ..core import dtypes as dt
from ..core import random as tc_random

_erf = np.frompyfunc(math.erf, 1, 1)


def _np_erf(x):
    x = np.asarray(x)
    # frompyfunc returns a bare Python float, not an array, for 0-d input
    return np.asarray(_erf(x)).astype(x.dtype if x.dtype.kind == "f" else np.float64)


def _np_sign(x):
    """NumPy's sign, but sign(NaN) is 0, as in PyTorch (NumPy has no sign loop for bool)."""
    x = np.asarray(x)
    if x.dtype == np.bool_:
        return x.copy()
    s = np.sign(x)
    return np.where(np.isnan(s), 0, s).astype(s.dtype) if s.dtype.kind == "f" else s


def _np_pow(a, b):
    """np.power, except integer ** negative integer, which NumPy refuses: as in PyTorch (and
    the compiled code) it is 1 for a base of 1, +-1 for -1 and 0 otherwise."""
    a_arr, b_arr = np.asarray(a), np.asarray(b)
    if b_arr.dtype.kind in "iub" and a_arr.dtype.kind in "iub" and np.any(b_arr < 0):
        negative = b_arr < 0
        safe = np.power(a, np.where(negative, 0, b))
        odd = (b_arr % 2) != 0
        special = np.where(a_arr == 1, 1, np.where(a_arr == -1, np.where(odd, -1, 1), 0))
        return np.where(negative, special.astype(safe.dtype), safe)
    return np.power(a, b)


def _np_fmod(a, b):
    """C's fmod (the dividend's sign); an integer remainder by 0 is 0, as in the compiled code
    (PyTorch raises; a compiled kernel cannot, so both give NumPy's answer)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "iub" and b.dtype.kind in "iub":
        return np.where(b == 0, 0, np.fmod(a, np.where(b == 0, 1, b))).astype(np.result_type(a, b))
    return np.fmod(a, b)


PRIMITIVES: dict[str, Callable] = {
    "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2,
    "log1p": np.log1p, "sin": np.sin, "cos": np.cos, "tan": np.tan, "tanh": np.tanh,
    "erf": _np_erf, "sqrt": np.sqrt, "floor": np.floor, "ceil": np.ceil, "round": np.round,
    "abs": np.abs, "sign": _np_sign, "maximum": np.maximum, "minimum": np.minimum,
    "atan2": np.arctan2, "pow": _np_pow, "fmod": _np_fmod, "where": lambda c, a, b: np.where(np.asarray(c, bool), a, b),
    "logical_and": np.logical_and, "logical_or": np.logical_or, "logical_not": np.logical_not,
    "logical_xor": np.logical_xor, "float64": lambda x: np.asarray(x, np.float64),
}
KERNELS: dict[str, Callable[[OpDef, dict, list[TensorType]], list[np.ndarray]]] = {}


kernel = per_kind(KERNELS)


def run(op: OpDef, args: dict[str, Any], out_types: list[TensorType]) -> list[np.ndarray]:
    """Half-precision tensors (bfloat16, float16) enter every kernel as float32 and its results
    leave it rounded once, to nearest even, as PyTorch's CPU kernels compute and accumulate
    them (an elementwise formula, a sum, a matmul)."""
    try:
        with np.errstate(all="ignore"):
            compute_types = [TensorType(t.shape, t.dtype.compute) for t in out_types]
            wide = args if op.kind == "elementwise" else {k: _widen(v) for k, v in args.items()}
            outs = KERNELS[op.kind](op, wide, compute_types)      # elementwise: by its dtype rule
            # conformed and writable (a broadcast view is copied) while a MemoryError is still ours
            return [_writable(_conform(o, t)) for o, t in zip(outs, out_types)]
    except KeyError:
        if op.kind not in KERNELS:
            raise BackendError(f"{op.full_name}: no NumPy kernel for kind '{op.kind}'") from None
        raise
    except (ValueError, IndexError, TypeError, OverflowError) as e:   # e.g. int32 tensor + 2**40
        if isinstance(e, ShapeError):
            raise
        raise BackendError(f"{op.full_name}: {e}") from None
    except MemoryError:
        need = sum(t.numel * t.dtype.itemsize for t in out_types if isinstance(t.numel, int))
        shapes = ", ".join(f"{t.dtype.label}{list(t.shape)}" for t in out_types)
        raise OutOfMemoryError(f"{op.full_name}: cannot allocate {need / 2 ** 30:.1f} GiB for its "
                               f"result ({shapes})") from None


def _widen(v):
    """A half-precision array (or list of them) as float32, exactly; anything else as it is."""
    if isinstance(v, np.ndarray) and v.dtype.itemsize == 2 and dt.is_float_array_dtype(v.dtype):
        return dt.cast_array(v, np.float32)
    if isinstance(v, list) and v and isinstance(v[0], np.ndarray):
        return [_widen(x) for x in v]
    return v


def _writable(a: np.ndarray) -> np.ndarray:
    return a if a.flags.writeable else a.copy()


def _conform(value, t: TensorType) -> np.ndarray:
    """Cast and broadcast a kernel's result to the type the rules promised."""
    arr = np.asarray(value)
    if arr.dtype != t.dtype.np:
        arr = dt.cast_array(arr, t.dtype.np)
    if arr.shape != t.shape:
        arr = np.broadcast_to(arr, t.shape)
    return arr


# ---------------------------------------------------------------- elementwise

def evaluate_elementwise(op: OpDef, env: dict[str, Any], result: dt.DType | None = None) -> Any:
    return elementwise.evaluate(op, env, PRIMITIVES, result)


@kernel("elementwise")
def _elementwise(op: OpDef, args: dict, out_types):
    types = {k: (TensorType(v.shape, _dtype_of(v)) if isinstance(v, np.ndarray) else v)
             for k, v in args.items()}
    compute, result = rules.elementwise_dtypes(op, types)
    env = {}
    for k, v in args.items():
        if isinstance(v, np.ndarray) and (k in op.promote or op.dtype_rule == "logical"):
            v = dt.cast_array(v, compute.np) if v.dtype != compute.np else v
        env[k] = v
    return [evaluate_elementwise(op, env, result)]


def _dtype_of(arr: np.ndarray):
    from ..core.dtypes import from_numpy
    return from_numpy(arr.dtype)


# ---------------------------------------------------------------- reductions

_REDUCERS = {"sum": np.sum, "mean": np.mean, "prod": np.prod, "amax": np.max, "amin": np.min,
             "all": np.all, "any": np.any}


@kernel("reduction")
def _reduction(op: OpDef, args, out_types):
    x = args["self"]
    dims = rules.normalize_dims(op, args.get("dim"), x.ndim)
    fn = _REDUCERS[op.impl]
    kw = {"dtype": out_types[0].dtype.np} if op.impl in ("sum", "mean", "prod") else {}
    if op.impl in ("amax", "amin", "all", "any") and x.dtype != out_types[0].dtype.np:
        x = x.astype(out_types[0].dtype.np)
    return [fn(x, axis=dims, keepdims=bool(args.get("keepdim")), **kw)]


def _running_extreme(x: np.ndarray, take_new) -> tuple[np.ndarray, np.ndarray]:
    """cummax/cummin along the last axis: the running value and the index where it was taken."""
    values, indices = x.copy(), np.zeros(x.shape, np.int64)
    for i in range(1, x.shape[-1]):
        new = x[..., i]
        take = take_new(new, values[..., i - 1])
        if x.dtype.kind == "f":
            take |= np.isnan(new)                      # NaN wins
        values[..., i] = np.where(take, new, values[..., i - 1])
        indices[..., i] = np.where(take, i, indices[..., i - 1])
    return values, indices


@kernel("scan")
def _scan(op: OpDef, args, out_types):
    x, t = args["self"], out_types[0].dtype.np
    if x.ndim == 0:
        return [x.astype(t)] + [np.zeros((), np.int64)] * (len(out_types) - 1)
    d = rules.normalize_dim(op, args["dim"], x.ndim)
    if op.impl in ("max", "min"):
        values, indices = _running_extreme(np.moveaxis(x, d, -1), np.greater_equal if op.impl == "max" else np.less_equal)
        return [np.moveaxis(values, -1, d), np.moveaxis(indices, -1, d)]
    if op.impl == "logaddexp":
        with np.errstate(invalid="ignore"):
            return [np.logaddexp.accumulate(x, axis=d, dtype=t)]
    return [(np.cumsum if op.impl == "sum" else np.cumprod)(x, axis=d, dtype=t)]


def _order_keys(x: np.ndarray, descending: bool) -> tuple:
    """np.lexsort keys (last is primary) putting `x` in PyTorch's sort order: NaN is the
    largest value; descending order reverses the keys exactly (~ on integers, no overflow)."""
    if x.dtype == np.bool_:
        x = x.astype(np.int8)
    if x.dtype.kind != "f":
        return ((~x if descending else x),)
    nan = np.isnan(x)
    return ((-x if descending else x), (~nan if descending else nan))


@kernel("sort")
def _sort(op: OpDef, args, out_types):
    x = args["self"]
    if x.ndim == 0:
        return [np.zeros((), np.int64)]
    d = rules.normalize_dim(op, args["dim"], x.ndim)
    moved = np.moveaxis(x, d, -1)
    keys = _order_keys(moved, bool(args.get("descending")))
    return [np.moveaxis(np.lexsort(keys, axis=-1), -1, d).astype(np.int64)]


def attention_scores(q, k, mask, is_causal: bool, scale) -> tuple[np.ndarray, np.ndarray]:
    """(the scaled scores q k^T with -inf where masked out (an additive mask added), the
    scale) of the fused attention."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * np.asarray(scale, q.dtype)
    if is_causal:
        mask = np.tril(np.ones(s.shape[-2:], bool))
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == np.bool_ else s + mask
    return s.astype(q.dtype), scale


@kernel("attention")
def _attention(op: OpDef, args, out_types):
    """softmax(s) v and logsumexp(s) over the keys; a row masked throughout gives 0 and -inf.
    The backward recomputes the probabilities from logsumexp."""
    q, k, v, mask = args["query"], args["key"], args["value"], args.get("attn_mask")
    s, scale = attention_scores(q, k, mask, args["is_causal"], args["scale"])
    if op.impl == "forward":
        top = s.max(-1, keepdims=True)
        p = np.exp(s - np.where(top == -np.inf, 0, top))
        total = p.sum(-1, keepdims=True)
        out = np.where(total > 0, np.matmul(p, v) / np.where(total > 0, total, 1), 0)
        lse = np.where(total > 0, top + np.log(total), -np.inf)[..., 0]
        return [out.astype(q.dtype), lse.astype(q.dtype)]
    g, out, lse = args["grad_out"], args["out"], args["logsumexp"][..., None]
    p = np.where(lse == -np.inf, 0, np.exp(s - lse))
    ds = p * (np.matmul(g, np.swapaxes(v, -1, -2)) - (g * out).sum(-1, keepdims=True)) * scale
    grads = (np.matmul(ds, k), np.matmul(np.swapaxes(ds, -1, -2), q), np.matmul(np.swapaxes(p, -1, -2), g))
    return [x.astype(q.dtype) for x in grads]


@kernel("search")
def _search(op: OpDef, args, out_types):
    seq, values, sorter = args["sorted_sequence"], args["self"], args.get("sorter")
    side = "right" if args.get("right") or args.get("side") == "right" else "left"
    if seq.ndim == 1:
        return [np.asarray(np.searchsorted(seq, values, side, sorter)).astype(out_types[0].dtype.np)]
    out = np.empty(values.shape, out_types[0].dtype.np)
    for row in np.ndindex(seq.shape[:-1]):
        out[row] = np.searchsorted(seq[row], values[row], side, None if sorter is None else sorter[row])
    return [out]


@kernel("arg_reduction")
def _arg_reduction(op: OpDef, args, out_types):
    x, dim, keepdim = args["self"], args.get("dim"), bool(args.get("keepdim"))
    find = np.argmax if op.impl == "max" else np.argmin
    if dim is None or x.ndim == 0:
        flat = x.reshape(-1)
        idx = find(flat)
        values, indices = flat[idx], np.int64(idx)
    else:
        d = rules.normalize_dim(op, dim, x.ndim)
        indices = np.expand_dims(find(x, axis=d), d)
        values = np.take_along_axis(x, indices, axis=d)
        if not keepdim:
            indices, values = indices.squeeze(d), values.squeeze(d)
    return [values, indices] if len(out_types) == 2 else [indices]


@kernel("variance")
def _variance(op: OpDef, args, out_types):
    x = args["self"]
    dims = rules.normalize_dims(op, args.get("dim"), x.ndim)
    correction = args.get("correction")
    fn = np.var if op.impl == "var" else np.std
    return [fn(x, axis=dims, ddof=1 if correction is None else correction,
               keepdims=bool(args.get("keepdim")))]


@kernel("matmul")
def _matmul(op: OpDef, args, out_types):
    return [np.matmul(args["self"], args["other"])]


# ---------------------------------------------------------------- shape and view ops

@kernel("reshape", "squeeze", "unsqueeze")
def _reshape(op: OpDef, args, out_types):
    return [args["self"].reshape(out_types[0].shape)]


@kernel("permute")
def _permute(op: OpDef, args, out_types):
    x = args["self"]
    return [np.transpose(x, [rules.normalize_dim(op, d, x.ndim, "dims") for d in args["dims"]])]


@kernel("flip")
def _flip(op: OpDef, args, out_types):
    x = args["self"]
    dims = rules.flip_dims(op, args["dims"], x.shape)
    return [np.flip(x, dims) if dims else x]


@kernel("expand")
def _expand(op: OpDef, args, out_types):
    return [np.broadcast_to(args["self"], out_types[0].shape)]


@kernel("select")
def _select(op: OpDef, args, out_types):
    x = args["self"]
    d = rules.normalize_dim(op, args["dim"], x.ndim)
    return [x[(slice(None),) * d + (args["index"],)]]


@kernel("slice")
def _slice(op: OpDef, args, out_types):
    x = args["self"]
    d = rules.normalize_dim(op, args["dim"], x.ndim)
    start, end, step = rules.slice_bounds(x.shape[d], args["start"], args["end"], args["step"])
    return [x[(slice(None),) * d + (slice(start, end, step),)]]


@kernel("cat")
def _cat(op: OpDef, args, out_types):
    ts = [args["tensors"][i] for i in rules.cat_kept([t.shape for t in args["tensors"]])]
    d = rules.normalize_dim(op, args["dim"], ts[0].ndim)
    return [np.concatenate([t.astype(out_types[0].dtype.np, copy=False) for t in ts], axis=d)]


@kernel("split")
def _split(op: OpDef, args, out_types):
    x = args["self"]
    d = rules.normalize_dim(op, args["dim"], x.ndim)
    bounds = np.cumsum([t.shape[d] for t in out_types])[:-1]
    return np.split(x, bounds, axis=d)


def _check_bounds(op: OpDef, index: np.ndarray, size: int, d: int) -> None:
    """PyTorch's index_select/gather take indices in [0, size): a negative one is an error, not a wrap."""
    if index.size and (index.min() < 0 or index.max() >= size):
        bad = index.max() if index.max() >= size else index.min()
        raise ShapeError(f"{op.full_name}: index {bad} is out of bounds for dim {d} with size {size}")


@kernel("index_select")
def _index_select(op: OpDef, args, out_types):
    x, index = args["self"], args["index"].reshape(-1)
    if x.ndim == 0:
        _check_bounds(op, index, 1, 0)
        return [x]
    d = rules.normalize_dim(op, args["dim"], x.ndim)
    _check_bounds(op, index, x.shape[d], d)
    return [np.take(x, index, axis=d)]


@kernel("gather")
def _gather(op: OpDef, args, out_types):
    x, index = args["self"], args["index"]
    if index.size == 0:
        return [np.empty(index.shape, x.dtype)]
    if x.ndim == 0:
        _check_bounds(op, index, 1, 0)
        return [np.broadcast_to(x, index.shape)]
    d = rules.normalize_dim(op, args["dim"], x.ndim)
    _check_bounds(op, index, x.shape[d], d)
    window = tuple(slice(None) if i == d else slice(0, n) for i, n in enumerate(index.shape))
    return [np.take_along_axis(x[window], index.astype(np.int64), axis=d)]


_SCATTER = {"add": np.add.at, "multiply": np.multiply.at, "amax": np.maximum.at, "amin": np.minimum.at}


def _assign_at(out: np.ndarray, where: tuple, values: np.ndarray) -> None:
    out[where] = values          # repeated positions: the last write wins


@kernel("scatter")
def _scatter(op: OpDef, args, out_types):
    x, index, src = args["self"], args["index"].astype(np.int64), args["src"]
    out = np.array(x, dtype=out_types[0].dtype.np, copy=True)
    if index.size == 0:
        return [out]
    combine = _SCATTER.get(op.impl, _assign_at)
    if x.ndim == 0:
        _check_bounds(op, index, 1, 0)
        combine(out, (), src)
        return [out]
    d = rules.normalize_dim(op, args["dim"], x.ndim)
    _check_bounds(op, index, x.shape[d], d)
    where = list(np.indices(index.shape, sparse=True))
    where[d] = index
    combine(out, tuple(where), src[tuple(slice(0, n) for n in index.shape)])
    return [out]


@kernel("index_add")
def _index_add(op: OpDef, args, out_types):
    x, index, src = args["self"], args["index"].reshape(-1).astype(np.int64), args["source"]
    alpha = args.get("alpha", 1)
    out = np.array(x, dtype=out_types[0].dtype.np, copy=True)
    if x.ndim == 0:
        _check_bounds(op, index, 1, 0)
        return [out + alpha * src.reshape(())]
    d = rules.normalize_dim(op, args["dim"], x.ndim)
    _check_bounds(op, index, x.shape[d], d)
    src = src.reshape(x.shape[:d] + (index.size,) + x.shape[d + 1:])
    np.add.at(out, (slice(None),) * d + (index,), src if alpha == 1 else src * alpha)
    return [out]


@kernel("select_backward")
def _select_backward(op: OpDef, args, out_types):
    t = out_types[0]
    out = np.zeros(t.shape, t.dtype.np)
    d = rules.normalize_dim(op, args["dim"], t.ndim)
    out[(slice(None),) * d + (args["index"],)] = args["grad_output"]
    return [out]


@kernel("slice_backward")
def _slice_backward(op: OpDef, args, out_types):
    t = out_types[0]
    out = np.zeros(t.shape, t.dtype.np)
    d = rules.normalize_dim(op, args["dim"], t.ndim)
    start, end, step = rules.slice_bounds(t.shape[d], args["start"], args["end"], args["step"])
    out[(slice(None),) * d + (slice(start, end, step),)] = args["grad_output"]
    return [out]


def _window_slices(args, counts):
    """Per kernel position (ki, kj), the strided slices of the padded plane it reads."""
    (kh, kw), (dh, dw), (sh, sw) = args["kernel_size"], args["dilation"], args["stride"]
    for ki in range(kh):
        for kj in range(kw):
            yield (slice(ki * dh, ki * dh + (counts[0] - 1) * sh + 1, sh),
                   slice(kj * dw, kj * dw + (counts[1] - 1) * sw + 1, sw))


@kernel("im2col")
def _im2col(op: OpDef, args, out_types):
    x, (ph, pw) = args["self"], args["padding"]
    padded = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(ph, ph), (pw, pw)])
    counts = rules.window_counts(op, x.shape[-2:], args["kernel_size"], args["dilation"], args["padding"],
                                 args["stride"])
    # (..., C, kh*kw, OH, OW): channel-major rows, as PyTorch's F.unfold
    cols = np.stack([padded[..., rows, cols] for rows, cols in _window_slices(args, counts)], axis=-3)
    return [np.ascontiguousarray(cols).reshape(out_types[0].shape)]


@kernel("col2im")
def _col2im(op: OpDef, args, out_types):
    x, t, (ph, pw) = args["self"], out_types[0], args["padding"]
    h, w = args["output_size"]
    counts = rules.window_counts(op, (h, w), args["kernel_size"], args["dilation"], args["padding"], args["stride"])
    k = args["kernel_size"][0] * args["kernel_size"][1]
    blocks = x.reshape(t.shape[:-2] + (k,) + counts)
    padded = np.zeros(t.shape[:-2] + (h + 2 * ph, w + 2 * pw), t.dtype.np)
    for i, (rows, cols) in enumerate(_window_slices(args, counts)):
        padded[..., rows, cols] += blocks[..., i, :, :]
    return [padded[..., ph:ph + h, pw:pw + w].copy()]


@kernel("constant_pad_nd")
def _constant_pad_nd(op: OpDef, args, out_types):
    """A result full of value, with the input's kept part (negative pads crop) copied in."""
    x, t = args["self"], out_types[0]
    out = np.full(t.shape, args["value"], dtype=t.dtype.np)
    src, dst = [], []
    for n, (lo, hi) in zip(x.shape, rules.pad_pairs(op, args["pad"], x.shape)):
        keep = max(n - max(-lo, 0) - max(-hi, 0), 0)
        src.append(slice(max(-lo, 0), max(-lo, 0) + keep))
        dst.append(slice(max(lo, 0), max(lo, 0) + keep))
    out[tuple(dst)] = x[tuple(src)]
    return [out]


@kernel("cast")
def _cast(op: OpDef, args, out_types):
    return [dt.cast_array(args["self"], out_types[0].dtype.np)]


# ---------------------------------------------------------------- factories

@kernel("full")
def _full(op: OpDef, args, out_types):
    t = out_types[0]
    return [np.full(t.shape, args["fill_value"], dtype=t.dtype.np)]


@kernel("arange")
def _arange(op: OpDef, args, out_types):
    t = out_types[0]
    start, _, step = rules.arange_bounds(args, t.dtype)
    return [start + step * np.arange(t.shape[0], dtype=np.float64 if t.dtype.is_floating_point else np.int64)]


@kernel("random")
def _random(op: OpDef, args, out_types):
    t, gen = out_types[0], tc_random.generator()
    draw = gen.random if op.impl == "uniform" else gen.standard_normal
    return [draw(t.shape, dtype=t.dtype.np)]
