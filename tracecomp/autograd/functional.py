"""The user-facing autodiff API: backward, autograd.grad, and JAX-style grad/value_and_grad/vjp/jvp.

All of them run the one engine (backward.py) or the ForwardAD key, so they work eagerly
and under tc.trace alike: on traced tensors the formulas record backward ops into the
graph, giving one graph with the forward and the backward pass.  Values the backward pass
needs are the forward pass's own SSA values (saved by the nodes), never recomputed.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ..dispatch import batching
from ..tensors import pytree
from ..dispatch.dispatcher import level_of
from ..core.errors import ArgumentError, add_location
from ..tensors.tensor import Tensor, as_tensor
from .backward import recorded_at, run_backward
from .grad_mode import differentiating, is_grad_enabled
from .kernels import primal
from ..dispatch import api as tc


def _error(message: str) -> ArgumentError:
    """An ArgumentError about what the user passed, with the user's line."""
    from ..core.locations import user_location
    return add_location(ArgumentError(message), str(user_location()))


def _type_name(x) -> str:
    """`numpy.ndarray`, `torch.Tensor`, `tracecomp.Tensor`, `float`: what the user passed."""
    module = type(x).__module__.split(".")[0]
    return type(x).__name__ if module == "builtins" else f"{module}.{type(x).__name__}"


def _ones_like(t):
    """The seed gradient of `t`, recorded (when tracing) as part of the backward pass of
    the op that made `t`."""
    with recorded_at(t.grad_fn):
        return tc.ones_like(t)


def _root_grads(tensors: list, grads: Sequence | None) -> list:
    if grads is None:
        out = []
        for t in tensors:
            if t.numel() != 1:
                raise ArgumentError(f"grad can be implicitly created only for scalar outputs; got a "
                                    f"tensor of shape {t.shape}: pass gradient= (a tensor of that shape)")
            out.append(_ones_like(t))
        return out
    out = []
    for t, g in zip(tensors, grads):
        g = _ones_like(t) if g is None else as_tensor(g)
        if tuple(g.shape) != tuple(t.shape):
            raise ArgumentError(f"gradient has shape {g.shape}, but the tensor has shape {t.shape}")
        out.append(g)
    return out


def backward(tensors: list, grad_tensors=None, retain_graph: bool | None = None,
             create_graph: bool = False) -> None:
    """Accumulate gradients of `tensors` into the `.grad` of every leaf that requires grad."""
    retain = create_graph if retain_graph is None else retain_graph
    run_backward(list(tensors), _root_grads(list(tensors), grad_tensors), retain, create_graph)


def autograd_grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None,
                  create_graph: bool = False, allow_unused: bool = False) -> tuple:
    """torch.autograd.grad: gradients of `outputs` w.r.t. `inputs`, returned, not accumulated."""
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    retain = create_graph if retain_graph is None else retain_graph
    grads = run_backward(outputs, _root_grads(outputs, grad_outputs), retain, create_graph, inputs)
    for i, g in enumerate(grads):
        if g is None and not allow_unused:
            raise ArgumentError(f"input {i} was not used to compute the outputs; pass allow_unused=True")
    return tuple(grads)


def chosen_argnums(argnums, nargs: int) -> tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    for n in nums:
        if not isinstance(n, int) or not -nargs <= n < nargs:
            raise _error(f"argnums {n!r} is out of range for a function called with "
                         f"{nargs} positional argument(s)")
    return tuple(n % nargs for n in nums)


def _differentiable_input(x, where: str) -> Tensor:
    """A leaf that requires grad for the input at `where`; one already tracked (nested grad)
    stays."""
    t = as_tensor(x)
    if not t.dtype.is_floating_point:
        what = (f"the Python {type(x).__name__} {x!r}" if isinstance(x, (bool, int, float))
                else f"a {_type_name(x)} of dtype {t.dtype.label}")
        raise _error(f"{where} is {what}, but only floating-point "
                     "inputs can be differentiated: cast it (x.astype(np.float32), t.float()), or pass "
                     "it in an argument that argnums does not select")
    level = batching.current_level()
    if level_of(t) < level:             # inside tc.vmap: the gradient is one per item
        t = batching.lift(t, level)
    elif t.requires_grad and is_grad_enabled():
        return t
    leaf = batching.detach_level(t)
    leaf._tangent = t._tangent          # keep forward-mode tangents (jvp of grad)
    leaf.requires_grad = True
    return leaf


def is_tracked(x) -> bool:
    return isinstance(x, Tensor)


class Differentiated:
    """The pytrees of the arguments being differentiated, as leaves that require grad and
    the structures to put gradients back into (JAX's convention: a gradient has the shape
    of its argument's pytree).  The children a registered node marks as constants (a
    tc.nn.Module's buffers) are left alone, their gradient None."""

    def __init__(self, trees: list, names: list[str]):
        self.structures, self.leaves, self.trees, self.constant = [], [], [], []
        for tree, name in zip(trees, names):
            leaves, structure = pytree.flatten(tree, pytree.is_array_or_number)
            for path, s in zip(pytree.leaf_paths(structure, name), pytree.static_values(structure)):
                if s is not pytree.LEAF and s is not None:
                    raise _error(f"{path} is a {_type_name(s)} ({s!r}), not a tensor: a differentiated "
                                 "argument holds tensors only (pass other values in arguments that "
                                 "argnums does not select)")
            tensor_paths = pytree.array_paths(structure, name)
            constant = pytree.constant_leaves(structure)
            inputs = [as_tensor(x) if c else _differentiable_input(x, p)
                      for x, p, c in zip(leaves, tensor_paths, constant)]
            self.structures.append((structure, len(inputs)))
            self.leaves.extend(x for x, c in zip(inputs, constant) if not c)
            self.constant.extend(constant)
            self.trees.append(pytree.unflatten(structure, inputs))

    def gradients(self, grads: list) -> list:
        """`grads` (one per differentiated leaf, None where unused) as one pytree per argument."""
        grads = iter([g if g is not None else _zeros_like(x) for g, x in zip(grads, self.leaves)])
        every = iter([None if c else next(grads) for c in self.constant])
        out = []
        for structure, n in self.structures:
            out.append(pytree.unflatten(structure, [next(every) for _ in range(n)]))
        return out


def value_and_grad(fn: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """fn -> (value, gradient(s)) of its scalar result w.r.t. the arguments in `argnums`."""
    def wrapped(*args, **kwargs):
        nums = chosen_argnums(argnums, len(args))
        args = list(args)
        diff = Differentiated([args[i] for i in nums], [f"argument {i}" for i in nums])
        inputs = diff.leaves
        nested = any(x.requires_grad for i in nums for x in pytree.flatten(args[i], is_tracked)[0]) \
            and is_grad_enabled()
        for i, tree in zip(nums, diff.trees):
            args[i] = tree
        with differentiating():
            out = fn(*args, **kwargs)
        value, aux = _split_aux(out, has_aux)
        if not isinstance(value, Tensor) or value.numel() != 1 or value.ndim != 0:
            shape = getattr(value, "shape", type(value).__name__)
            raise _error(f"grad needs fn to return a scalar (0-d) tensor, got {shape}"
                         + ("; with has_aux=True return (scalar, aux)" if not has_aux else ""))
        if not value.dtype.is_floating_point:       # its gradient is not zero: it is undefined
            raise _error(f"grad needs fn to return a floating-point scalar, got {value.dtype.label} "
                         "(as PyTorch and JAX, tracecomp does not differentiate integer or bool "
                         "results; return a float, e.g. with .float())")
        if not value.requires_grad:
            grads = [None] * len(inputs)
        else:
            grads = run_backward([value], [_ones_like(value)], nested, nested, inputs)
        with recorded_at(value.grad_fn):      # zeros for inputs the value does not use
            grads = diff.gradients(grads)
        result = grads[0] if isinstance(argnums, int) else tuple(grads)
        value = value if nested else value.detach()
        return ((value, aux), result) if has_aux else (value, result)
    wrapped.__name__ = f"value_and_grad_{getattr(fn, '__name__', 'fn')}"
    wrapped.__wrapped__ = fn          # inspect.signature: the same parameters as fn
    return wrapped


def _zeros_like(t):
    return tc.zeros_like(t)


def _split_aux(out, has_aux: bool):
    if not has_aux:
        return out, None
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise _error("with has_aux=True, fn must return a pair (scalar, aux)")
    return out[0], out[1]


def grad(fn: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """fn -> the gradient of its scalar result (JAX's calling convention)."""
    vg = value_and_grad(fn, argnums, has_aux)

    def wrapped(*args, **kwargs):
        (value_aux, g) = vg(*args, **kwargs)
        return (g, value_aux[1]) if has_aux else g
    wrapped.__name__ = f"grad_{getattr(fn, '__name__', 'fn')}"
    wrapped.__wrapped__ = fn
    return wrapped


def vjp(fn: Callable, *primals) -> tuple[Any, Callable]:
    """(fn(*primals), vjp_fn): vjp_fn(cotangents shaped like the output) gives one gradient
    pytree per primal.  Primals, outputs and cotangents may be pytrees."""
    nested = is_grad_enabled() and any(t.requires_grad for t in pytree.flatten(primals, is_tracked)[0])
    diff = Differentiated(list(primals), [f"primal {i}" for i in range(len(primals))])
    with differentiating():
        out = fn(*diff.trees)
    outs, out_structure = pytree.flatten(out, is_tracked)

    def vjp_fn(*cotangents):
        tree = cotangents[0] if len(cotangents) == 1 else cotangents
        cts = pytree.flatten(tree, pytree.is_array_or_number)[0]
        if len(cts) != len(outs):
            raise ArgumentError(f"vjp_fn takes cotangents shaped like fn's output ({len(outs)} "
                                f"tensor(s)), got {len(cts)}")
        live = [(o, c) for o, c in zip(outs, cts) if o.requires_grad]
        grads = [None] * len(diff.leaves)
        if live:
            grads = run_backward([o for o, _ in live], _root_grads([o for o, _ in live], [c for _, c in live]),
                                 True, nested, diff.leaves)
        return tuple(diff.gradients(grads))
    if nested:
        return out, vjp_fn
    return pytree.unflatten(out_structure, [o.detach() for o in outs]), vjp_fn


def jvp(fn: Callable, primals: Sequence, tangents: Sequence) -> tuple[Any, Any]:
    """(fn(*primals), the directional derivative along `tangents`), by forward mode.  Primals
    and tangents are sequences of pytrees of the same structure."""
    if len(primals) != len(tangents):
        raise ArgumentError(f"jvp: {len(primals)} primals but {len(tangents)} tangents")
    p_leaves, structure = pytree.flatten(tuple(primals), pytree.is_array_or_number)
    t_leaves, t_structure = pytree.flatten(tuple(tangents), pytree.is_array_or_number)
    if len(p_leaves) != len(t_leaves):
        raise ArgumentError(f"jvp: the tangents hold {len(t_leaves)} tensor(s), the primals "
                            f"{len(p_leaves)}; they must have the same structure")
    paths = pytree.array_paths(structure, "primals")
    duals = []
    for where, p, t in zip(paths, p_leaves, t_leaves):
        p, t = as_tensor(p), as_tensor(t)
        if tuple(p.shape) != tuple(t.shape) or p.dtype != t.dtype:
            raise ArgumentError(f"jvp: the tangent of {where} is {t.dtype.label}{list(t.shape)} but the "
                                f"primal is {p.dtype.label}{list(p.shape)}; they must match")
        if not p.dtype.is_floating_point:
            raise ArgumentError(f"jvp: {where} has dtype {p.dtype.label}; only floating point inputs")
        dual = primal(batching.lift(p, max(batching.current_level(), level_of(t))))
        dual._tangent = t
        duals.append(dual)
    out = fn(*pytree.unflatten(structure, duals))
    outs, out_structure = pytree.flatten(out, is_tracked)
    tangent_outs = [o._tangent if o._tangent is not None else _zeros_like(o) for o in outs]
    return (pytree.unflatten(out_structure, [primal(o) for o in outs]),
            pytree.unflatten(out_structure, tangent_outs))


def _tensor_backward(self, gradient=None, retain_graph: bool | None = None, create_graph: bool = False) -> None:
    """Accumulate d(self)/d(leaf) into every leaf's `.grad` (PyTorch semantics)."""
    backward([self], None if gradient is None else [gradient], retain_graph, create_graph)


_tensor_backward.__name__ = _tensor_backward.__qualname__ = "backward"
Tensor.backward = _tensor_backward      # installed here, beside the engine (tensors/ come first)
