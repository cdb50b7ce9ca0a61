"""Padding, resizing and adaptive pooling (pad, interpolate, adaptive_*_pool*d) as programs
over index_select, matmul and max.

Every position these ops read follows from the shapes alone, so the helpers here compute
the index vectors, interpolation weights and averaging matrices with NumPy (at trace time,
where they become constants of the graph) and apply them with ops whose derivatives give
the gradients: index_select (-> index_add), a weighted sum, matmul, max.dim (-> the argmax).
The composite programs of ops.yaml call them through composites.HELPERS.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import ArgumentError, DTypeError, ShapeError
from ..core.symbolic import is_dynamic
from ..dispatch import api as tc
from . import interpolate_indices as run_time
from .adaptive_windows import averaging_matrix, window_positions

PAD_MODES = ("constant", "reflect", "replicate", "circular")
# reflect, replicate, circular: padded dims -> input ranks (without, with a batch dim)
PAD_RANKS = {1: (2, 3), 2: (3, 4), 3: (4, 5)}
INTERPOLATE_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "trilinear", "area")
LINEAR_RANKS = {"linear": 3, "bilinear": 4, "trilinear": 5}


def _ints(v) -> tuple:
    return tuple(v) if isinstance(v, (list, tuple)) else (v,)


# ---------------------------------------------------------------- pad

def _source_positions(mode: str, n: int, lo: int, hi: int):
    """For output positions -lo .. n + hi - 1 of a dim of size n: the input position each
    reads, a constant; for a dynamic n, a tensor the kernel computes (the same formulas)."""
    if is_dynamic(n):
        return _positions(mode, n, lo, hi, tc.arange(-lo, n + hi), tc.abs, tc.clamp)
    return tc.tensor(_positions(mode, n, lo, hi, np.arange(-lo, n + hi, dtype=np.int64), np.abs, np.clip))


def _positions(mode: str, n, lo: int, hi: int, p, absolute, clip):
    if mode == "reflect":                # mirror about the first and last element
        return n - 1 - absolute(n - 1 - absolute(p))
    if mode == "replicate":
        return clip(p, 0, n - 1)
    # circular, as PyTorch: negative pads crop first, positive ones wrap around what is left
    first, last = max(-lo, 0), n - max(-hi, 0)
    return first + (p - first) % (last - first)


def check_pad(x, pad, mode: str, value) -> list[tuple[int, int, int]]:
    """PyTorch's rules for pad's reflect, replicate and circular modes; the (dim, before,
    after) of each padded dim."""
    where = f"mode '{mode}' with pad {tuple(pad)} and an input of shape {tuple(x.shape)}"
    if mode not in PAD_MODES:
        raise ArgumentError(f"pad: mode must be one of {', '.join(map(repr, PAD_MODES))}, got {mode!r}")
    if len(pad) % 2:
        raise ShapeError(f"pad: {where}: pad must hold (before, after) pairs, but its length is odd")
    n = len(pad) // 2
    if value is not None and value != 0:
        raise ArgumentError(f"pad: {where}: value {value} is only for mode 'constant'")
    if x.ndim not in PAD_RANKS.get(n, ()):
        raise ShapeError(f"pad: {where}: mode '{mode}' pads the last 1, 2 or 3 dims of a tensor with one "
                         "or two dims more (1 pair: 2-D or 3-D input, 2 pairs: 3-D or 4-D, 3 pairs: 4-D or 5-D)")
    first = 1 if x.ndim == n + 2 else 0          # a batch dim may be empty, no other
    if mode != "circular" and any(s == 0 for s in x.shape[first:]):
        raise ShapeError(f"pad: {where}: mode '{mode}' needs non-empty dims (except a batch dim)")
    dims = []
    for k in range(n):
        d, lo, hi = x.ndim - 1 - k, pad[2 * k], pad[2 * k + 1]
        size = x.shape[d]
        if mode == "reflect" and not (lo < size and hi < size):
            raise ShapeError(f"pad: {where}: reflect padding ({lo}, {hi}) must be less than the size {size} of dim {d}")
        if mode == "circular" and not (lo <= size and hi <= size):
            raise ShapeError(f"pad: {where}: circular padding ({lo}, {hi}) must be at most the size {size} "
                             f"of dim {d} (it wraps around once)")
        if size + lo + hi < 1:
            raise ShapeError(f"pad: {where}: dim {d} of size {size} padded by ({lo}, {hi}) would have size "
                             f"{size + lo + hi}; it must be at least 1")
        dims.append((d, lo, hi))
    return dims


def pad_by_index(x, pad, mode: str, value):
    """reflect, replicate or circular padding: one index_select per padded dim.  A half
    input is padded in float32 (exact), so that its gradient, one index_add per padded dim,
    sums the copies' gradients in float32 and rounds once, not once per dim."""
    half = x.dtype if x.dtype.is_half else None
    y = x.to(tc.float32) if half else x
    for d, lo, hi in check_pad(x, pad, mode, value):
        y = tc.index_select(y, d, _source_positions(mode, y.shape[d], lo, hi))
    return y.to(half) if half else y


# ---------------------------------------------------------------- interpolate

def _output_sizes(x, size, scale_factor, recompute: bool | None):
    """(output sizes, the scales the kernels use: None where they follow from the sizes)."""
    spatial = x.ndim - 2
    if (size is None) == (scale_factor is None):
        raise ArgumentError("interpolate: give exactly one of size and scale_factor, got "
                            + ("both" if size is not None else "neither"))
    if size is not None:
        if recompute:
            raise ArgumentError("interpolate: recompute_scale_factor is not meaningful with an explicit size")
        sizes = _ints(size) * spatial if len(_ints(size)) == 1 else _ints(size)
        if len(sizes) != spatial:
            raise ShapeError(f"interpolate: size {tuple(size)} must give one size per spatial dim of the "
                             f"input of shape {tuple(x.shape)} ({spatial}: the dims after N and C)")
        if any(s <= 0 for s in sizes):
            raise ShapeError(f"interpolate: size {tuple(size)} must be positive")
        return list(sizes), [None] * spatial
    scales = _ints(scale_factor) * spatial if len(_ints(scale_factor)) == 1 else _ints(scale_factor)
    if len(scales) != spatial:
        raise ShapeError(f"interpolate: scale_factor {tuple(scale_factor)} must give one factor per spatial "
                         f"dim of the input of shape {tuple(x.shape)} ({spatial})")
    sizes = [run_time.scaled_size(n, s) if is_dynamic(n) else math.floor(n * s)    # in double, as PyTorch
             for n, s in zip(x.shape[2:], scales)]
    if any(s <= 0 for s in sizes):
        raise ShapeError(f"interpolate: scale_factor {tuple(scales)} gives the output size {tuple(sizes)} "
                         f"for the input of shape {tuple(x.shape)}; each must be positive")
    return sizes, [None] * spatial if recompute else list(scales)


def _inverse_scale(n_in: int, n_out: int, scale, dtype):
    """PyTorch's compute_scales_value: 1 / scale_factor when one was given, else n_in / n_out."""
    if scale is not None and scale > 0:
        return dtype(1.0 / scale)
    return dtype(n_in) / dtype(n_out)


def nearest_positions(n_in: int, n_out: int, scale, exact: bool) -> np.ndarray:
    """The input position of each output position, in float32 as PyTorch's CPU kernel."""
    i = np.arange(n_out)
    if not exact and n_out == n_in:
        return i.astype(np.int64)
    if not exact and n_out == 2 * n_in:           # PyTorch's exact shortcuts
        return (i // 2).astype(np.int64)
    s = _inverse_scale(n_in, n_out, scale, np.float32)
    src = np.floor((i + 0.5) * np.float64(s)) if exact else np.floor(i.astype(np.float32) * s)
    return np.minimum(src.astype(np.int64), n_in - 1)


def linear_weights(n_in: int, n_out: int, scale, align_corners: bool, dtype):
    """For each output position: the two input positions and the second one's weight, computed
    in the input's precision with PyTorch's source-index formula."""
    i = np.arange(n_out).astype(dtype)
    if align_corners:
        s = dtype(n_in - 1) / dtype(n_out - 1) if n_out > 1 else dtype(0)
        src = s * i
    else:
        s = _inverse_scale(n_in, n_out, scale, dtype)
        src = np.maximum(s * (i + dtype(0.5)) - dtype(0.5), dtype(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    w1 = np.clip(src - i0.astype(dtype), 0, 1).astype(dtype)
    return i0, np.minimum(i0 + 1, n_in - 1), w1


def _check_interpolate(x, mode: str, align_corners, antialias: bool) -> None:
    shape = tuple(x.shape)
    if mode in ("bicubic", "lanczos") or antialias:
        what = f"mode {mode!r}" + (" with antialias=True" if antialias else "")
        raise ArgumentError(f"interpolate: {what} is not supported (input of shape {shape}); "
                            f"supported modes: {', '.join(INTERPOLATE_MODES)}")
    if mode not in INTERPOLATE_MODES:
        raise ArgumentError(f"interpolate: mode must be one of {', '.join(map(repr, INTERPOLATE_MODES))}, got {mode!r}")
    if mode in LINEAR_RANKS:
        if x.ndim != LINEAR_RANKS[mode]:
            raise ShapeError(f"interpolate: mode {mode!r} needs a {LINEAR_RANKS[mode]}-D input "
                             f"(N, C and {LINEAR_RANKS[mode] - 2} spatial dims), got shape {shape}")
        if not x.dtype.is_floating_point:
            raise DTypeError(f"interpolate: mode {mode!r} needs a floating-point input, got {x.dtype.label}")
    elif align_corners is not None:
        raise ArgumentError(f"interpolate: align_corners is only for the modes linear, bilinear and "
                            f"trilinear, not {mode!r}")
    if x.ndim not in (3, 4, 5):
        raise ShapeError(f"interpolate: expects a 3-D, 4-D or 5-D input (N, C, then 1 to 3 spatial dims), "
                         f"got shape {shape}")


def interpolated(x, size, scale_factor, mode: str, align_corners, recompute_scale_factor, antialias: bool):
    """F.interpolate: nearest modes pick with index_select; linear ones blend two picks per
    spatial dim with constant weights; area is adaptive average pooling."""
    _check_interpolate(x, mode, align_corners, antialias)
    sizes, scales = _output_sizes(x, size, scale_factor, recompute_scale_factor)
    if mode == "area":
        return adaptive_average("interpolate", x, sizes, x.ndim - 2)
    for k, (n_out, scale) in enumerate(zip(sizes, scales)):
        d = 2 + k
        n_in = x.shape[d]
        dynamic = is_dynamic(n_in) or is_dynamic(n_out)     # (then index arithmetic at run time)
        if mode.startswith("nearest"):
            positions = run_time.nearest_positions if dynamic else nearest_positions
            at = positions(n_in, n_out, scale, mode == "nearest-exact")
            x = tc.index_select(x, d, at if dynamic else tc.tensor(at))
            continue
        if dynamic:
            i0, i1, w1 = run_time.linear_weights(n_in, n_out, scale, bool(align_corners), x.dtype)
        else:
            weights = linear_weights(n_in, n_out, scale, bool(align_corners), x.dtype.np.type)
            i0, i1, w1 = (tc.tensor(v) for v in weights)
        w1 = w1.reshape((-1,) + (1,) * (x.ndim - d - 1))
        x0, x1 = tc.index_select(x, d, i0), tc.index_select(x, d, i1)
        x = x0 * (1 - w1) + x1 * w1
    return x


# ---------------------------------------------------------------- adaptive pooling

def _pool_sizes(name: str, x, output_size, spatial: int) -> list[int]:
    """The output sizes (None keeps the input's), after PyTorch's checks of the input."""
    shape = tuple(x.shape)
    if x.ndim not in (spatial + 1, spatial + 2):
        raise ShapeError(f"{name}: expects a {spatial + 1}-D or {spatial + 2}-D input, got shape {shape}")
    if any(s == 0 for s in shape[1 if x.ndim == spatial + 2 else 0:]):
        raise ShapeError(f"{name}: expects non-empty dims (except a batch dim), got shape {shape}")
    if not x.dtype.is_floating_point:
        raise DTypeError(f"{name}: expects a floating-point input, got {x.dtype.label}")
    sizes = list(_ints(output_size))
    if len(sizes) != spatial:
        raise ShapeError(f"{name}: output_size {tuple(sizes)} must give {spatial} sizes")
    sizes = [n if s is None else s for s, n in zip(sizes, shape[-spatial:])]
    if any(s < 0 for s in sizes):
        raise ShapeError(f"{name}: output_size {tuple(sizes)} must not be negative")
    return sizes


def adaptive_average(name: str, x, output_size, spatial: int):
    """Each of the last `spatial` dims averaged over its windows: a matmul with a constant
    (n_out, n_in) averaging matrix.  A half input is averaged in float32 and rounded once, as
    PyTorch's 1-D and 2-D CPU kernels sum their windows in float32 (half weights 1/window and
    a rounding per dim land further from the truth)."""
    sizes = _pool_sizes(name, x, output_size, spatial)
    given = x.dtype
    x = x.to(given.compute)
    for k, n_out in enumerate(sizes):
        d = x.ndim - spatial + k
        n_in = x.shape[d]
        mean = averaging_matrix(n_in, n_out, x.dtype)       # (n_out, n_in)
        if d == x.ndim - 1:
            x = tc.matmul(x, mean.mT)
        elif d == x.ndim - 2:       # from the left: no transposes
            x = tc.matmul(mean, x)
        else:
            x = tc.movedim(tc.matmul(tc.movedim(x, d, -1), mean.mT), -1, d)
    return x.to(given)


def adaptive_maximum(name: str, x, output_size, return_indices: bool, spatial: int):
    """Each window's elements gathered into a last dim (one index_select per pooled dim),
    then max over it; the indices are flat positions in the input's pooled plane."""
    sizes = _pool_sizes(name, x, output_size, spatial)
    plane = tuple(x.shape[-spatial:])
    batch = tuple(x.shape[:-spatial])
    picks = [window_positions(n_in, n_out) for n_in, n_out in zip(plane, sizes)]
    y = x
    for k, p in enumerate(picks):          # dim d becomes (n_out, k) windows
        d = len(batch) + 2 * k
        y = tc.index_select(y, d, p.reshape(-1))
        y = y.reshape(tuple(y.shape[:d]) + tuple(p.shape) + tuple(y.shape[d + 1:]))
    outs = [len(batch) + 2 * k for k in range(spatial)]
    y = y.permute(list(range(len(batch))) + outs + [o + 1 for o in outs])
    y = y.reshape(batch + tuple(sizes) + (-1,))
    values, arg = tc.max(y, -1)
    if not return_indices:
        return values
    # positions[o..., w...] = the flat input position of window element w of output o
    strides = [math.prod(plane[k + 1:]) for k in range(spatial)]
    flat = sum(_grid(p * s, k, spatial) for k, (p, s) in enumerate(zip(picks, strides)))
    flat = flat.reshape(tuple(sizes) + (-1,))
    indices = tc.gather(flat.expand(batch + tuple(sizes) + (flat.shape[-1],)), -1, arg.unsqueeze(-1)).squeeze(-1)
    return values, indices


def _grid(p, k: int, spatial: int):
    """p (n_out, w) of pooled dim k placed on the axes (outs..., windows...) of all `spatial` dims."""
    shape = [1] * (2 * spatial)
    shape[k], shape[spatial + k] = tuple(p.shape)
    return p.reshape(shape)


HELPERS = {"pad_by_index": pad_by_index, "interpolated": interpolated,
           "adaptive_average": adaptive_average, "adaptive_maximum": adaptive_maximum}
