"""Running a composite op's decomposition (its `composite:` program in ops.yaml).

Calls in the program go to the public API (`tracecomp.<name>`), methods to Tensor, so
the decomposition is dispatched like user code: eagerly it computes, under the Tracer
it records primitive ops.  The dispatcher runs every composite op through `run_composite`
(registered at the end), whatever the dispatch keys.  The helpers below are the only
non-op functions programs may call; each is a small pure function on Python values
(shapes, dims).
"""
from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np

from . import composites_nn, contraction, resampling, unbacked, windows
from .opmath import run_in_float32
from .assignment import put
from .indexing import wrapped
from .unbacked import values_for
from ..core import dtypes as dt
from ..core.errors import ArgumentError, DTypeError, ShapeError, TracecompError
from ..core.symbolic import is_dynamic
from ..ops import formula
from ..ops.rules import broadcast_shapes, slice_bounds
from ..ops.table import OpDef
from ..tensors.results import package
from ..dispatch import api as tc
from ..core.devices import CUDA, making_on
from ..dispatch.dispatcher import dispatcher, tensor_arguments
from ..dispatch.tracer import UNKNOWN_LOCATION, current


def _trailing_dims(x, normalized_shape, name: str = "layer_norm") -> list[int]:
    n = len(normalized_shape)
    if tuple(x.shape[x.ndim - n:]) != tuple(normalized_shape) or n > x.ndim:
        raise ShapeError(f"{name}: normalized_shape {tuple(normalized_shape)} does not match the "
                         f"trailing dims of the input shape {x.shape}")
    return list(range(x.ndim - n, x.ndim))


def _reduce_loss(x, reduction: str):
    if reduction == "mean":
        return x.mean()
    if reduction == "sum":
        return x.sum()
    if reduction == "none":
        return x
    raise ArgumentError(f"argument 'reduction' must be 'mean', 'sum' or 'none', got {reduction!r}")


def _flatten_shape(shape, start: int, end: int) -> list[int]:
    n = max(len(shape), 1)
    s, e = start % n if -n <= start < n else None, end % n if -n <= end < n else None
    if s is None or e is None or s > e:
        raise ShapeError(f"flatten: start_dim {start} and end_dim {end} are invalid for shape {tuple(shape)}")
    if not shape:
        return [1]
    return list(shape[:s]) + [math.prod(shape[s:e + 1])] + list(shape[e + 1:])


def _swapped_dims(ndim: int, d0: int, d1: int) -> list[int]:
    d0, d1 = _dim("transpose", ndim, d0), _dim("transpose", ndim, d1)
    dims = list(range(ndim))
    if ndim:
        dims[d0], dims[d1] = dims[d1], dims[d0]
    return dims


def _chunk_size(x, chunks: int, dim: int) -> int:
    if chunks <= 0:
        raise ShapeError(f"chunk: 'chunks' must be positive, got {chunks}")
    return max(1, -(-x.shape[dim] // chunks))


def _halvable(name: str, x, dim: int) -> bool:
    """True when dim `dim` of `x` splits into two equal halves; else a ShapeError."""
    if x.ndim == 0:
        raise ShapeError(f"{name}: cannot halve a 0-d tensor")
    if x.shape[_dim(name, x.ndim, dim)] % 2:
        raise ShapeError(f"{name}: halving dim {dim} needs an even size, got shape {x.shape}")
    return True


def _expect_ranks(name: str, a, b, n: int):
    raise ShapeError(f"{name}: expects two {n}-D tensors, got shapes {a.shape} and {b.shape}")


def _expect_float(name: str, x):
    raise DTypeError(f"{name}: expects a floating-point tensor, got {x.dtype.label}")


# ---------------------------------------------------------------- layout helpers

def _dim(name: str, ndim: int, d: int) -> int:
    n = max(ndim, 1)
    if not -n <= d < n:
        raise ShapeError(f"{name}: dim {d} is out of range for a tensor with {ndim} dims")
    return d % n


def _dim_size(name: str, x, d: int) -> int:
    return x.shape[_dim(name, x.ndim, d)] if x.ndim else 1


def _count_in(name: str, what: str, k: int, lo: int, hi: int | None) -> int:
    if not lo <= k or hi is not None and not k <= hi:
        raise ShapeError(f"{name}: {what} = {k} is out of range [{lo}, {'...' if hi is None else hi}] for this dim")
    return k


def _matrix_dims(name: str, x, dim) -> tuple[int, int]:
    if len(dim) != 2:
        raise ShapeError(f"{name}: dim must name 2 dims, got {tuple(dim)}")
    if x.ndim < 2:
        raise ShapeError(f"{name}: expects a tensor with at least 2 dims, got shape {x.shape}")
    d0, d1 = _dim(name, x.ndim, dim[0]), _dim(name, x.ndim, dim[1])
    if d0 == d1:
        raise ShapeError(f"{name}: dim {tuple(dim)} names one dim twice")
    return d0, d1


def _unsupported(name: str, what: str):
    raise ArgumentError(f"{name}: {what} is not supported")


def _check_cdist(x1, x2, p) -> bool:
    if x1.ndim < 2 or x2.ndim < 2 or x1.shape[-1] != x2.shape[-1]:
        raise ShapeError(f"cdist: x1 and x2 need at least 2 dims and the same last dim, got shapes "
                         f"{x1.shape} and {x2.shape}")
    if p < 0:
        raise ShapeError(f"cdist: p must be at least 0, got {p}")
    return True


def _last_dims(name: str, x, n: int) -> list[int]:
    if not 0 <= n <= x.ndim:
        raise ShapeError(f"{name}: dims={n} must be in [0, {x.ndim}] for self of shape {x.shape}")
    return list(range(x.ndim - n, x.ndim))


def _at_least_dims(name: str, x, n: int) -> bool:
    if x.ndim < n:
        raise ShapeError(f"{name}: expects a tensor with at least {n} dims, got shape {x.shape}")
    return True


def _dims_in(name: str, x, allowed: tuple) -> bool:
    if x.ndim not in allowed:
        raise ShapeError(f"{name}: expects a tensor with {' or '.join(map(str, allowed))} dims, "
                         f"got shape {x.shape}")
    return True


def _same_length(name: str, a, b) -> bool:
    if len(a) != len(b):
        raise ShapeError(f"{name}: shifts {tuple(a)} and dims {tuple(b)} must have the same length")
    return True


def _moved_dims(name: str, ndim: int, source, destination) -> list[int]:
    """The permutation that moves dims `source` to positions `destination`, the others
    keeping their order."""
    source, destination = _ints(source), _ints(destination)
    if len(source) != len(destination):
        raise ShapeError(f"{name}: source {tuple(source)} and destination {tuple(destination)} "
                         "must have the same length")
    src = [_dim(name, ndim, d) for d in source]
    dst = [_dim(name, ndim, d) for d in destination]
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ShapeError(f"{name}: repeated dim in source {tuple(source)} or destination {tuple(destination)}")
    rest = iter(d for d in range(ndim) if d not in src)
    placed = dict(zip(dst, src))
    return [placed[i] if i in placed else next(rest) for i in range(ndim)]


def _ints(v) -> list[int]:
    return [v] if isinstance(v, int) else list(v)


def _narrow_bounds(x, dim: int, start: int, length: int) -> tuple[int, int]:
    n = _dim_size("narrow", x, dim)
    begin = start + n if start < 0 else start
    if not 0 <= begin <= n or length < 0 or begin + length > n:
        raise ShapeError(f"narrow: start {start} and length {length} exceed dim {dim} of size {n} "
                         f"(shape {x.shape})")
    return begin, begin + length


def _unflatten_shape(shape, dim: int, sizes) -> list[int]:
    d = _dim("unflatten", len(shape), dim)
    sizes = list(sizes)
    if sizes.count(-1) > 1 or not sizes:
        raise ShapeError(f"unflatten: sizes {tuple(sizes)} must be non-empty with at most one -1")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if known == 0 or shape[d] % known:
            raise ShapeError(f"unflatten: sizes {tuple(sizes)} do not divide dim {dim} of size {shape[d]}")
        sizes[sizes.index(-1)] = shape[d] // known
    if math.prod(sizes) != shape[d]:
        raise ShapeError(f"unflatten: sizes {tuple(sizes)} do not multiply to dim {dim} of size {shape[d]}")
    return list(shape[:d]) + sizes + list(shape[d + 1:])


def _section_bounds(x, sections: int, dim: int) -> list[tuple[int, int]]:
    """tensor_split into `sections` parts: the first n % sections one element longer."""
    if sections <= 0:
        raise ShapeError(f"tensor_split: sections must be positive, got {sections}")
    n = _dim_size("tensor_split", x, dim)
    q, r = divmod(n, sections)
    bounds, start = [], 0
    for k in range(sections):
        size = q + (k < r)
        bounds.append((start, start + size))
        start += size
    return bounds


def _index_bounds(x, indices, dim: int) -> list[tuple[int, int]]:
    """tensor_split at `indices`: x[i_k : i_k+1] as Python slices (clamped; a piece whose
    end is before its start is empty)."""
    n = _dim_size("tensor_split", x, dim)
    cuts = [0] + [min(max(i + n if i < 0 else i, 0), n) for i in indices] + [n]
    return [(a, max(a, b)) for a, b in zip(cuts, cuts[1:])]


def _repeat_shapes(shape, repeats) -> tuple[list[int], list[int], list[int]]:
    """x.repeat(repeats) as reshape -> expand -> reshape: each dim s gets a new dim of r in
    front of it, expanded, then the two are merged."""
    repeats = list(repeats)
    if len(repeats) < len(shape):
        raise ShapeError(f"repeat: repeats {tuple(repeats)} has fewer dims than the tensor {tuple(shape)}")
    if any(r < 0 for r in repeats):
        raise ShapeError(f"repeat: repeats {tuple(repeats)} must not be negative")
    padded = [1] * (len(repeats) - len(shape)) + list(shape)
    grouped = [v for s in padded for v in (1, s)]
    expanded = [v for r, s in zip(repeats, padded) for v in (r, s)]
    return grouped, expanded, [r * s for r, s in zip(repeats, padded)]


def _tile_repeats(ndim: int, dims) -> list[int]:
    dims = list(dims)
    return [1] * (ndim - len(dims)) + dims


def _last_two(name: str, x) -> tuple[int, int]:
    _at_least_dims(name, x, 2)
    return x.shape[-2], x.shape[-1]


def _diagonal_place(shape, offset: int, dim1: int, dim2: int, name: str = "diagonal_scatter"):
    """(dim1, dim2 normalized, the row the diagonal starts at, its length)."""
    ndim = len(shape)
    d1, d2 = _dim(name, ndim, dim1), _dim(name, ndim, dim2)
    if d1 == d2 or ndim < 2:
        raise ShapeError(f"{name}: dim1 {dim1} and dim2 {dim2} must be two different dims of shape {tuple(shape)}")
    m, n = shape[d1], shape[d2]
    return d1, d2, max(-offset, 0), max(0, min(m, n - offset) if offset >= 0 else min(m + offset, n))


def _diagonal_plan(shape, offset: int, dim1: int, dim2: int):
    """diagonal as permute -> reshape -> strided slice: the two dims go last and merge
    into one of m * n elements, whose diagonal starts at `start` with step n + 1."""
    d1, d2, _, length = _diagonal_place(shape, offset, dim1, dim2, "diagonal")
    dims = [d for d in range(len(shape)) if d not in (d1, d2)] + [d1, d2]
    m, n = shape[d1], shape[d2]
    start = (offset if offset >= 0 else -offset * n) if length else 0
    flat = [shape[d] for d in dims[:-2]] + [m * n]
    return dims, flat, start, start + (length - 1) * (n + 1) + 1 if length else 0, n + 1


def _scatter_mode(name: str, reduce: str, allowed: tuple) -> str:
    if reduce not in allowed:
        raise ArgumentError(f"{name}: reduce must be one of {', '.join(map(repr, allowed))}, got {reduce!r}")
    return reduce


def _masked_positions(mask, shape):
    if mask.dtype is not dt.BOOL:
        raise DTypeError(f"masked_select: mask must be a bool tensor, got {mask.dtype.label}")
    return unbacked.masked_positions(mask, shape)


def _row_major_strides(shape) -> list[int]:
    return [math.prod(shape[d + 1:]) for d in range(len(shape))]


def _unique_values(x, return_inverse: bool, return_counts: bool, dim):
    """torch.unique: the values (a tensor), or a tuple with the inverse and/or the counts."""
    if dim is None:
        return unbacked.unique_values(x, return_inverse, return_counts)
    values = values_for("unique", x)
    axis = _dim("unique", x.ndim, dim)
    found, inverse, counts = np.unique(values, return_inverse=True, return_counts=True, axis=axis)
    inverse = inverse.reshape(x.shape if axis is None else (x.shape[axis] if x.ndim else 1,))
    out = [tc.tensor(found)]
    if return_inverse:
        out.append(tc.tensor(inverse.astype(np.int64)))
    if return_counts:
        out.append(tc.tensor(counts.astype(np.int64)))
    return out[0] if len(out) == 1 else tuple(out)


def _class_count(x, num_classes: int) -> int:
    """one_hot's number of classes: num_classes, or the largest class + 1 (its value is the
    result's shape: eagerly only).  Known values are checked here with PyTorch's messages;
    traced ones by the scatter's index check when the compiled program runs."""
    if x.dtype is not dt.INT64:
        raise DTypeError(f"one_hot: is only applicable to index tensors of type int64, got {x.dtype.label}")
    if num_classes == -1:
        values = values_for("one_hot", x)
        if values.size == 0:
            raise ShapeError("one_hot: Can not infer total number of classes from empty tensor (pass num_classes)")
        num_classes = int(values.max()) + 1
    if num_classes < 0:
        raise ShapeError(f"one_hot: num_classes must be -1 or at least 0, got {num_classes}")
    if x._data is not None and x._data.size:
        if x._data.min() < 0:
            raise ShapeError(f"one_hot: Class values must be non-negative, got {int(x._data.min())}")
        if x._data.max() >= num_classes:
            raise ShapeError(f"one_hot: Class values must be smaller than num_classes ({num_classes}), "
                             f"got {int(x._data.max())}")
    return num_classes


def _embed_dims(ndim: int, dim1: int, dim2: int) -> list[int]:
    d1, d2 = _dim("diag_embed", ndim + 1, dim1), _dim("diag_embed", ndim + 1, dim2)
    if d1 == d2:
        raise ShapeError(f"diag_embed: dim1 {dim1} and dim2 {dim2} must differ")
    return [d1, d2]


def _pad_shape(shape, k: int) -> list[int]:
    return list(shape[:-1]) + [k]


def _start_index(name: str, x, dim: int, start, length: int):
    """narrow's start from a 0-d integer tensor, wrapped if negative (by a `where`, so the
    value may stay symbolic)."""
    if start.ndim != 0 or start.dtype.is_floating_point or start.dtype is dt.BOOL:
        raise ArgumentError(f"{name}: start must be a 0-d integer tensor, got {start.dtype.label}{list(start.shape)}")
    n = _dim_size(name, x, dim)
    if not 0 <= length <= n:
        raise ShapeError(f"{name}: length {length} exceeds dim {dim} of size {n} (shape {x.shape})")
    return wrapped(start.long(), n)


def _index_put(t, indices, values, accumulate: bool):
    """index_put: a None entry takes a whole dim.  values must have t's dtype, as PyTorch
    requires (item assignment casts; index_put does not)."""
    if values.dtype != t.dtype:
        raise DTypeError(f"index_put: values have dtype {values.dtype.label} but self has "
                         f"{t.dtype.label}; they must match")
    return put(t, tuple(slice(None) if i is None else i for i in indices), values, accumulate)


def _split_pieces(x, t, dim: int) -> list:
    """tensor_split at a tensor of split points (a 0-d tensor: a count of sections).  Their
    values decide the pieces' shapes: eagerly they are Python ints, under tc.trace each
    piece is an index_select of positions a host step computes (unbacked.py)."""
    if t.dtype.is_floating_point or t.dtype is dt.BOOL or t.ndim > 1:
        raise ArgumentError(f"tensor_split: tensor_indices_or_sections must be a 0-d or 1-D integer tensor, "
                            f"got {t.dtype.label}{list(t.shape)}")
    if t._data is not None:
        return tc.tensor_split(x, t.tolist(), dim)
    n = _dim_size("tensor_split", x, dim)
    ranges = unbacked.split_ranges(n, t, lambda points: _index_bounds(x, points, dim))
    return [tc.index_select(x, dim, r) for r in ranges]


def _class_shape(weight, ndim: int) -> list[int]:
    """A (C,) class weight shaped to broadcast along the class dim of an ndim-D input."""
    if weight.ndim != 1:
        raise ShapeError(f"cross_entropy: weight must be 1-D (one per class), got shape {weight.shape}")
    return [weight.shape[0]] + [1] * max(ndim - 2, 0)


def _steps_checked(name: str, steps: int) -> int:
    if steps < 0:
        raise ShapeError(f"{name}: number of steps must be non-negative, got {steps}")
    return steps


def _triangle_indices(row: int, col: int, offset: int, lower: bool) -> list[list[int]]:
    """The (2, n) row and column indices of the lower (or upper) triangle, row by row."""
    if row < 0 or col < 0:
        raise ShapeError(f"{'tril' if lower else 'triu'}_indices: row {row} and col {col} must be non-negative")
    pairs = [(r, c) for r in range(row) for c in range(col) if (c - r <= offset if lower else c - r >= offset)]
    return [[r for r, _ in pairs], [c for _, c in pairs]]


def _scaled_sum(x, product, beta, alpha):
    """beta * x + alpha * product (addmm, addmv, baddbmm), skipping the factors that are 1,
    and x when beta is 0."""
    if broadcast_shapes("addmm", [("self", x.shape), ("product", product.shape)]) != tuple(product.shape):
        raise ShapeError(f"input of shape {tuple(x.shape)} does not broadcast to the product's shape "
                         f"{tuple(product.shape)}")
    if not product.dtype.is_floating_point:         # integer products take the factors as ints, as PyTorch
        beta, alpha = int(beta), int(alpha)
    out = product if alpha == 1 else product * alpha
    return out if beta == 0 else out + (x if beta == 1 else x * beta)


def _kron_shapes(a, b):
    """kron as a broadcast product: a's dims interleaved with 1s, b's after 1s, then merged."""
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + list(a), [1] * (n - len(b)) + list(b)
    return ([v for s in a for v in (s, 1)], [v for s in b for v in (1, s)], [p * q for p, q in zip(a, b)])


def _cross_plan(a, b, dim):
    shape = broadcast_shapes("cross", [("self", a.shape), ("other", b.shape)])
    if dim is None:
        sizes3 = [d for d, n in enumerate(shape) if n == 3]
        if not sizes3:
            raise ShapeError(f"cross: no dim of size 3 in the broadcast shape {shape}")
        d = sizes3[0]
    else:
        d = _dim("cross", len(shape), dim)
        if shape[d] != 3:
            raise ShapeError(f"cross: dim {dim} has size {shape[d]}, not 3 (shape {shape})")
    return list(shape), d


def _any_floating(*values) -> bool:
    """Whether PyTorch's promotion of these operands (tensors or Python numbers) is a float."""
    return any(isinstance(v, float) or (hasattr(v, "dtype") and v.dtype.is_floating_point) for v in values)


def _gather_shape(self_shape, index_shape, dim: int, for_self: bool) -> list[int]:
    """take_along_dim: self and indices broadcast in every dim but `dim`, where each keeps its own size."""
    if len(self_shape) != len(index_shape):
        raise ShapeError(f"take_along_dim: input {tuple(self_shape)} and indices {tuple(index_shape)} "
                         "must have the same number of dims")
    d = _dim("take_along_dim", len(self_shape), dim)
    out = list(broadcast_shapes("take_along_dim", [("self", [n for k, n in enumerate(self_shape) if k != d]),
                                                   ("indices", [n for k, n in enumerate(index_shape) if k != d])]))
    out.insert(d, self_shape[d] if for_self else index_shape[d])
    return out


def _slice_range(x, dim: int, start, end) -> tuple[int, int]:
    """slice_scatter's start and end as Python slicing takes them: None, negative, clamped."""
    lo, hi, _ = slice_bounds(_dim_size("slice_scatter", x, dim), start, end, 1)    # (a dynamic size too)
    return lo, hi


def _interleave_shapes(shape, dim: int, repeats: int):
    """repeat_interleave as reshape -> expand -> reshape: a new dim of `repeats` after `dim`."""
    if repeats < 0:
        raise ShapeError(f"repeat_interleave: repeats must be non-negative, got {repeats}")
    d = _dim("repeat_interleave", len(shape), dim)
    shape = list(shape) or [1]
    grouped = shape[:d + 1] + [1] + shape[d + 1:]
    expanded = shape[:d + 1] + [repeats] + shape[d + 1:]
    return grouped, expanded, shape[:d] + [shape[d] * repeats] + shape[d + 1:]


def _mesh_sizes(tensors) -> list[int]:
    for i, t in enumerate(tensors):
        if t.ndim > 1:
            raise ShapeError(f"meshgrid: tensors[{i}] has shape {t.shape}; expects 0-d or 1-D tensors")
    return [t.numel() for t in tensors]


def _repeated_positions(x, dim: int, repeats, output_size):
    """repeat_interleave with a tensor of repeats: position k along `dim`, repeats[k] times
    (an int64 tensor; under tc.trace its length is a value-dependent size: unbacked.py)."""
    n = _dim_size("repeat_interleave", x, dim)

    def checked(counts) -> list[int]:
        counts = [counts] * n if isinstance(counts, int) else counts
        if len(counts) == 1 and n != 1:
            counts = counts * n
        if len(counts) != n or any(c < 0 for c in counts):
            raise ShapeError(f"repeat_interleave: repeats {repeats.shape} must hold one non-negative count per "
                             f"element of dim {dim} (size {n})")
        if output_size is not None and output_size != sum(counts):
            raise ShapeError(f"repeat_interleave: output_size {output_size} is not the sum of repeats {sum(counts)}")
        return counts
    return unbacked.repeated_positions(n, repeats, output_size, checked)


def _dim_shape(name: str, ndim: int, dim: int, n: int) -> list[int]:
    """A length-n vector shaped to broadcast along dim `dim` of an ndim-D tensor."""
    d = _dim(name, ndim, dim)
    return [1] * d + [n] + [1] * max(ndim - d - 1, 0) if ndim else []


def _weak_scalar(value, like):
    """A Python number as the 0-d tensor that promotes with `like` as the number would: in
    like's dtype when the number's category fits it (so a float beside a float64 tensor is
    not rounded to float32 first)."""
    if isinstance(value, float) and not like.dtype.is_floating_point:
        dtype = dt.FLOAT32                   # an integer or bool tensor beside a float
    elif isinstance(value, int) and not isinstance(value, bool) and like.dtype is dt.BOOL:
        dtype = dt.INT64                     # a bool tensor beside an int
    else:
        dtype = like.dtype
    return tc.full([], value, dtype=dtype)


HELPERS = {
    "trailing_dims": _trailing_dims, "reduce_loss": _reduce_loss, "flatten_shape": _flatten_shape,
    "swapped_dims": _swapped_dims, "chunk_size": _chunk_size, "expect_ranks": _expect_ranks,
    "expect_float": _expect_float, "halvable": _halvable, "class_shape": _class_shape,
    # layout
    "dim_size": _dim_size, "count_in": _count_in, "matrix_dims": _matrix_dims, "nonzero_rows": unbacked.nonzero_rows, "mask_columns": unbacked.mask_columns, "masked_positions": _masked_positions,
    "row_major_strides": _row_major_strides, "unique_values": _unique_values, "diagonal_place": _diagonal_place,
    "scatter_mode": _scatter_mode, "lowest": dt.lowest, "highest": dt.highest, "unsupported": _unsupported,
    "check_cdist": _check_cdist, "last_dims": _last_dims, "tensordot_contract": lambda a, b, p, q: contraction.tensordot(a, b, list(p), list(q)),
    "einsum_contract": lambda eq, ts: contraction.contract(eq, list(ts)), "broadcast_shapes": broadcast_shapes, "str": str, "repr": repr,
    "at_least_dims": _at_least_dims, "dims_in": _dims_in, "same_length": _same_length, "is_dynamic": is_dynamic,
    "tail": lambda xs: list(xs)[1:], "moved_dims": _moved_dims, "narrow_bounds": _narrow_bounds,
    "unflatten_shape": _unflatten_shape, "section_bounds": _section_bounds, "index_bounds": _index_bounds,
    "repeat_shapes": _repeat_shapes, "tile_repeats": _tile_repeats, "last_two": _last_two,
    "diagonal_plan": _diagonal_plan, "embed_dims": _embed_dims, "pad_shape": _pad_shape,
    "interleave_shapes": _interleave_shapes, "mesh_sizes": _mesh_sizes, "dim_shape": _dim_shape,
    "gather_shape": _gather_shape, "slice_range": _slice_range, "index_put": _index_put,
    # indices and values
    "wrapped": wrapped, "start_index": _start_index, "split_pieces": _split_pieces,
    "repeated_positions": _repeated_positions, "weak_scalar": _weak_scalar, "any_floating": _any_floating,
    "scaled_sum": _scaled_sum, "kron_shapes": _kron_shapes, "cross_plan": _cross_plan,
    "steps_checked": _steps_checked, "triangle_indices": _triangle_indices, "class_count": _class_count,
    **composites_nn.HELPERS,        # normalization layers, embedding, dropout
    "range": range, "len": len, "list": list, "tuple": tuple, "int": int, "reversed": reversed, "float": float, "abs_int": abs,
    **dt.DType.__members__,
    **windows.HELPERS,
    **resampling.HELPERS,       # pad, interpolate, adaptive pooling
}


def _call(name: str, args: list, kwargs: dict):
    if name in HELPERS:
        return HELPERS[name](*args, **kwargs)
    fn = getattr(tc, name, None)
    if fn is None:
        raise ArgumentError(f"composite program calls unknown function '{name}'")
    return fn(*args, **kwargs)


def _describe_args(args: dict[str, Any]) -> str:
    """Arguments as the user gave them, tensors by shape: `'input' (2, 3), 'dim' 1`."""
    parts = []
    for k, v in args.items():
        if hasattr(v, "shape") and hasattr(v, "dtype"):
            v = tuple(v.shape)
        elif isinstance(v, (list, tuple)) and v and all(hasattr(t, "shape") for t in v):
            v = f"[{', '.join(str(tuple(t.shape)) for t in v)}]"
        if v is not None:
            parts.append(f"'{k}' {v!s}" if not isinstance(v, str) or v.startswith("[") else f"'{k}' {v!r}")
    return ", ".join(parts)


def run_composite(op: OpDef, args: dict[str, Any]):
    constants = {k: v for k, v in HELPERS.items() if not callable(v) or isinstance(v, dt.DType)}
    try:
        with _derived_from(op), _on_device_of(args):
            result = run_in_float32(op, args, lambda a: formula.Evaluator({**constants, **a}, _call)
                                    .run_program(op.program))
        returns = op.schema.returns
        if len(returns) > 1 or returns[0].type.is_list:     # a tuple, or a named tuple, as for kernels
            result = package(op, list(result))
        return result
    except TracecompError as e:
        # The failing op is inside the decomposition; say which op the user called, with what.
        e.args = (f"{op.name}() failed for {_describe_args(args)}: {e.args[0]}",) + e.args[1:]
        raise


def _on_device_of(args: dict[str, Any]):
    """While a composite's program runs on GPU tensors, the tensors it makes (zeros_like,
    arange, full) are made on the GPU too."""
    if any(t.is_cuda for t in tensor_arguments(args)):
        return making_on(CUDA)
    return contextlib.nullcontext()


def _derived_from(op: OpDef):
    """While a trace records a composite's program, its ops name the composite as their
    source (the outermost one, when composites nest)."""
    ctx = current()
    if ctx is None:
        return contextlib.nullcontext()
    # a backward op gets a location even when no frame explains it: name the composite there too
    loc = ctx.location() or (UNKNOWN_LOCATION if ctx.backward_depth else None)
    return contextlib.nullcontext() if loc is None else ctx.located(loc.derived(source=op.ir_name))


dispatcher.register_composite(run_composite)     # every dispatch key sees the program's ops
