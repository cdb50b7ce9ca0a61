"""Jacobians and Hessians (JAX's jacrev, jacfwd, hessian): autodiff's VJPs and JVPs taken
over all basis vectors at once with tc.vmap, so they live among the transforms.

JAX's jacrev/jacfwd/hessian over pytrees: a Jacobian leaf for output leaf o and input
leaf x has shape o.shape + x.shape; the output's structure is outside, the inputs'
inside (one pytree per argnum, or the argnum's own pytree for an int).  The basis
vectors are one tc.vmap: all VJPs (jacrev) or JVPs (jacfwd) run as one batched program,
and under tc.trace the graph does not grow with the number of elements.
"""
from __future__ import annotations

from typing import Callable, Sequence

from ..autograd.functional import chosen_argnums, is_tracked, jvp, vjp
from ..dispatch import api as tc
from ..tensors import pytree
from ..tensors.tensor import Tensor, as_tensor
from .vmap import vmap


def _selecting(fn: Callable, args: tuple, argnums, has_aux: bool) -> tuple[list, Callable, Callable]:
    """(the arguments at argnums, fn of those only (the others fixed), that without its aux)."""
    nums = chosen_argnums(argnums, len(args))

    def f(*chosen):
        full = list(args)
        for i, x in zip(nums, chosen):
            full[i] = x
        return fn(*full)
    return [args[i] for i in nums], f, ((lambda *a: f(*a)[0]) if has_aux else f)


def _basis(t: Tensor):
    """The numel(t) unit vectors shaped like t, stacked: (numel, *t.shape)."""
    return tc.eye(t.numel(), dtype=t.dtype).reshape([t.numel()] + list(t.shape))


def _over_basis(t: Tensor, each: Callable, out_axis: int, shape_of: Callable):
    """each(unit vector) for all unit vectors of t at once (tc.vmap over the basis, stacked
    along out_axis), each result leaf reshaped to shape_of(its shape without that dim)."""
    if t.numel() == 0:        # no unit vectors: an empty Jacobian block per result leaf
        leaves, structure = pytree.flatten(each(tc.zeros_like(t)), is_tracked)
        return pytree.unflatten(structure, [tc.zeros(shape_of(tuple(x.shape)), dtype=x.dtype)
                                            for x in leaves])
    leaves, structure = pytree.flatten(vmap(each, out_axes=out_axis)(_basis(t)), is_tracked)
    return pytree.unflatten(structure, [x.reshape(shape_of(_without(tuple(x.shape), out_axis % x.ndim)))
                                        for x in leaves])


def _without(shape: tuple, axis: int) -> tuple:
    return shape[:axis] + shape[axis + 1:]


def jacrev(fn: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The Jacobian of fn w.r.t. the arguments at argnums, by reverse mode (the VJPs of all
    of the output's unit vectors, vmapped)."""
    def wrapped(*args):
        primals, f, g = _selecting(fn, args, argnums, has_aux)
        out, pull = vjp(g, *primals)
        outs, out_structure = pytree.flatten(out, is_tracked)
        per_output = []
        for o in outs:
            def row(ct, o=o):
                grads = pull(pytree.unflatten(out_structure, [ct if p is o else tc.zeros_like(p) for p in outs]))
                return grads[0] if isinstance(argnums, int) else tuple(grads)
            per_output.append(_over_basis(o, row, 0, lambda item, o=o: list(o.shape) + list(item)))
        jac = pytree.unflatten(out_structure, per_output)
        return (jac, f(*primals)[1]) if has_aux else jac
    wrapped.__name__ = f"jacrev_{getattr(fn, '__name__', 'fn')}"
    return wrapped


def jacfwd(fn: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The Jacobian of fn w.r.t. the arguments at argnums, by forward mode (the JVPs of all
    of the inputs' unit vectors, vmapped)."""
    def wrapped(*args):
        primals, f, g = _selecting(fn, args, argnums, has_aux)
        p_leaves, p_structure = pytree.flatten(tuple(primals), pytree.is_array_or_number)
        p_leaves = [as_tensor(x) for x in p_leaves]
        columns = []            # per input leaf: the output pytree of o.shape + x.shape leaves
        for j, x in enumerate(p_leaves):
            def column(t, j=j):
                tangents = [t if i == j else tc.zeros_like(y) for i, y in enumerate(p_leaves)]
                return jvp(g, tuple(primals), pytree.unflatten(p_structure, tangents))[1]
            columns.append(_over_basis(x, column, -1, lambda item, x=x: list(item) + list(x.shape)))
        # regroup: output structure outside, input structure inside
        out_leaves = [pytree.flatten(c, is_tracked) for c in columns]
        out_structure = out_leaves[0][1] if out_leaves else pytree.flatten(g(*primals), is_tracked)[1]
        per_output = []
        for m in range(len(out_leaves[0][0]) if out_leaves else 0):
            inner = pytree.unflatten(p_structure, [ls[m] for ls, _ in out_leaves])
            per_output.append(inner[0] if isinstance(argnums, int) else inner)
        jac = pytree.unflatten(out_structure, per_output)
        return (jac, f(*primals)[1]) if has_aux else jac
    wrapped.__name__ = f"jacfwd_{getattr(fn, '__name__', 'fn')}"
    return wrapped


def hessian(fn: Callable, argnums: int | Sequence[int] = 0) -> Callable:
    """The Hessian of a scalar fn: jacfwd of jacrev, as JAX defines it."""
    h = jacfwd(jacrev(fn, argnums), argnums)
    h.__name__ = f"hessian_{getattr(fn, '__name__', 'fn')}"
    return h
