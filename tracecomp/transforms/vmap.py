"""tc.vmap: map a function over a batch axis of its inputs, as JAX's vmap and torch.func.vmap.

`tc.vmap(fn, in_axes, out_axes)(*args)` calls fn once, on batched tensors that each stand
for one item (batching.py); every op fn calls runs once on the whole batch by its kind's
batching rule, so the mapped function is as fast as the hand-batched one and, under
tc.trace, compiles into the same kernels.  It composes with itself (nested vmaps map
over more axes), with grad/vjp/jvp (per-example gradients: `tc.vmap(tc.grad(loss),
in_axes=(None, 0))`) and with tc.trace, in any order.

Choices, where JAX and PyTorch differ or are silent:
- in_axes is an int or None for every positional argument, or one entry per positional
  argument, each an int, None or a pytree of those matching the argument (a prefix of it);
  keyword arguments are not mapped (torch.func.vmap's rule).
- Arguments that are not arrays (Python numbers, strings) must have the axis None.
- An output that does not depend on the mapped inputs is broadcast along out_axes (as in
  JAX); out_axes=None asks for an output that is the same for every item.
- randomness (PyTorch's): 'error' (default) refuses rand/randn/dropout inside the mapped
  function, 'different' draws independently per item, 'same' once for all items.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..dispatch import batching
from ..tensors import pytree
from ..core.errors import VmapError, add_location
from ..core.locations import user_location
from ..tensors.tensor import Tensor, as_tensor
from ..dispatch import api as tc

RANDOMNESS = ("error", "different", "same")


def is_array(x: Any) -> bool:
    return isinstance(x, (Tensor, np.ndarray, np.generic)) or hasattr(x, "__dlpack__")


def _is_axis(a: Any) -> bool:
    return a is None or (isinstance(a, int) and not isinstance(a, bool))


def _check_spec(spec: Any, what: str) -> None:
    if _is_axis(spec):
        return
    if isinstance(spec, dict):
        for v in spec.values():
            _check_spec(v, what)
    elif isinstance(spec, (tuple, list)):
        for v in spec:
            _check_spec(v, what)
    else:
        raise VmapError(f"tc.vmap: {what} must be an int, None, or a tuple/list/dict of those, "
                        f"got {type(spec).__name__} {spec!r}")


def leaf_axes(spec: Any, structure: Any, path: str, what: str) -> list:
    """One axis (int or None) per array leaf of `structure`, from `spec`, a prefix of it:
    an int or None covers the whole subtree below it."""
    out: list = []
    _axes(spec, structure, path, what, out)
    return out


def _axes(spec, s, path: str, what: str, out: list) -> None:
    if _is_axis(spec):
        for p, v in zip(pytree.leaf_paths(s, path), pytree.static_values(s)):
            if v is pytree.LEAF:
                out.append(spec)
            elif spec is not None and v is not None:        # None is an empty pytree, as in JAX
                raise VmapError(f"tc.vmap: {p} is a {type(v).__name__} ({v!r}), not an array, so it "
                                f"cannot be mapped over axis {spec}; give it None in {what}")
        return
    if s == pytree.LEAF or s[0] == "static":
        raise VmapError(f"tc.vmap: {what} gives {path} the structure {spec!r}, but it is a single "
                        f"{'array' if s == pytree.LEAF else type(s[1]).__name__}")
    kind, body = s
    if kind == "dict":
        keys = [k for k, _ in body]
        if not isinstance(spec, dict) or set(spec) != set(keys):
            raise VmapError(f"tc.vmap: {what} at {path} must be an int, None or a dict with the keys "
                            f"{keys}, got {spec!r}")
        for k, child in body:
            _axes(spec[k], child, f"{path}[{k!r}]", what, out)
        return
    if not isinstance(spec, (tuple, list)) or len(spec) != len(body):
        n = len(body)
        raise VmapError(f"tc.vmap: {what} at {path} must be an int, None or a sequence of {n} "
                        f"entr{'y' if n == 1 else 'ies'} (one per element), got {spec!r}")
    for i, (a, child) in enumerate(zip(spec, body)):
        _axes(a, child, f"{path}[{i}]", what, out)


def vmap(fn: Callable, in_axes: Any = 0, out_axes: Any = 0, *, randomness: str = "error") -> Callable:
    """fn mapped over axis `in_axes` of its inputs; the results stacked along `out_axes`."""
    if not callable(fn):
        raise VmapError(f"tc.vmap: fn must be callable, got {type(fn).__name__}")
    _check_spec(in_axes, "in_axes")
    _check_spec(out_axes, "out_axes")
    if randomness not in RANDOMNESS:
        raise VmapError(f"tc.vmap: randomness must be one of {', '.join(map(repr, RANDOMNESS))}, "
                        f"got {randomness!r}")

    def wrapped(*args, **kwargs):
        spec = in_axes
        if isinstance(in_axes, (tuple, list)):
            if len(in_axes) != len(args):
                raise VmapError(f"tc.vmap({_name(fn)}): in_axes has {len(in_axes)} entries, but the "
                                f"function was called with {len(args)} positional argument(s)")
            spec = tuple(in_axes)
        _, structure = pytree.flatten(args, is_array)
        try:
            axes = leaf_axes(spec, structure, "args", "in_axes")
        except VmapError as e:
            raise add_location(e, str(user_location())) from None
        axes += [None] * len(pytree.flatten(kwargs, is_array)[0])     # keyword arguments are not mapped
        try:
            return call_mapped(fn, args, kwargs, axes, out_axes, randomness)
        except VmapError as e:           # the user's line, if the error came from no op
            raise add_location(e, str(user_location())) from None
    wrapped.__name__ = f"vmap_{_name(fn)}"
    wrapped.__wrapped__ = fn
    return wrapped


def _name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def call_mapped(fn: Callable, args: tuple, kwargs: dict, axes: list, out_axes: Any,
                randomness: str = "error"):
    """fn(*args, **kwargs) with the array leaves of (args, kwargs) mapped over `axes` (one
    int or None per leaf, in flattening order)."""
    leaves, structure = pytree.flatten((args, kwargs), is_array)
    paths = pytree.array_paths(structure, "")
    paths = [("args" + p[3:]) if p.startswith("[0]") else ("kwargs" + p[3:]) for p in paths]
    mapped = [(i, as_tensor(x), a) for i, (x, a) in enumerate(zip(leaves, axes)) if a is not None]
    if not mapped:
        raise VmapError(f"tc.vmap({_name(fn)}): no input is mapped (every in_axes entry is None); "
                        "map at least one array argument")
    size, first = None, None
    for i, t, a in mapped:
        if t.ndim == 0 or not -t.ndim <= a < t.ndim:
            raise VmapError(f"tc.vmap({_name(fn)}): {paths[i]} has shape {tuple(t.shape)}, so it has "
                            f"no axis {a} to map over (in_axes)" + ("; give it None to pass it whole"
                                                                   if t.ndim == 0 else ""))
        n = t.shape[a]
        if size is None:
            size, first = n, i
        elif n != size:
            raise VmapError(f"tc.vmap({_name(fn)}): the mapped axes have different sizes: "
                            f"{paths[first]} has {size} along its mapped axis, {paths[i]} has {n} "
                            f"(axis {a} of shape {tuple(t.shape)})")
    frame = batching.push(size, randomness)
    try:
        new = list(leaves)
        for i, t, a in mapped:
            whole = t if a % t.ndim == 0 else tc.movedim(t, a % t.ndim, 0)
            new[i] = batching.wrap(whole, frame.level)
        args, kwargs = pytree.unflatten(structure, new)
        out = fn(*args, **kwargs)
    finally:
        batching.pop(frame)
    return _unmapped(out, out_axes, frame, fn)


def _unmapped(out: Any, out_axes: Any, frame, fn) -> Any:
    """fn's outputs with their batch dim at out_axes (outputs that do not vary broadcast)."""
    leaves, structure = pytree.flatten(out, is_array)
    axes = leaf_axes(out_axes, structure, "output", "out_axes")
    paths = pytree.array_paths(structure, "output")
    done = []
    for x, a, path in zip(leaves, axes, paths):
        t = as_tensor(x)
        b = t._batch
        if b is not None and b[1] == frame.level:
            if b[2]:
                if a is None:
                    raise VmapError(f"tc.vmap({_name(fn)}): out_axes is None for {path}, but it varies "
                                    "over the mapped axis; give it an axis")
                whole = b[0]
                dst = _axis(a, whole.ndim, path)
                done.append(whole if dst == 0 else tc.movedim(whole, 0, dst))
                continue
            t = b[0]                # lifted: the same for every item
        if a is None:
            done.append(t)
            continue
        dst = _axis(a, t.ndim + 1, path)
        shape = list(t.shape)
        shape.insert(dst, frame.size)
        done.append(tc.unsqueeze(t, dst).expand(shape))
    return pytree.unflatten(structure, done)


def _axis(a: int, ndim: int, path: str) -> int:
    if not -ndim <= a < ndim:
        raise VmapError(f"tc.vmap: out_axes gives {path} the axis {a}, out of range for its "
                        f"{ndim} dims with the batch dim")
    return a % ndim
