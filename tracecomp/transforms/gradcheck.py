"""gradcheck / gradgradcheck: analytic gradients against central finite differences in float64.

The analytic Jacobian is built row by row with vjp (one one-hot cotangent per output
element), eagerly or through a traced vjp (`traced=True`, so symbolic backward graphs are
checked too); the numeric one perturbs each input element by +-eps.  Non-floating inputs
(e.g. index tensors) are passed through unchanged.  A mismatch raises GradcheckError
naming the input, the element, the output element and both values.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..core.errors import TracecompError
from ..tensors.tensor import Tensor, as_tensor
from ..autograd.functional import vjp
from .trace import trace


class GradcheckError(TracecompError, AssertionError):
    pass


def _outputs_flat(out) -> np.ndarray:
    outs = [out] if isinstance(out, Tensor) else list(out)
    return np.concatenate([np.asarray(o, dtype=np.float64).reshape(-1) for o in outs
                           if o.dtype.is_floating_point]) if outs else np.zeros(0)


def _split(inputs: Sequence) -> tuple[list[np.ndarray], list[int]]:
    arrays = [np.array(np.asarray(as_tensor(x)), copy=True) for x in inputs]
    diff = [i for i, a in enumerate(arrays) if a.dtype.kind == "f"]
    for i in diff:
        if arrays[i].dtype != np.float64:
            raise GradcheckError(f"gradcheck needs float64 inputs for accuracy; input {i} is {arrays[i].dtype}")
    return arrays, diff


def _numeric(fn, arrays, diff, eps) -> list[np.ndarray]:
    """d(out)/d(input i), shape (n_out, n_in_i), by central differences."""
    jac = []
    for i in diff:
        x = arrays[i]
        cols = []
        for j in range(x.size):
            flat = x.reshape(-1)
            orig = flat[j]
            flat[j] = orig + eps
            plus = _outputs_flat(fn(*[as_tensor(a) for a in arrays]))
            flat[j] = orig - eps
            minus = _outputs_flat(fn(*[as_tensor(a) for a in arrays]))
            flat[j] = orig
            cols.append((plus - minus) / (2 * eps))
        if cols:
            jac.append(np.stack(cols, axis=1))
        else:                           # an empty input: (n_out, 0), like the analytic side
            jac.append(np.zeros((_outputs_flat(fn(*[as_tensor(a) for a in arrays])).size, 0)))
    return jac


def _float_outputs(out):
    """fn's result without its non-floating outputs (max.dim's indices): only those get cotangents."""
    if isinstance(out, Tensor):
        return out
    return tuple(o for o in out if o.dtype.is_floating_point)


def _vjp_function(fn, arrays, diff, traced: bool) -> Callable:
    """(cotangents per float output) -> gradients per differentiable input."""

    def run(*args):
        xs, cts = list(args[:len(diff)]), list(args[len(diff):])
        consts = {i: as_tensor(a) for i, a in enumerate(arrays) if i not in diff}

        def f(*diff_inputs):
            call = [consts[i] if i in consts else None for i in range(len(arrays))]
            for i, x in zip(diff, diff_inputs):
                call[i] = x
            return _float_outputs(fn(*call))
        out, pullback = vjp(f, *xs)
        return pullback(*cts)
    if traced:
        return trace(run)
    return run


def _analytic(fn, arrays, diff, traced) -> list[np.ndarray]:
    out = fn(*[as_tensor(a) for a in arrays])
    outs = [o for o in ([out] if isinstance(out, Tensor) else list(out)) if o.dtype.is_floating_point]
    sizes = [o.numel() for o in outs]
    pull = _vjp_function(fn, arrays, diff, traced)
    rows = [[] for _ in diff]
    for k in range(sum(sizes)):
        onehot = np.zeros(sum(sizes))
        onehot[k] = 1.0
        cts, start = [], 0
        for o, n in zip(outs, sizes):
            cts.append(onehot[start:start + n].reshape(o.shape).astype(o.dtype.np))
            start += n
        grads = pull(*[arrays[i] for i in diff], *cts)
        for r, g in zip(rows, grads):
            r.append(np.asarray(g, dtype=np.float64).reshape(-1))
    return [np.stack(r) if r else np.zeros((0, arrays[i].size)) for r, i in zip(rows, diff)]


def gradcheck(fn: Callable, inputs: Sequence, eps: float = 1e-6, atol: float = 1e-5,
              rtol: float = 1e-3, traced: bool = False) -> bool:
    """True if fn's analytic gradients match finite differences; else GradcheckError."""
    arrays, diff = _split(inputs)
    numeric = _numeric(fn, arrays, diff, eps)
    analytic = _analytic(fn, arrays, diff, traced)
    for i, a, n in zip(diff, analytic, numeric):
        if a.shape != n.shape:
            raise GradcheckError(f"input {i}: analytic Jacobian has shape {a.shape}, numeric {n.shape}")
        err = np.abs(a - n) - (atol + rtol * np.abs(n))
        if err.size and (np.max(err) > 0 or not np.all(np.isfinite(a))):
            k, j = np.unravel_index(np.nanargmax(np.where(np.isfinite(a), err, np.inf)), err.shape)
            index = np.unravel_index(j, arrays[i].shape)
            raise GradcheckError(
                f"gradcheck failed for input {i} at element {tuple(int(v) for v in index)}, output "
                f"element {int(k)}: analytic {a[k, j]!r} vs numeric {n[k, j]!r} (atol={atol}, "
                f"rtol={rtol}{', traced' if traced else ''})")
    return True


def gradgradcheck(fn: Callable, inputs: Sequence, eps: float = 1e-6, atol: float = 1e-5,
                  rtol: float = 1e-3, seed: int = 0, traced: bool = False) -> bool:
    """gradcheck of the vjp of fn with a fixed random cotangent: second derivatives."""
    arrays, diff = _split(inputs)
    out = fn(*[as_tensor(a) for a in arrays])
    outs = [o for o in ([out] if isinstance(out, Tensor) else list(out)) if o.dtype.is_floating_point]
    rng = np.random.default_rng(seed)
    cts = [as_tensor(rng.standard_normal(o.shape)) for o in outs]

    def first_derivative(*xs):
        full = [as_tensor(a) for a in arrays]
        for i, x in zip(diff, xs):
            full[i] = x

        def f(*diff_inputs):
            call = list(full)
            for i, x in zip(diff, diff_inputs):
                call[i] = x
            return _float_outputs(fn(*call))
        _, pullback = vjp(f, *xs)
        return pullback(*cts)
    return gradcheck(first_derivative, [arrays[i] for i in diff], eps, atol, rtol, traced)
