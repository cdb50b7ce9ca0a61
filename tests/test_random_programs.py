"""Random programs: hypothesis draws DAGs of table ops on random broadcastable shapes and
the five dtypes, and each is compiled for the CPU and compared with the reference
interpreter (`backend="interp"`), values and, for float programs, gradients.

A program is built step by step, eagerly (the CPU dispatch key on NumPy), so that every
drawn step is valid: an op the eager kernels refuse (a dtype it does not take, a bad
shape) is drawn again.  The elementwise ops come from the op table (ops.yaml): every
elementwise op whose tensor arguments have no defaults; around them, reductions with
dim/keepdim, views, matmul, and the softmax/log_softmax/layer_norm compositions.

Comparing two float implementations of one program needs care where a tiny difference
becomes a large one: a comparison, floor or argmax of values that were rounded
differently.  So each value records whether it is *exact*: float inputs are multiples of
1/4, and values computed from exact ones by +, -, *, max, views, sums, ... stay exact
(the same bits on every backend) while they fit the mantissa; transcendentals and
divisions are not exact.  Discontinuous ops are drawn for exact operands only.  Inexact
results are compared with a tolerance scaled by the largest magnitude in their history.
A step on inexact operands is drawn only if nudging them by a few ulps of their scale moves
its result and its derivative by less than that tolerance (`_ill_conditioned`): a division
by a value that cancelled to about 0, or digamma at a pole's edge, would compare rounding
noise (one backend's FMA leaves 1e-7 where another leaves 0).

The default run takes ~30-60 s; TRACECOMP_SLOW=1 runs many more examples.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

import tracecomp as tc
from tracecomp.ops.table import default_table

SLOW = bool(os.environ.get("TRACECOMP_SLOW"))
DTYPES = ("float32", "float64", "int32", "int64", "bool")
MANTISSA = {"float32": 24, "float64": 53}
TOLERANCE = {"float32": 2e-4, "float64": 1e-9}
SEED = 20261125

# Elementwise ops from the table whose every tensor argument is required, by arity.
_TABLE = default_table()
_DISCONTINUOUS = {"sign", "floor", "ceil", "round", "eq", "ne", "lt", "le", "gt", "ge",
                  "logical_not", "logical_and", "logical_or", "relu", "abs", "maximum", "minimum",
                  "where", "clamp"}
_EXACT = {"neg", "abs", "sign", "square", "relu", "floor", "ceil", "round", "add", "sub", "mul",
          "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and",
          "logical_or", "where"}


def _elementwise_by_arity() -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for opdef in _TABLE.values():
        if opdef.kind != "elementwise" or not hasattr(tc, opdef.name) or "." in opdef.full_name:
            continue
        tensors = [a for a in opdef.schema.arguments if a.type.is_tensor]
        if all(a.default is None for a in tensors) and 1 <= len(tensors) <= 3:
            out.setdefault(len(tensors), []).append(opdef.name)
    return {k: sorted(v) for k, v in out.items()}


ELEMENTWISE = _elementwise_by_arity()
# Table ops that reduce over a `dim` argument, and the ones whose result is exact on exact input.
REDUCTIONS = sorted((o for o in _TABLE.values() if o.kind in ("reduction", "arg_reduction", "variance")
                     and any(a.name == "dim" for a in o.schema.arguments)), key=lambda o: o.full_name) \
    + [_TABLE["logsumexp"]]
_EXACT_REDUCTIONS = {"sum", "prod", "amax", "amin", "all", "any", "max", "min"}


@dataclass
class Val:
    """A value of the program: its eager result, and how far it can be trusted bit for bit."""
    t: tc.Tensor
    exact: bool                 # the same bits on every backend (see the module docstring)
    bits: int = 0               # exact floats: |value| * 2**frac < 2**bits
    frac: int = 0
    scale: float = 1.0          # the largest magnitude this value's history saw
    single: bool = False        # float32 somewhere in its history: float32 precision at best

    @property
    def dtype(self) -> str:
        return str(np.asarray(self.t).dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.t.shape)


# Inexact floats differ between backends by rounding; a step is drawn only if nudging them by
# about this much of their scale (8 ulps of float32, 64 of float64) moves its result by less
# than the tolerance.
NUDGE = {"float32": 2.0 ** -20, "float64": 2.0 ** -46}


def _nudged(args: list["Val"], which: list[int], step: float) -> list:
    """The operands, those in `which` moved by `step` times their scale."""
    return [v.t + step * v.scale if k in which else v.t for k, v in enumerate(args)]


def _ill_conditioned(fn: Callable, args: list["Val"], out: np.ndarray, scale: float, single: bool) -> bool:
    """Whether the step's result depends on its inexact operands more sharply than the
    comparison allows: a division by a value that cancelled to about 0, copysign by it or
    `all` of it, digamma near a pole.  The backends round differently, so such a step
    compares noise."""
    nudged = [k for k, v in enumerate(args) if not v.exact and v.dtype.startswith("float")]
    if not nudged:
        return False
    precision = "float32" if single else "float64"
    base = out.astype(np.float64)
    for sign in (1, -1):
        try:
            moved = np.asarray(fn(*_nudged(args, nudged, sign * NUDGE[precision])), dtype=np.float64)
        except tc.TracecompError:
            return True
        if moved.shape != base.shape:
            return True
        if out.dtype.kind != "f":               # bools and integers of inexact floats: exact or noise
            if not np.array_equal(moved, base):
                return True
            continue
        special = ~np.isfinite(base) | ~np.isfinite(moved)
        if not np.array_equal(base[special], moved[special], equal_nan=True):
            return True
        if np.any(np.abs(moved[~special] - base[~special]) > TOLERANCE[precision] * scale):
            return True
    return _slope_ill_conditioned(fn, args, nudged, NUDGE[precision], TOLERANCE[precision])


def _slope_ill_conditioned(fn: Callable, args: list["Val"], nudged: list[int], nudge: float, tol: float) -> bool:
    """The same for the step's derivative, which the gradient comparison multiplies in:
    digamma's at a pole's edge (trigamma) moves faster than digamma itself."""
    def slopes(step):
        g = tc.grad(lambda *a: fn(*a).to(tc.float64).sum(), argnums=tuple(nudged))(*_nudged(args, nudged, step))
        return [np.asarray(t, dtype=np.float64) for t in (g if isinstance(g, tuple) else (g,))]
    try:
        base = slopes(0.0)
        moved = [slopes(nudge), slopes(-nudge)]
    except (tc.TracecompError, TypeError, RuntimeError):
        return False                    # not differentiable here: nothing to compare
    for other in moved:
        for b, m in zip(base, other):
            finite = np.isfinite(b) & np.isfinite(m)
            size = np.abs(b[finite]).max(initial=1.0)
            if not np.array_equal(np.isfinite(b), np.isfinite(m)) or \
                    np.any(np.abs(m[finite] - b[finite]) > tol * size):
                return True
    return False


@dataclass
class Program:
    """Values in drawing order; each is an input (its position among the inputs) or a step
    (a function of earlier values, by id)."""
    inputs: list[np.ndarray] = field(default_factory=list)
    vals: list[Val] = field(default_factory=list)
    makes: list[int | tuple[Callable, list[int]]] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    def __call__(self, *tensors):
        env: list = []
        for make in self.makes:
            env.append(tensors[make] if isinstance(make, int) else make[0](*[env[i] for i in make[1]]))
        outs = tuple(env[i] for i in self.outputs)
        return outs[0] if len(outs) == 1 else outs


# ------------------------------------------------------------------- drawing programs

def _input_array(data, shape, dtype) -> np.ndarray:
    """Bools, small ints, or floats on the grid k/4, |k| <= 12, from a drawn seed."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1), label="seed"))
    if dtype == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    if dtype in ("int32", "int64"):
        return np.asarray(rng.integers(-5, 6, shape), dtype=dtype)
    return np.asarray(rng.integers(-12, 13, shape) / 4, dtype=dtype)


def _broadcast_shape(data, base: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to `base`: a suffix of it with some dims set to 1."""
    rank = data.draw(st.integers(0, len(base)))
    return tuple(1 if data.draw(st.booleans()) and d > 1 and data.draw(st.booleans()) else d
                 for d in base[len(base) - rank:])


def _add_input(p: Program, data, shape, dtype) -> int:
    a = _input_array(data, shape, dtype)
    p.inputs.append(a)
    exact_bits = {"float32": (4, 2), "float64": (4, 2)}.get(dtype, (0, 0))
    v = Val(tc.tensor(a), True, *exact_bits, scale=max(1.0, float(np.abs(a.astype(float)).max(initial=0))),
            single=dtype == "float32")
    p.vals.append(v)
    p.makes.append(len(p.inputs) - 1)
    p.text.append(f"%{len(p.vals) - 1} = input {dtype}{list(shape)}")
    return len(p.vals) - 1


def _exact_float(op: str, args: list[Val], dims_size: int = 1) -> tuple[bool, int, int]:
    """Whether an exact op on exact operands stays exact, and its bits/frac."""
    floats = [a for a in args if a.dtype.startswith("float")]
    if not floats:
        return True, 0, 0
    frac = max(a.frac for a in floats)
    bits = max(a.bits + frac - a.frac for a in floats)
    if op in ("mul", "square", "prod"):
        frac = sum(a.frac for a in floats) if op == "mul" else floats[0].frac * (2 if op == "square" else dims_size)
        bits = sum(a.bits for a in floats) + frac if op == "mul" else floats[0].bits * (2 if op == "square" else dims_size)
    elif op in ("add", "sub", "sum", "matmul"):
        bits += max(1, math.ceil(math.log2(max(dims_size, 2))))
    return bits <= MANTISSA.get(floats[0].dtype, 24) - 1, bits, frac


class Builder:
    """Draws the steps of one program, applying each eagerly to check it."""

    def __init__(self, data, allow_ints: bool = True, random_ops: bool = False):
        self.data, self.p = data, Program()
        self.allow_ints = allow_ints
        self.random_ops = random_ops          # tc.rand/tc.randn steps, some of them outputs
        self.randoms: list[int] = []

    def draw(self, strategy):
        return self.data.draw(strategy)

    def pick(self, pred=lambda v: True) -> int | None:
        """A value for an operand: the newest one half the time (long chains), else any."""
        ids = [i for i, v in enumerate(self.p.vals) if pred(v)]
        if not ids:
            return None
        return ids[-1] if self.draw(st.booleans()) else self.draw(st.sampled_from(ids))

    def apply(self, name: str, fn: Callable, ids: list[int], exact: bool, bits=0, frac=0) -> bool:
        """Run fn eagerly on the operands; keep the step if it is valid."""
        try:
            out = fn(*[self.p.vals[i].t for i in ids])
        except tc.TracecompError:
            return False
        if not isinstance(out, tc.Tensor) or 0 in out.shape:
            return False
        arr = np.asarray(out)
        if arr.dtype.kind == "f" and exact and not np.all(np.isfinite(arr)):
            exact = False
        scale = max([self.p.vals[i].scale for i in ids] +
                    [float(np.nanmax(np.abs(arr[np.isfinite(arr)]), initial=1.0)) if arr.dtype.kind == "f" else 1.0])
        single = arr.dtype == np.float32 or any(self.p.vals[i].single for i in ids)
        if _ill_conditioned(fn, [self.p.vals[i] for i in ids], arr, scale, single):
            return False
        self.p.vals.append(Val(out, exact, bits, frac, scale, single))
        self.p.makes.append((fn, ids))
        self.p.text.append(f"%{len(self.p.vals) - 1} = {name}({', '.join(f'%{i}' for i in ids)})"
                           f" -> {arr.dtype}{list(arr.shape)}{'' if exact else ' ~'}")
        return True

    # --- one step of each kind ------------------------------------------------------
    def elementwise(self) -> bool:
        arity = self.draw(st.sampled_from(sorted(ELEMENTWISE)))
        name = self.draw(st.sampled_from(ELEMENTWISE[arity]))
        need_exact = name in _DISCONTINUOUS
        ids = [self.pick(lambda v: v.exact or not need_exact) for _ in range(arity)]
        if None in ids:
            return False
        args = [self.p.vals[i] for i in ids]
        exact = name in _EXACT and all(a.exact for a in args)
        bits = frac = 0
        if exact:
            exact, bits, frac = _exact_float(name, args)
        return self.apply(name, getattr(tc, name), ids, exact, bits, frac)

    def random(self) -> bool:
        """tc.rand or tc.randn of an existing value's shape: fresh numbers on every call, so
        check_program seeds the generator alike before each run it compares."""
        shape = self.p.vals[self.pick()].shape
        dtype = self.draw(st.sampled_from([tc.float32, tc.float64]))
        draw = self.draw(st.sampled_from([tc.rand, tc.randn]))
        kept = self.apply(f"{draw.__name__} {dtype.label}", lambda: draw(shape, dtype=dtype), [], False)
        if kept:
            self.randoms.append(len(self.p.vals) - 1)
        return kept

    def scalar_operand(self) -> bool:
        i = self.pick()
        op = self.draw(st.sampled_from(["add", "mul", "sub", "truediv", "pow"]))
        c = self.draw(st.sampled_from([2, 0.5, -1.5, 3]))
        fn = {"add": lambda x: x + c, "mul": lambda x: x * c, "sub": lambda x: c - x,
              "truediv": lambda x: x / c, "pow": lambda x: x ** 2}[op]
        v = self.p.vals[i]
        exact = v.exact and op in ("add", "mul", "sub", "pow")
        bits = frac = 0
        if exact:
            const = Val(tc.tensor(np.float32(c)), True, 3, 1)
            exact, bits, frac = _exact_float("mul" if op in ("mul", "pow") else "add",
                                             [v, v if op == "pow" else const])
        return self.apply("pow 2" if op == "pow" else f"{op} {c}", fn, [i], exact, bits, frac)

    def reduction(self) -> bool:
        """A table op over `dim` (reductions, arg-reductions, var/std; logsumexp, a composite)."""
        i = self.pick(lambda v: len(v.shape) >= 1)
        if i is None:
            return False
        v = self.p.vals[i]
        opdef = self.draw(st.sampled_from(REDUCTIONS))
        arg_kind = opdef.kind == "arg_reduction"
        if arg_kind and not v.exact:
            return False
        dim = self.draw(st.integers(-len(v.shape), len(v.shape) - 1))
        keepdim = self.draw(st.booleans())
        result = self.draw(st.integers(0, len(opdef.schema.returns) - 1))

        def fn(x):
            out = getattr(tc, opdef.name)(x, dim, keepdim=keepdim)
            return out[result] if isinstance(out, tuple) else out
        exact = v.exact and (arg_kind or opdef.impl in _EXACT_REDUCTIONS)
        bits, frac = v.bits, v.frac
        if exact and opdef.impl in ("sum", "prod"):
            exact, bits, frac = _exact_float(opdef.impl, [v], v.shape[dim])
        return self.apply(f"{opdef.full_name}[{result}] dim={dim} keepdim={keepdim}", fn, [i], exact, bits, frac)

    def cat(self) -> bool:
        i = self.pick(lambda v: len(v.shape) >= 1)
        if i is None:
            return False
        v = self.p.vals[i]
        dim = self.draw(st.integers(0, len(v.shape) - 1))
        j = self.pick(lambda u: len(u.shape) == len(v.shape) and
                      all(a == b for d, (a, b) in enumerate(zip(u.shape, v.shape)) if d != dim))
        u = self.p.vals[j]
        exact = u.exact and v.exact
        bits, frac = max(u.bits, v.bits), max(u.frac, v.frac)
        return self.apply(f"cat dim={dim}", lambda a, b: tc.cat([a, b], dim), [i, j], exact, bits, frac)

    def view(self) -> bool:
        i = self.pick()
        v = self.p.vals[i]
        shape, rank = v.shape, len(v.shape)
        kind = self.draw(st.sampled_from(["reshape", "permute", "transpose", "slice", "expand",
                                          "unsqueeze", "squeeze", "select"]))
        if kind == "reshape":
            n = math.prod(shape)
            divisors = [d for d in range(1, n + 1) if n % d == 0]
            a = self.draw(st.sampled_from(divisors))
            target = self.draw(st.sampled_from([(n,), (a, n // a), (n // a, 1, a)]))
            fn = lambda x: x.reshape(*target)                                          # noqa: E731
        elif kind == "permute" and rank >= 2:
            dims = self.draw(st.permutations(range(rank)))
            fn = lambda x: x.permute(*dims)                                            # noqa: E731
        elif kind == "transpose" and rank >= 2:
            a, b = self.draw(st.integers(0, rank - 1)), self.draw(st.integers(0, rank - 1))
            fn = lambda x: x.transpose(a, b)                                           # noqa: E731
        elif kind == "slice" and rank >= 1:
            d = self.draw(st.integers(0, rank - 1))
            start = self.draw(st.integers(0, shape[d] - 1))
            step = self.draw(st.integers(1, 2))
            index = (slice(None),) * d + (slice(start, None, step),)
            fn = lambda x: x[index]                                                    # noqa: E731
        elif kind == "select" and rank >= 1:
            d = self.draw(st.integers(0, rank - 1))
            at = self.draw(st.integers(-shape[d], shape[d] - 1))
            fn = lambda x: x.select(d, at)                                             # noqa: E731
        elif kind == "expand":
            lead = self.draw(st.integers(1, 3))
            target = (lead,) + tuple(self.draw(st.integers(1, 3)) if s == 1 else s for s in shape)
            fn = lambda x: x.expand(*target)                                           # noqa: E731
        elif kind == "unsqueeze":
            d = self.draw(st.integers(-rank - 1, rank))
            fn = lambda x: x.unsqueeze(d)                                              # noqa: E731
        elif kind == "squeeze" and 1 in shape:
            d = shape.index(1)
            fn = lambda x: x.squeeze(d)                                                # noqa: E731
        else:
            return False
        return self.apply(kind, fn, [i], v.exact, v.bits, v.frac)

    def matmul(self) -> bool:
        i = self.pick(lambda v: v.dtype.startswith("float") and len(v.shape) >= 1)
        if i is None:
            return False
        v = self.p.vals[i]
        m = self.draw(st.integers(1, 6))
        w = _add_input(self.p, self.data, (v.shape[-1], m), v.dtype)
        exact, bits, frac = _exact_float("mul", [v, self.p.vals[w]]) if v.exact else (False, 0, 0)
        if exact:
            exact, bits, frac = _exact_float("sum", [Val(v.t, True, bits, frac)], v.shape[-1])
        return self.apply("matmul", lambda x, w: x @ w, [i, w], exact, bits, frac)

    def composition(self) -> bool:
        i = self.pick(lambda v: v.dtype.startswith("float") and len(v.shape) >= 1)
        if i is None:
            return False
        v = self.p.vals[i]
        kind = self.draw(st.sampled_from(["softmax", "log_softmax", "layer_norm"]))
        if kind == "layer_norm":
            n = v.shape[-1]
            w = _add_input(self.p, self.data, (n,), v.dtype)
            b = _add_input(self.p, self.data, (n,), v.dtype)
            return self.apply(kind, lambda x, w, b: tc.layer_norm(x, [n], w, b), [i, w, b], False)
        dim = self.draw(st.integers(-len(v.shape), len(v.shape) - 1))
        return self.apply(f"{kind} dim={dim}", lambda x: getattr(tc, kind)(x, dim), [i], False)

    # --- a whole program -------------------------------------------------------------
    def program(self, max_steps: int) -> Program:
        sizes = st.sampled_from([1, 2, 3, 4, 5, 7, 17, 33])      # odd sizes leave vector remainders
        base = tuple(self.draw(st.lists(sizes, min_size=1, max_size=3)))
        dtypes = DTYPES if self.allow_ints else ("float32", "float64")
        main_dtype = self.draw(st.sampled_from(dtypes))
        for k in range(self.draw(st.integers(1, 3))):
            dtype = main_dtype if k == 0 or self.draw(st.booleans()) else self.draw(st.sampled_from(dtypes))
            _add_input(self.p, self.data, _broadcast_shape(self.data, base) if k else base, dtype)
        steps = self.draw(st.integers(3, max_steps))
        kinds = [self.elementwise, self.elementwise, self.scalar_operand, self.reduction, self.view,
                 self.matmul, self.composition, self.cat] + [self.random] * (2 * self.random_ops)
        done = attempts = 0
        while done < steps and attempts < 6 * steps:
            attempts += 1
            done += self.draw(st.sampled_from(kinds))()
        last = len(self.p.vals) - 1
        extra = self.draw(st.lists(st.integers(0, last), max_size=2))
        if self.randoms:              # a random value returned as it is, not only used
            extra.append(self.draw(st.sampled_from(self.randoms)))
        self.p.outputs = list(dict.fromkeys([last] + extra))
        return self.p


# ------------------------------------------------------------------- running and comparing

def _as_list(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _compare(got, want, vals: list[Val], what: str, tol: float | None = None) -> None:
    """Exact values bit for bit (NaNs alike); others within `tol` (by default their dtype's)
    relative, and `tol` times the magnitudes they came from absolute."""
    for k, (g, w, v) in enumerate(zip(got, want, vals)):
        g, w = np.asarray(g), np.asarray(w)
        assert (g.dtype, g.shape) == (w.dtype, w.shape), f"{what} {k}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
        if w.dtype.kind == "f" and not v.exact:
            t = tol or TOLERANCE["float32" if v.single else str(w.dtype)]
            np.testing.assert_allclose(g, w, rtol=t, atol=t * v.scale, equal_nan=True, err_msg=f"{what} {k}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{what} {k}")


def _finite_abs(t) -> np.ndarray:
    """|t| of the finite elements (magnitudes for tolerances; an inf would make them vacuous)."""
    a = np.abs(np.asarray(t, dtype=np.float64))
    return a[np.isfinite(a)]


def check_program(p: Program) -> None:
    """Compiled against interpreted: the outputs, then the gradient of the sum of the float
    outputs with respect to the float inputs."""
    note(f"program (outputs {p.outputs}):\n" + "\n".join(p.text))

    def fn(*xs):
        return p(*xs)

    def run(f):
        tc.manual_seed(SEED)          # random ops draw the same numbers in both runs
        return f(*p.inputs)
    got = _as_list(run(tc.trace(fn)))
    want = _as_list(run(tc.trace(fn, backend="interp")))
    _compare(got, want, [p.vals[i] for i in p.outputs], "output")
    floats = [k for k, a in enumerate(p.inputs) if a.dtype.kind == "f"]
    outs = [p.vals[i] for i in p.outputs if p.vals[i].dtype.startswith("float")]
    if not floats or not outs:
        return

    def loss(*xs):
        total = None
        for o in _as_list(fn(*xs)):
            if o.dtype.is_floating_point:
                total = o.to(tc.float64).sum() if total is None else total + o.to(tc.float64).sum()
        return total
    grad = tc.value_and_grad(loss, argnums=tuple(floats))
    try:
        want_loss, want_grads = run(tc.trace(grad, backend="interp"))
    except tc.TracecompError as e:      # e.g. a derivative marked not_implemented
        with pytest.raises(type(e)):
            run(tc.trace(grad))
        return
    got_loss, got_grads = run(tc.trace(grad))
    # the program's precision bounds the loss and gradients, whatever dtype holds them
    tol = TOLERANCE["float32" if any(v.dtype == "float32" for v in p.vals) else "float64"]
    history = max(v.scale for v in p.vals)
    total = sum(_finite_abs(v.t).sum() for v in outs)
    exact = all(v.exact for v in p.vals)
    _compare([got_loss], [want_loss], [Val(None, exact, scale=max(history, total))], "loss", tol)
    gvals = [Val(None, False, scale=max(history, _finite_abs(g).max(initial=1.0)))
             for g in _as_list(want_grads)]
    _compare(_as_list(got_grads), _as_list(want_grads), gvals, "gradient", tol)


# Shrinking recompiles every candidate (seconds each): only in the slow profile; the default
# run reports the failing program as drawn (note() prints it).
PHASES = tuple(Phase) if SLOW else (Phase.explicit, Phase.reuse, Phase.generate)
PROFILE = dict(max_examples=1500 if SLOW else 300, deadline=None, derandomize=not SLOW, phases=PHASES,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])


@settings(**PROFILE)
@given(st.data())
def test_random_programs_match_the_interpreter(data):
    check_program(Builder(data).program(max_steps=8))


@settings(**{**PROFILE, "max_examples": 1000 if SLOW else 150})
@given(st.data())
def test_random_float_programs_and_their_gradients_match_the_interpreter(data):
    check_program(Builder(data, allow_ints=False).program(max_steps=6))


@settings(**{**PROFILE, "max_examples": 400 if SLOW else 60})
@given(st.data())
def test_random_programs_with_random_ops_as_outputs(data):
    """tc.rand/tc.randn values returned by the compiled function (and used by other steps)."""
    builder = Builder(data, random_ops=True)
    p = builder.program(max_steps=6)
    check_program(p)


@pytest.mark.slow
@pytest.mark.skipif(not SLOW, reason="the large profile: set TRACECOMP_SLOW=1")
@settings(**{**PROFILE, "max_examples": 1000, "derandomize": False, "phases": tuple(Phase)})
@given(st.data())
def test_random_programs_many(data):
    check_program(Builder(data).program(max_steps=8))


def test_what_random_programs_found_a_splat_output_read_by_a_matmul():
    """d/da of cat([a, b @ c]).sum() is a splat constant of ones, returned and read by the
    backward matmuls; the matmul gave it a buffer while emitting, which stayed a temp, so the
    workspace planner placed another temp over it and the returned gradient was wrong."""
    rng = np.random.default_rng(0)
    a, b, c = rng.standard_normal((7, 17, 2)), rng.standard_normal((7, 17, 1)), rng.standard_normal((1, 2))
    fn = tc.grad(lambda a, b, c: tc.cat([a, b @ c], 0).sum(), argnums=(0, 1, 2))
    for got, want in zip(tc.trace(fn)(a, b, c), tc.trace(fn, backend="interp")(a, b, c)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(tc.trace(fn)(a, b, c)[0]), np.ones_like(a))


def test_what_random_programs_found_a_row_reduction_over_a_slice_of_its_rows():
    """layer_norm's backward sums each row of the gradient; the split that hands cat's inputs
    their slices absorbed that sum into the kernel of the first slice (rows 0-4 of 6), and
    the second slice read row 5 of a buffer nobody wrote."""
    rng = np.random.default_rng(0)
    x0, x2 = rng.standard_normal((5, 5)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    g = rng.standard_normal((6, 5)).astype(np.float32)

    def loss(x0, x2, g):
        return (tc.nn.functional.layer_norm(tc.cat([x0, x2.unsqueeze(0)], 0), (5,)) * g).sum()
    f = tc.grad(loss, argnums=(0, 1))
    got, want = ([np.asarray(v) for v in tc.trace(f, backend=backend)(x0, x2, g)] for backend in ("cpu", "interp"))
    for gv, wv in zip(got, want):
        np.testing.assert_allclose(gv, wv, rtol=1e-5, atol=1e-5)


def test_what_random_programs_found_bool_abs_and_pow():
    """abs of a bool and bool ** bool had no lowering (the loop IR has no bool abs/pow)."""
    from tracecomp.lower.llvm.math.functions import ACCURACY
    a, b = np.array([False, False, True, True]), np.array([False, True, False, True])
    fn = lambda a, b: (tc.abs(tc.abs(a)), tc.pow(a, b), tc.cos(tc.pow(a, a)))      # noqa: E731
    got, want = ([np.asarray(v) for v in tc.trace(fn, backend=backend)(a, b)] for backend in ("cpu", "interp"))
    for g, w in zip(got[:2], want[:2]):
        np.testing.assert_array_equal(g, w)
    # the interpreter's cos is NumPy's (correctly rounded here); the compiled one is within its bound
    np.testing.assert_array_max_ulp(got[2], want[2], maxulp=ACCURACY["cos"][0])
