"""`tensor[index]`: Python's index syntax checked as PyTorch checks it, then rewritten into
table ops, as PyTorch does it.

1. Entries.  A tuple gives one entry per dim; a list is split the same way when it is short
   (under 32 items) and holds a None, ..., slice, tensor or sequence, else it is one index
   array (PyTorch's rule, NumPy's before 1.23: `x[[[0, 1], [1, 2]]]` is `x[[0, 1], [1, 2]]`).
   Each entry becomes None, ..., a slice, an int, or a tensor: lists, ranges and arrays of
   ints become int64 tensors (an empty one too, so `x[[]]` picks nothing), of bools masks;
   Python and NumPy bools become 0-d masks.  Anything else raises IndexTypeError.
2. Basic indexing (ints, slices, None) becomes select/slice/unsqueeze, like PyTorch's
   applySlicing, ints first checked against their dim.  Negative slice steps read
   backwards, as NumPy and JAX read them (PyTorch refuses them).
3. Masks are checked against the dims they cover in the tensor that basic indexing left,
   each dim exactly (no broadcasting), with PyTorch's IndexError message, before their
   values are read.  A mask over k dims stands for the k index tensors of its nonzero
   positions (inside tc.trace their number is a value-dependent size: unbacked.py); a 0-d
   mask stands for a new dim of size 1 (True) or 0 (False), indexed by [0] or by nothing.
4. The advanced indices broadcast together to a shape B (refused with PyTorch's message
   when they do not); the indexed dims move to the front, the first index picks rows with
   one `index_select`, each further one picks from those rows with a `gather` along the
   next dim.  So every index tensor reaches an op of its own that bounds-checks it (here
   too, when its values are known, with PyTorch's message); negative values count from the
   end.  The result is B followed by the other dims, or B in place of the indexed dims when
   they were adjacent (NumPy's rule, which PyTorch follows).
Everything traces, differentiates (index_select and gather have gradients) and compiles.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import IndexingError, IndexTypeError, ShapeError, TraceError, add_location
from ..core.locations import user_location
from ..dispatch import api as tc
from . import unbacked

def wrapped(index, n):
    """Negative indices counted from the end (index + n), by a `where`: the values may be symbolic."""
    return tc.where(index < 0, index + n, index)


_SEQUENCES = (list, tuple, range, str, np.ndarray)
_LIST_AS_TUPLE_LIMIT = 32       # a longer list is always one index array (PyTorch, NumPy)


def entries(index) -> tuple:
    """The index as a tuple of entries: None, Ellipsis, slices, ints and tensors (int32,
    int64 or bool)."""
    return tuple(_entry(i) for i in _as_tuple(index))


def _as_tuple(index) -> tuple:
    from ..tensors.tensor import Tensor
    if isinstance(index, tuple):
        return index
    if isinstance(index, list) and len(index) < _LIST_AS_TUPLE_LIMIT and any(
            i is None or i is Ellipsis or isinstance(i, (slice, Tensor) + _SEQUENCES) for i in index):
        return tuple(index)
    return (index,)


def _entry(i):
    from ..tensors.tensor import Tensor
    if i is None or i is Ellipsis or isinstance(i, slice):
        return i
    if isinstance(i, (bool, np.bool_)):             # before int: bool is an int in Python
        return tc.tensor(np.array(bool(i)))
    if isinstance(i, (int, np.integer)):
        return int(i)
    if isinstance(i, Tensor):
        if i.dtype is tc.bool or i.dtype.is_integer:
            return i
        raise IndexTypeError(f"tensors used as indices must be long, int, byte or bool tensors "
                             f"(integer or bool), got {i.dtype.label}")
    if isinstance(i, _SEQUENCES) and not isinstance(i, str):
        return tc.tensor(_index_array(i))
    kind = type(i).__name__ if type(i).__module__ == "builtins" else f"{type(i).__module__}.{type(i).__name__}"
    raise IndexTypeError(f"only integers, slices (`:`), ellipsis (`...`), None and long or byte Variables "
                         f"are valid indices (got {kind})")


def _index_array(i) -> np.ndarray:
    """A list, range or array as int64 or bool values; an empty one holds int64."""
    try:
        a = np.asarray(i)
    except ValueError as e:         # ragged nesting
        raise IndexTypeError(f"an index list must be rectangular: {i!r} is not ({e})") from None
    if a.size == 0 and a.dtype.kind not in "biu":
        return a.astype(np.int64)
    if a.dtype.kind == "b":
        return a
    if a.dtype.kind in "iu":
        return a.astype(np.int64)
    raise IndexTypeError(f"arrays used as indices must be of integer or bool type, got {a.dtype} from {i!r}")


def _is_mask(i) -> bool:
    from ..tensors.tensor import Tensor
    return isinstance(i, Tensor) and i.dtype is tc.bool


def _expand_ellipsis(index: tuple, ndim: int) -> tuple:
    """`...` replaced by full slices; more dims indexed than there are raises."""
    from ..tensors.tensor import Tensor
    if sum(1 for i in index if i is Ellipsis) > 1:
        raise IndexingError("an index can only have a single ellipsis ('...')")
    consuming = sum(i.ndim if _is_mask(i) else 1 for i in index
                    if isinstance(i, (int, slice, Tensor)))
    if consuming > ndim:
        raise IndexingError(f"too many indices for tensor of dimension {ndim} "
                            f"({consuming} indexed dims in the index)")
    out = []
    for i in index:
        out.extend([slice(None)] * (ndim - consuming) if i is Ellipsis else [i])
    return tuple(out)


def getitem(t, index):
    base = t
    t, advanced = _basic(t, _expand_ellipsis(entries(index), t.ndim))
    _check_masks(t, advanced)
    advanced = _masks_as_indices(advanced)
    if not advanced:
        if t is not base:
            t._view_of = (base, index, base._version)    # writes into it reach base (assignment.py)
        return t
    out = _advanced(t, advanced)
    out._is_view = False          # advanced indexing copies, in PyTorch too
    return out


def _basic(t, index: tuple):
    """None, slices and ints applied in order; the rest returned as (dim of the result,
    tensor).  A mask over k dims covers dims dim..dim+k-1; a 0-d mask covers a new dim."""
    dim, advanced = 0, []
    for position, i in enumerate(index):
        if i is None:
            t = tc.unsqueeze(t, dim)
            dim += 1
        elif isinstance(i, slice):
            t = _slice(t, dim, i)
            dim += 1
        elif isinstance(i, int):
            t = tc.select(t, dim, _checked_int(i, t.shape[dim], position))
        else:
            if _is_mask(i) and i.ndim == 0:
                t = tc.unsqueeze(t, dim)
            advanced.append((dim, i))
            dim += max(i.ndim, 1) if _is_mask(i) else 1
    return t, advanced


def _slice(t, dim: int, i: slice):
    if i == slice(None):
        return t
    step = 1 if i.step is None else i.step
    return tc.slice(t, dim, i.start, i.stop, step) if step > 0 else _backwards(t, dim, i)


def _checked_int(i: int, n, position: int) -> int:
    """i, when it is a valid index into a dim of size n (position: the entry's place in the
    index, which PyTorch's message calls the dimension)."""
    if isinstance(n, int) and not -n <= i < n:
        raise IndexingError(f"index {i} is out of bounds for dimension {position} with size {n}")
    return i


def _same_size(a, b) -> bool:
    """Sizes equal for every call: a symbolic size (tc.export's dynamic dims) matches only
    itself, since a mask checked against a size it may differ from would pick wrong rows."""
    return a == b if isinstance(a, int) and isinstance(b, int) else str(a) == str(b)


def _check_masks(t, advanced: list) -> None:
    """Each dim of each mask equals the dim of t it covers (PyTorch does not broadcast masks)."""
    for dim, i in advanced:
        if not _is_mask(i):
            continue
        for k, size in enumerate(i.shape):
            if not _same_size(size, t.shape[dim + k]):
                raise IndexingError(
                    f"The shape of the mask {_dims(i.shape)} at index {k} does not match the shape "
                    f"of the indexed tensor {_dims(t.shape)} at index {dim + k}")


def _dims(shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _masks_as_indices(advanced: list) -> list:
    """Masks replaced by the index tensors of their nonzero positions (which reads their
    values).  A lone 0-d True is only the new dim that _basic added: the result stays a view."""
    if len(advanced) == 1 and _is_mask(advanced[0][1]) and advanced[0][1].ndim == 0 \
            and advanced[0][1]._data is not None:
        if bool(advanced[0][1]._data):
            return []
    out = []
    for dim, i in advanced:
        if not _is_mask(i):
            out.append((dim, i))
        elif i.ndim == 0 and i._data is not None:
            out.append((dim, tc.zeros([int(bool(i._data))], dtype=tc.int64)))
        elif i.ndim == 0:          # [0] or nothing: the 0-d mask's one row index
            out.append((dim, tc.select(unbacked.nonzero_rows("x[mask]", tc.reshape(i, [1])), 1, 0)))
        else:       # (under tc.trace, the rows' number is a value-dependent size: unbacked.py)
            out.extend((dim + k, c) for k, c in enumerate(unbacked.mask_columns("x[mask]", i)))
    return out


def _backwards(t, dim: int, i: slice):
    """`t[a:b:-s]` along dim, as NumPy and JAX read it (PyTorch refuses negative steps): the
    dim flipped, then a forward slice of the same elements."""
    n = t.shape[dim]
    if i.step == 0:
        raise ShapeError("slice step cannot be zero")
    if not isinstance(n, int):
        raise ShapeError(f"a negative slice step needs a static size; dim {dim} has the dynamic size {n}")
    start, stop, step = i.indices(n)
    count = len(range(start, stop, step))
    first = n - 1 - start
    return tc.slice(tc.flip(t, [dim]), dim, first, first + (count - 1) * -step + 1 if count else first, -step)


def _broadcast_indices(advanced: list) -> list:
    from ..ops.rules import broadcast_shapes
    try:
        return list(broadcast_shapes("indexing", [(f"index {k}", i.shape) for k, (_, i) in enumerate(advanced)]))
    except ShapeError:
        shapes = ", ".join(_dims(i.shape) for _, i in advanced)
        if any(not isinstance(d, int) for _, i in advanced for d in i.shape):
            raise add_location(TraceError(   # (equal for some values: eager would decide per call)
                f"x[mask]: the indexing tensors' shapes {shapes} hold value-dependent sizes that tc.trace "
                "cannot broadcast together (it does not assume them equal)"), str(user_location())) from None
        raise IndexingError(f"shape mismatch: indexing tensors could not be broadcast together with "
                            f"shapes {shapes}") from None


def _check_known_values(t, advanced: list) -> None:
    """Index values known now (eagerly, or constants in a trace) checked against their dim,
    with PyTorch's IndexError; index_select and gather check the others, compiled too.  The
    message numbers the dims as PyTorch does: the indexed dims moved to the front."""
    for k, (dim, i) in enumerate(advanced):
        n = t.shape[dim]
        if i._data is None or i._batch is not None or not isinstance(n, int):
            continue
        values = i._data
        bad = values[(values < -n) | (values >= n)]
        if bad.size:
            raise IndexingError(f"index {bad.flat[0]} is out of bounds for dimension {k} with size {n}")


def _advanced(t, advanced: list):
    _check_known_values(t, advanced)
    dims = [d for d, _ in advanced]
    shape = _broadcast_indices(advanced)
    n = math.prod(shape)
    flat = [tc.broadcast_to(i, shape).reshape([-1]) for _, i in advanced]
    rest = [d for d in range(t.ndim) if d not in dims]
    y = tc.permute(t, dims + rest) if dims + rest != list(range(t.ndim)) else t
    y = tc.index_select(y, 0, wrapped(flat[0], t.shape[dims[0]]))
    for k in range(1, len(dims)):
        tail = list(y.shape[2:])
        at = wrapped(flat[k], t.shape[dims[k]]).reshape([n, 1] + [1] * len(tail)).expand([n, 1] + tail)
        y = tc.gather(y, 1, at).squeeze(1)
    y = y.reshape(shape + [t.shape[d] for d in rest])
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    if adjacent and dims[0] > 0 and shape:
        y = tc.movedim(y, list(range(len(shape))), list(range(dims[0], dims[0] + len(shape))))
    return y
