"""Graphs with tc.scan, tc.while_loop and tc.cond, built by hand (regions traced from small
Python functions), with inputs: the cases the compiled loops are checked on against the
interpreter (runtime/interpreter.py) in tests/lower, tests/runtime and tests/aot."""
from __future__ import annotations

import numpy as np

import tracecomp as tc
from tracecomp.core.types import TensorType
from tracecomp.ir import Graph
from tracecomp.ir.verifier import verify


def T(shape, dtype=tc.float32) -> TensorType:
    return TensorType(tuple(shape), dtype)


def region(fn, *types: TensorType) -> Graph:
    """The optimized graph tc.trace records for `fn` at `types` (its inputs are the block
    arguments, its outputs the yields)."""
    args = [np.zeros(t.shape, t.dtype.np) for t in types]
    g = tc.trace(fn).lower(*args).optimized
    assert [v.type for v in g.inputs] == list(types)
    return g


def inline(target: Graph, g: Graph, values: list) -> list:
    """`g`'s ops copied into `target` on `values`; returns its outputs there."""
    env = dict(zip(g.inputs, values))
    for op in g.ops:
        new = target.add_op(op.name, [env[v] for v in op.operands], op.attrs, [r.type for r in op.results],
                            op.loc, op.regions)
        env.update(zip(op.results, new.results))
    return [env[v] for v in g.outputs]


def scan(g: Graph, body: Graph, consts, init, xs, length: int, reverse: bool = False):
    ys = [v.type for v in body.outputs[len(init):]]
    results = [v.type for v in init] + [T((length, *t.shape), t.dtype) for t in ys]
    return g.add_op("tc.scan", list(consts) + list(init) + list(xs),
                    {"length": length, "num_consts": len(consts), "num_carry": len(init), "reverse": reverse,
                     "remat": False},
                    results, None, regions=[body]).results


def while_loop(g: Graph, cond: Graph, body: Graph, consts, init):
    return g.add_op("tc.while_loop", list(consts) + list(init), {"num_consts": len(consts)},
                    [v.type for v in init], None, regions=[cond, body]).results


def if_(g: Graph, pred, then: Graph, orelse: Graph, operands):
    return g.add_op("tc.cond", [pred] + list(operands), {}, [v.type for v in then.outputs], None,
                    regions=[then, orelse]).results


def rand(t: TensorType, rng) -> np.ndarray:
    if t.dtype == tc.bool:
        return rng.random(t.shape) < 0.5
    if not t.dtype.is_floating_point:
        return rng.integers(-5, 5, t.shape).astype(t.dtype.np)
    return rng.standard_normal(t.shape).astype(t.dtype.np)


# ------------------------------------------------------------------------- the cases

def scan_tanh(length=5, reverse=False, dtype=tc.float32):
    """c = tanh(c * a + x[i]); ys: c * 2."""
    s = T((3, 4), dtype)
    body = region(lambda a, c, x: ((c * a + x).tanh(), c * 2), s, s, s)
    g = Graph("main", [s, s, T((length, 3, 4), dtype)])
    a, c0, xs = g.inputs
    g.outputs = list(scan(g, body, [a], [c0], [xs], length, reverse))
    return g


def scan_carry_only(length=7, dtype=tc.float64):
    s = T((4,), dtype)
    body = region(lambda a, c: (c * a + 1).tanh(), s, s)
    g = Graph("main", [s, s])
    g.outputs = list(scan(g, body, [g.inputs[0]], [g.inputs[1]], [], length))
    return g


def scan_mixed_carries(length=4):
    """Carries of three shapes and dtypes, two xs, three ys (one a reduction)."""
    a, n, v = T((2, 3)), T((), tc.int64), T((5,), tc.float64)
    body = region(lambda a, n, v, x, w: (a + x, n + 1, v * 0.5 + w, a.sum(), n * 2, v + 1),
                  a, n, v, T((2, 3)), T((5,), tc.float64))
    g = Graph("main", [a, n, v, T((length, 2, 3)), T((length, 5), tc.float64)])
    g.outputs = list(scan(g, body, [], g.inputs[:3], g.inputs[3:], length))
    return g


def scan_passthrough(length=3):
    """Yields that are not fresh values: an unchanged carry, a const, an x row, one value twice."""
    s = T((2, 2))
    body = region(lambda k, c, d, x: (d, c, k, x, c, c), s, s, s, s)
    g = Graph("main", [s, s, s, T((length, 2, 2))])
    g.outputs = list(scan(g, body, g.inputs[:1], g.inputs[1:3], g.inputs[3:], length))
    return g


def scan_nested(outer=3, inner=4):
    """A scan whose body runs a scan over each row of its x (a (inner, 3) block)."""
    s = T((3,))
    inner_body = region(lambda c, x: ((c + x) * 0.5, c.sum()), s, s)
    body = Graph("body", [s, T((inner, 3))])
    c, x = body.inputs
    c2, ys = scan(body, inner_body, [], [c], [x], inner)
    body.outputs = [c2, ys]
    g = Graph("main", [s, T((outer, inner, 3))])
    g.outputs = list(scan(g, body, [], [g.inputs[0]], [g.inputs[1]], outer))
    return g


def while_counter():
    """i, acc = 0, x; while i < n: i, acc = i + 1, acc * 1.5 + 1 (n an int64 input)."""
    i, acc, n = T((), tc.int64), T((4,)), T((), tc.int64)
    cond = region(lambda n, i, acc: i < n, n, i, acc)
    body = region(lambda n, i, acc: (i + 1, acc * 1.5 + 1), n, i, acc)
    g = Graph("main", [n, i, acc])
    g.outputs = list(while_loop(g, cond, body, g.inputs[:1], g.inputs[1:]))
    return g


def while_newton(dtype=tc.float64):
    """x = a; while max|x*x - a| > tol: x = (x + a / x) / 2  (square roots of a > 0)."""
    s = T((6,), dtype)
    tol = 1e-10 if dtype == tc.float64 else 1e-4
    cond = region(lambda a, x: (x * x - a).abs().amax() > tol, s, s)
    body = region(lambda a, x: (x + a / x) * 0.5, s, s)
    g = Graph("main", [s, s])
    g.outputs = list(while_loop(g, cond, body, g.inputs[:1], g.inputs[1:]))
    return g


def while_bool_carry():
    """A cond that yields a carry itself: (go, x) -> (x.sum() < 100, x * 2)."""
    go, x = T((), tc.bool), T((3,))
    cond = region(lambda go, x: go, go, x)
    body = region(lambda go, x: ((x * 2).sum() < 100, x * 2), go, x)
    g = Graph("main", [go, x])
    g.outputs = list(while_loop(g, cond, body, [], g.inputs))
    return g


def cond_simple():
    s = T((3, 2))
    then = region(lambda x, y: (x * 2 + y, y), s, s)
    orelse = region(lambda x, y: (x - 1, x), s, s)
    g = Graph("main", [T((), tc.bool), s, s])
    g.outputs = list(if_(g, g.inputs[0], then, orelse, g.inputs[1:]))
    return g


def cond_in_scan(length=6):
    """c = cond(sum(c) > 0, c - x, c + x); ys: c * 2."""
    s = T((4,))
    body = Graph("body", [s, s])
    c, x = body.inputs
    pred, = inline(body, region(lambda c: c.sum() > 0, s), [c])
    new, = if_(body, pred, region(lambda c, x: c - x, s, s), region(lambda c, x: c + x, s, s), [c, x])
    y, = inline(body, region(lambda c: c * 2, s), [new])
    body.outputs = [new, y]
    g = Graph("main", [s, T((length, 4))])
    g.outputs = list(scan(g, body, [], [g.inputs[0]], [g.inputs[1]], length))
    return g


def scan_with_while(length=4):
    """A while loop in a scan body: c = (while sum(c) < sum(x) + 20: c = c * 1.5 + 1); ys: sum(c)."""
    s = T((3,))
    body = Graph("body", [s, s])
    c, x = body.inputs
    cond = region(lambda x, c: c.sum() < x.sum() + 20, s, s)
    step = region(lambda x, c: c * 1.5 + 1, s, s)
    c2, = while_loop(body, cond, step, [x], [c])
    y, = inline(body, region(lambda c: c.sum(), s), [c2])
    body.outputs = [c2, y]
    g = Graph("main", [s, T((length, 3))])
    g.outputs = list(scan(g, body, [], [g.inputs[0]], [g.inputs[1]], length))
    return g


def while_with_scan_in_cond():
    """A cond region that runs a scan: while sum(scan of c -> c * 0.5 + 1, 3 steps) < 100: c = c * 2 + 1."""
    s = T((3,))
    cond = Graph("cond", [s])
    c, = cond.inputs
    last, = scan(cond, region(lambda c: c * 0.5 + 1, s), [], [c], [], 3)
    go, = inline(cond, region(lambda c: c.sum() < 100, s), [last])
    cond.outputs = [go]
    g = Graph("main", [s])
    g.outputs = list(while_loop(g, cond, region(lambda c: c * 2 + 1, s), [], g.inputs))
    return g


def scan_invariant_carry(length=5):
    """Carries (c, k): the body yields k unchanged (an invariant carry): (c * k + x, k); ys: c."""
    s = T((2, 3))
    body = region(lambda c, k, x: (c * k + x, k, c), s, s, s)
    g = Graph("main", [s, s, T((length, 2, 3))])
    g.outputs = list(scan(g, body, [], g.inputs[:2], g.inputs[2:], length))
    return g


def while_invariant_bound():
    """tc.fori_loop's shape with a tensor bound: (i, hi, v) while i < hi: (i + 1, hi, v * 1.5 + 1)."""
    i, v = T((), tc.int64), T((4,))
    cond = region(lambda i, hi, v: i < hi, i, i, v)
    body = region(lambda i, hi, v: (i + 1, hi, v * 1.5 + 1), i, i, v)
    g = Graph("main", [i, i, v])
    g.outputs = list(while_loop(g, cond, body, [], g.inputs))
    return g


def inputs_for(g: Graph, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rand(v.type, rng) for v in g.inputs]


def checked(g: Graph) -> Graph:
    verify(g)
    return g


def cases():
    """(id, graph, inputs) for every case above, verified."""
    out = []
    for n in (0, 1, 2, 5):
        out.append((f"scan_tanh_{n}", scan_tanh(n), None))
    out.append(("scan_tanh_reverse", scan_tanh(4, reverse=True), None))
    out.append(("scan_tanh_f64", scan_tanh(3, dtype=tc.float64), None))
    out.append(("scan_carry_only", scan_carry_only(), None))
    out.append(("scan_mixed_carries", scan_mixed_carries(), None))
    out.append(("scan_passthrough", scan_passthrough(), None))
    out.append(("scan_nested", scan_nested(), None))
    g = while_counter()
    for n in (0, 1, 6):
        out.append((f"while_counter_{n}", g, [np.int64(n), np.int64(0), np.arange(4, dtype=np.float32)]))
    for dtype in (tc.float64, tc.float32):
        a = np.array([2.0, 9.0, 0.25, 1.0, 100.0, 3.0], dtype.np)
        out.append((f"while_newton_{dtype.label}", while_newton(dtype), [a, a.copy()]))
    g = while_bool_carry()
    for go in (False, True):
        out.append((f"while_bool_carry_{go}", g, [np.bool_(go), np.ones(3, np.float32)]))
    g = cond_simple()
    for pred in (False, True):
        out.append((f"cond_{pred}", g, [np.bool_(pred)] + inputs_for(g)[1:]))
    out.append(("cond_in_scan", cond_in_scan(), None))
    out.append(("scan_with_while", scan_with_while(), None))
    for n in (0, 1, 4):
        out.append((f"scan_invariant_carry_{n}", scan_invariant_carry(n), None))
    g = while_invariant_bound()
    for n in (0, 1, 5):
        out.append((f"while_invariant_bound_{n}", g, [np.int64(0), np.int64(n), np.arange(4, dtype=np.float32)]))
    out.append(("while_with_scan_in_cond", while_with_scan_in_cond(), None))
    return [(name, checked(g), ins if ins is not None else inputs_for(g)) for name, g, ins in out]


def assert_close(got, want):
    assert len(got) == len(want)
    for x, w in zip(got, want):
        x, w = np.asarray(x), np.asarray(w)
        assert x.shape == w.shape and x.dtype == w.dtype
        tol = 1e-5 if w.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(x, w, rtol=tol, atol=tol)
