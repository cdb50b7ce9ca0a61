"""tc.trace'd functions over Dask arrays.

`da.map_blocks(tc.trace(fn), x)` works as written: NumPy takes tracecomp's dtypes, and the
blocks come back as tc.Tensors that `compute()` assembles into a NumPy array.  But Dask
learns the output's chunks and type by calling the function on empty arrays (a compile on
the client), and its chunks are then tc.Tensors, which Dask's own reductions and NumPy
ufuncs on the result do not know.  The helpers here say what map_blocks cannot alone:

- the output chunks' shapes and dtype come from tracecomp's shape rules
  (TracedFunction.eval_shape: a trace per distinct block shape, nothing compiled, no data);
- chunks are NumPy arrays, so everything Dask does with the result works;
- rows: `map_rows` lines up arrays of any rank by their first axis (features in one chunk),
  `reduce_rows` sums or averages a function's per-row values across chunks in a tree;
- `from_npy` reads an .npy file chunk by chunk on the workers (memory-mapped there), so a
  program over an array larger than memory streams through it.

A function with several outputs is not supported by map_blocks/map_rows (Dask arrays have
one); reduce_rows takes any pytree of outputs.
"""
from __future__ import annotations

import itertools
import os
from typing import Any, Callable, Sequence

import dask
import dask.array as da
import numpy as np

from ..tensors import pytree
from ..core.errors import ArgumentError, ShapeError
from ..transforms.trace import ShapeDtype, TracedFunction, trace
from ..transforms.vmap import vmap


class BlockCall:
    """A traced function called on blocks, returning NumPy arrays (picklable: the traced
    function travels without native code and compiles, or loads, on the worker)."""

    def __init__(self, traced: TracedFunction):
        self.traced = traced

    def __call__(self, *blocks):
        return pytree.tree_map(np.asarray, self.traced(*blocks))


class PartialSums(BlockCall):
    """reduce_rows' per-chunk step: the traced function already sums over the chunk's rows;
    the partial sums leave as float64 (int64 for integers) for the combine."""

    def __call__(self, *blocks):
        return pytree.tree_map(_wide, self.traced(*blocks))


def _wide(x) -> np.ndarray:
    a = np.asarray(x)
    return a.astype(np.float64 if a.dtype.kind == "f" else np.int64)


def _traced(fn: Callable, per_row: bool = False) -> TracedFunction:
    if per_row:
        return trace(vmap(getattr(fn, "fn", fn)))
    return fn if isinstance(fn, TracedFunction) else trace(fn)


def _name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


# ------------------------------------------------------------------ map_blocks
def map_blocks(fn: Callable, *args: Any, token: str | None = None) -> da.Array:
    """`fn` (a function of tensors, traced here unless it is a tc.trace'd one) over
    corresponding blocks of the Dask arrays in `args` (all of one rank, chunked alike;
    other arguments are passed to every block as they are).  The result's chunks and
    dtype come from tracecomp's shape rules; its blocks are NumPy arrays."""
    traced = _traced(fn)
    arrays = [a for a in args if isinstance(a, da.Array)]
    if not arrays:
        raise ArgumentError(f"tracecomp.dask.map_blocks({_name(fn)}): no Dask array among the arguments")
    first = arrays[0]
    for k, a in enumerate(arrays[1:], 1):
        if a.shape != first.shape:
            raise ShapeError(f"tracecomp.dask.map_blocks({_name(fn)}): Dask array {k} has shape "
                             f"{list(a.shape)}, array 0 has {list(first.shape)}; blocks pair up only "
                             "for arrays of one shape (use map_rows for arrays that share rows)")
    args = tuple(a.rechunk(first.chunks) if isinstance(a, da.Array) else a for a in args)

    def out_type(block_shape: tuple) -> ShapeDtype:
        spec = [ShapeDtype(block_shape, a.dtype) if isinstance(a, da.Array) else a for a in args]
        out = traced.eval_shape(*spec)
        if not isinstance(out, ShapeDtype):
            raise ArgumentError(f"tracecomp.dask.map_blocks({_name(fn)}): the function returns "
                                f"{type(out).__name__}; a Dask array holds one array per block "
                                "(return one tensor, or use reduce_rows for several)")
        if out.ndim != len(block_shape):
            raise ShapeError(f"tracecomp.dask.map_blocks({_name(fn)}): blocks of shape {list(block_shape)} "
                             f"give {list(out.shape)}; a block must keep its rank to keep its place "
                             "(map_rows handles results of another rank)")
        return out

    # Each axis has at most two block sizes (the regular one and the last), so the distinct
    # block shapes are few; each output axis must depend on its own input axis only.
    sizes = [sorted(set(c)) for c in first.chunks]
    mapping: list[dict[int, int]] = [{} for _ in sizes]
    dtype = None
    for shape in itertools.product(*sizes):
        out = out_type(shape)
        dtype = out.dtype
        for axis, (i, o) in enumerate(zip(shape, out.shape)):
            if mapping[axis].setdefault(i, o) != o:
                raise ShapeError(f"tracecomp.dask.map_blocks({_name(fn)}): the output's axis {axis} "
                                 "depends on other axes' block sizes; its chunks cannot form a grid")
    chunks = tuple(tuple(mapping[axis][c] for c in cs) for axis, cs in enumerate(first.chunks))
    return da.map_blocks(BlockCall(traced), *args, chunks=chunks, dtype=dtype,
                         meta=np.empty((0,) * len(chunks), dtype), token=token or f"tc-{_name(fn)}")


# ------------------------------------------------------------------ rows
def _rows_aligned(arrays: Sequence[da.Array], what: str) -> list[da.Array]:
    """The arrays chunked by the first one's rows, every other axis in one chunk."""
    if not arrays or not all(isinstance(a, da.Array) for a in arrays):
        raise ArgumentError(f"tracecomp.dask.{what}: pass Dask arrays that share their first axis")
    n = arrays[0].shape[0] if arrays[0].ndim else None
    for k, a in enumerate(arrays):
        if a.ndim == 0 or a.shape[0] != n:
            raise ShapeError(f"tracecomp.dask.{what}: array {k} has shape {list(a.shape)}; every "
                             f"array needs the first one's {n} rows")
    rows = arrays[0].chunks[0]
    return [a.rechunk((rows,) + tuple(-1 for _ in a.shape[1:])) for a in arrays]


def _row_outputs(traced: TracedFunction, arrays: Sequence[da.Array], what: str) -> dict[int, Any]:
    """Per distinct chunk height, the function's outputs (ShapeDtype pytree), checked to
    give one row per input row."""
    outputs = {}
    for n in sorted(set(arrays[0].chunks[0])):
        out = traced.eval_shape(*[ShapeDtype((n,) + a.shape[1:], a.dtype) for a in arrays])
        for leaf in pytree.flatten(out, lambda x: isinstance(x, ShapeDtype))[0]:
            if leaf.ndim == 0 or leaf.shape[0] != n:
                raise ShapeError(f"tracecomp.dask.{what}({traced.__name__}): a chunk of {n} rows gives "
                                 f"an output of shape {list(leaf.shape)}; the function must give one "
                                 "row per input row (per_row=True maps a function of one row)")
        outputs[n] = out
    return outputs


def map_rows(fn: Callable, *arrays: da.Array, per_row: bool = False, token: str | None = None) -> da.Array:
    """`fn` over chunks of rows of `arrays` (any ranks, one first axis; each other axis is
    brought into one chunk), giving one output row per input row: batch inference.  With
    per_row=True, `fn` takes one row of each array and is vectorized with tc.vmap."""
    traced = _traced(fn, per_row)
    arrays = _rows_aligned(arrays, "map_rows")
    outputs = _row_outputs(traced, arrays, "map_rows")
    out = next(iter(outputs.values()))
    if not isinstance(out, ShapeDtype):
        raise ArgumentError(f"tracecomp.dask.map_rows({_name(fn)}): the function returns "
                            f"{type(out).__name__}; a Dask array holds one array (reduce_rows takes several)")
    letters = iter("abcdefghjklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")     # "i" is the rows
    out_index = "i" + "".join(next(letters) for _ in out.shape[1:])
    pairs = []
    for a in arrays:
        pairs += [a, "i" + "".join(next(letters) for _ in a.shape[1:])]
    new_axes = {letter: size for letter, size in zip(out_index[1:], out.shape[1:])}
    return da.blockwise(BlockCall(traced), out_index, *pairs, new_axes=new_axes, concatenate=True,
                        dtype=out.dtype, meta=np.empty((0,) * out.ndim, out.dtype),
                        token=token or f"tc-rows-{_name(fn)}")


def reduce_rows(fn: Callable, *arrays: da.Array, how: str = "sum", per_row: bool = False,
                split_every: int = 8):
    """The sum (how="sum") or mean (how="mean") over all rows of `fn`'s per-row outputs (any
    pytree of tensors whose first axis is the rows), as a Dask Delayed: each chunk's sum is
    computed inside the compiled function (fused with it), the partial sums are combined in
    float64 (int64 for integers) in a tree of `split_every` at a time, and the result has the
    function's dtypes (a mean of integers is float64).  Call `.compute()` for the values."""
    if how not in ("sum", "mean"):
        raise ArgumentError(f"tracecomp.dask.reduce_rows: how must be 'sum' or 'mean', got {how!r}")
    if isinstance(split_every, bool) or not isinstance(split_every, int) or split_every < 2:
        raise ArgumentError(f"tracecomp.dask.reduce_rows: split_every must be an int >= 2, got {split_every!r}")
    row_fn = _traced(fn, per_row)
    arrays = _rows_aligned(arrays, "reduce_rows")
    outputs = _row_outputs(row_fn, arrays, "reduce_rows")
    inner = row_fn.fn

    def chunk_sums(*blocks):
        return pytree.tree_map(lambda t: t.sum(dim=0), inner(*blocks))
    chunk_sums.__name__ = f"sum_rows_{_name(fn)}"
    partial = PartialSums(trace(chunk_sums))
    blocks = [a.to_delayed().reshape(len(a.chunks[0]), -1)[:, 0] for a in arrays]
    level = [dask.delayed(partial, pure=True)(*row) for row in zip(*blocks)]
    while len(level) > 1:
        level = [dask.delayed(_add_all, pure=True)(*level[i:i + split_every])
                 for i in range(0, len(level), split_every)]
    out = next(iter(outputs.values()))
    dtypes = [leaf.dtype for leaf in pytree.flatten(out, lambda x: isinstance(x, ShapeDtype))[0]]
    rows = arrays[0].shape[0] if how == "mean" else None
    return dask.delayed(_finish, pure=True)(level[0], dtypes, rows)


def _is_numpy(x) -> bool:
    return isinstance(x, (np.ndarray, np.generic))


def _add_all(*partials):
    leaves = [pytree.flatten(p, _is_numpy)[0] for p in partials]
    structure = pytree.flatten(partials[0], _is_numpy)[1]
    return pytree.unflatten(structure, [np.sum(column, axis=0) for column in zip(*leaves)])


def _finish(total, dtypes, rows):
    leaves, structure = pytree.flatten(total, _is_numpy)
    if rows is not None:
        return pytree.unflatten(structure, [np.asarray(x / rows, d if d.kind == "f" else np.float64)
                                            for x, d in zip(leaves, dtypes)])
    return pytree.unflatten(structure, [np.asarray(x, d) for x, d in zip(leaves, dtypes)])


# ------------------------------------------------------------------ files
def from_npy(path, rows: int) -> da.Array:
    """An .npy file as a Dask array of chunks of `rows` rows, each read on the worker that
    needs it from the file memory-mapped there (the file must be on a file system the
    workers share); only the header is read here."""
    path = os.path.abspath(os.fspath(path))
    header = _mapped_npy(path)
    shape, dtype = header.shape, header.dtype
    if not header.flags.c_contiguous:
        raise ArgumentError(f"tracecomp.dask.from_npy: {path} is stored in Fortran order; chunks of "
                            "rows need C order (np.save(np.ascontiguousarray(x)))")
    del header
    if not shape:
        raise ShapeError(f"tracecomp.dask.from_npy: {path} holds a 0-d array; it has no rows")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ArgumentError(f"tracecomp.dask.from_npy: rows must be a positive int, got {rows!r}")
    pieces = [da.from_delayed(dask.delayed(_read_rows, pure=True)(path, start, min(start + rows, shape[0])),
                              shape=(min(rows, shape[0] - start),) + shape[1:], dtype=dtype,
                              meta=np.empty((0,) * len(shape), dtype))
              for start in range(0, shape[0], rows)]
    return da.concatenate(pieces, axis=0) if pieces else da.zeros(shape, dtype, chunks=(1,) + shape[1:])


def _read_rows(path: str, start: int, stop: int) -> np.ndarray:
    mapped = _mapped_npy(path)
    return np.array(mapped[start:stop])          # a copy: the mapping closes when it goes


def _mapped_npy(path: str) -> np.ndarray:
    """The .npy file at `path` memory-mapped, opened through the one reader of user files
    (runtime/safe_files.py): a FIFO or device there is an UnsafeFile error naming it, not
    a wait; a missing file is FileNotFoundError, as from np.load."""
    from ..core.safe_files import descriptor_path, opened_regular
    with opened_regular(path, follow_links=True) as (fd, _):
        return np.load(descriptor_path(fd, path), mmap_mode="r")   # the mapping outlives fd
