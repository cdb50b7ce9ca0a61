"""The passes inside regions (fold, simplify, CSE, DCE) and the control pass's rewrites of
tc.scan, tc.while_loop and tc.cond: each checked by the verifier and against the
interpreter on random inputs, before and after."""
from __future__ import annotations

import functools

import numpy as np
import pytest

from region_graphs import (BOOL, GRAPHS, I64, T, branch, cond, const, inputs_for, op, region, rnn_scan, scan,
                           while_loop)
from tracecomp.ir import Graph
from tracecomp.ir.passes import control, cse, dce, fold_constants, simplify
from tracecomp.ir.parser import parse_graph
from tracecomp.ir.printer import print_graph
from tracecomp.ir.verifier import verify
from tracecomp.ops.numpy_kernels import run as numpy_run
from tracecomp.runtime.interpreter import run_graph
from tracecomp.transforms.pipeline import optimize, pipeline

fold = functools.partial(fold_constants, evaluate=numpy_run)


def same_results(before: Graph, after: Graph, trials: int = 3) -> None:
    """`after` verifies and computes what `before` does on random inputs."""
    verify(before)
    verify(after)
    for seed in range(trials):
        inputs = inputs_for(before, np.random.default_rng(seed))
        want, got = run_graph(before, inputs), run_graph(after, inputs)
        assert len(want) == len(got)
        for w, g in zip(want, got):
            assert w.dtype == g.dtype and w.shape == g.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def names(g: Graph) -> list[str]:
    return [o.name for o in g.ops]


def the(g: Graph, name: str):
    ops = [o for o in g.ops if o.name == name]
    assert len(ops) == 1, names(g)
    return ops[0]


# ---------------------------------------------------------------- every pass, every graph

PASSES = {"fold": fold, "simplify": simplify, "cse": cse, "dce": dce, "control": control}


@pytest.mark.parametrize("make", GRAPHS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", PASSES)
def test_pass_keeps_meaning(make, name):
    g = make()
    same_results(g, PASSES[name](g))


@pytest.mark.parametrize("make", GRAPHS, ids=lambda f: f.__name__)
def test_pipeline_keeps_meaning(make):
    g = make()
    same_results(g, pipeline(verify_each=True).run(g))
    same_results(g, optimize(g))


def test_pipeline_runs_control_before_cse_and_dce():
    assert pipeline().names == ["decompose", "widen_half", "fold", "simplify", "summed_products", "narrow_products", "control", "cse", "dce"]


# ---------------------------------------------------------------- fold, simplify, cse, dce inside

def body_with_waste() -> Graph:
    """A scan body holding a constant expression, x * 1, a repeated exp, an unused op, and
    a constant equal to one outside."""
    g = Graph("waste", [T(4), T(3, 4)])
    h0, xs = g.inputs
    outside_two = const(g, 2.0)
    body = region("body", T(4), T(4))
    h, x = body.inputs
    six = op(body, "tc.mul", [const(body, 2.0), const(body, 3.0)])
    one = const(body, 1.0)
    x1 = op(body, "tc.mul", [x, one])
    e1, e2 = op(body, "tc.exp", [x1.result]), op(body, "tc.exp", [x1.result])
    op(body, "tc.neg", [h])                                            # dead
    s = op(body, "tc.add", [e1.result, e2.result], alpha=1)
    hn = op(body, "tc.add", [op(body, "tc.mul", [h, six.result]).result, s.result], alpha=1)
    body.outputs = [hn.result, s.result]
    loop = scan(g, [], [h0], [xs], body)
    g.outputs = [op(g, "tc.mul", [loop.results[0], outside_two]).result, loop.results[1]]
    return g


def test_fold_inside_a_body():
    g = body_with_waste()
    out = fold(g)
    same_results(g, out)
    body = the(out, "tc.scan").regions[0]
    six = body.ops[2]
    assert six.name == "tc.constant" and float(six.attrs["value"]) == 6.0


def test_fold_leaves_a_loop_of_constants_alone():
    g = Graph("f")
    body = region("body", T(2), T(2))
    body.outputs = [op(body, "tc.add", list(body.inputs), alpha=1).result] * 2
    loop = scan(g, [], [const(g, [1.0, 2.0])], [const(g, np.ones((3, 2)))], body)
    g.outputs = list(loop.results)
    out = fold(g)
    assert "tc.scan" in names(out)
    same_results(g, out)


def test_simplify_inside_a_body():
    g = body_with_waste()
    out = simplify(g)
    same_results(g, out)
    body = the(out, "tc.scan").regions[0]
    exps = [o for o in body.ops if o.name == "tc.exp"]
    assert all(o.operands[0] is body.inputs[1] for o in exps)     # exp(x * 1) -> exp(x)


def test_cse_inside_a_body_and_never_across_it():
    g = body_with_waste()
    out = cse(g)
    same_results(g, out)
    body = the(out, "tc.scan").regions[0]
    assert names(body).count("tc.exp") == 1
    # the body's 2.0 equals the one outside, yet each graph keeps its own
    assert sum(o.name == "tc.constant" and float(o.attrs["value"]) == 2.0 for o in out.ops) == 1
    assert sum(o.name == "tc.constant" and float(o.attrs["value"]) == 2.0 for o in body.ops) == 1


def test_cse_merges_inside_each_branch_separately():
    g = Graph("f", [T(BOOL), T(4)])
    p, x = g.inputs
    branches = []
    for name in ("then", "else"):
        b = region(name, T(4))
        a1, a2 = op(b, "tc.exp", [b.inputs[0]]), op(b, "tc.exp", [b.inputs[0]])
        b.outputs = [op(b, "tc.add", [a1.result, a2.result], alpha=1).result]
        branches.append(b)
    g.outputs = [cond(g, p, [x], *branches).result, op(g, "tc.exp", [x]).result]
    out = cse(g)
    same_results(g, out)
    assert [names(b).count("tc.exp") for b in the(out, "tc.cond").regions] == [1, 1]


def test_dce_inside_a_body_keeps_outputs_and_used_loops():
    g = body_with_waste()
    out = dce(g)
    same_results(g, out)
    body = the(out, "tc.scan").regions[0]
    assert "tc.neg" not in names(body)
    assert len(body.outputs) == 2                       # the ys stay, used or not


def test_dce_drops_an_unused_loop_and_keeps_a_used_one():
    g = rnn_scan()
    g.outputs = [g.inputs[2]]
    assert names(dce(g)) == []
    g = rnn_scan()
    g.outputs = [g.ops[0].results[1]]
    out = dce(g)
    assert names(out) == ["tc.scan"] and len(out.ops[0].regions[0].outputs) == 2
    same_results(g, out)


# ---------------------------------------------------------------- cond with a constant predicate

@pytest.mark.parametrize("value", [True, False])
def test_constant_predicate_inlines_the_branch(value):
    g = branch()
    g.ops[3].operands[0] = const(g, value, np.bool_)
    g.ops.insert(0, g.ops.pop())              # the constant first, where it dominates
    out = control(g)
    same_results(g, out)
    assert "tc.cond" not in names(out)
    assert ("tc.exp" in names(out)) == value and ("tc.neg" in names(out)) != value


def test_constant_predicate_inside_a_body_and_folded_predicate():
    """fold makes the predicate a constant (2 > 1), control then inlines the branch, inside a
    scan body."""
    g = Graph("f", [T(4), T(3, 4)])
    body = region("body", T(4), T(4))
    h, x = body.inputs
    p = op(body, "tc.gt", [const(body, 2.0), const(body, 1.0)])
    then, other = region("then", T(4), T(4)), region("else", T(4), T(4))
    then.outputs = [op(then, "tc.add", list(then.inputs), alpha=1).result]
    other.outputs = [other.inputs[0]]
    c = cond(body, p.result, [h, x], then, other)
    body.outputs = [c.result, c.result]
    g.outputs = list(scan(g, [], [g.inputs[0]], [g.inputs[1]], body).results)
    out = control(fold(g))
    same_results(g, out)
    assert names(the(out, "tc.scan").regions[0])[-1] == "tc.add"
    assert "tc.cond" not in names(the(out, "tc.scan").regions[0])


def test_cond_drops_unused_operands_and_results_and_merges_repeats():
    g = Graph("f", [T(BOOL), T(4), T(4)])
    p, x, y = g.inputs
    branches = []
    for name in ("then", "else"):
        b = region(name, T(4), T(4), T(4))
        a, a2, unused = b.inputs
        b.outputs = [op(b, "tc.mul", [a, a2] if name == "then" else [a2, a2]).result, a]
        branches.append(b)
    c = cond(g, p, [x, x, y], *branches)
    g.outputs = [c.results[0]]
    out = control(g)
    same_results(g, out)
    new = the(out, "tc.cond")
    assert new.operands == [out.inputs[0], out.inputs[1]] and len(new.results) == 1
    assert all(len(b.inputs) == 1 and len(b.outputs) == 1 for b in new.regions)


# ---------------------------------------------------------------- zero-length scan

def test_zero_length_scan_folds_to_init_and_empty_ys():
    g = Graph("f", [T(4), T(0, 2, 3)])
    body = region("body", T(4), T(2, 3))
    h, x = body.inputs
    body.outputs = [op(body, "tc.exp", [h]).result, op(body, "tc.neg", [x]).result, h]
    g.outputs = list(scan(g, [], [g.inputs[0]], [g.inputs[1]], body).results)
    out = control(g)
    same_results(g, out)
    assert names(out) == ["tc.constant", "tc.constant"]
    assert out.outputs[0] is out.inputs[0]
    assert [v.type for v in out.outputs[1:]] == [T(0, 2, 3), T(0, 4)]


# ---------------------------------------------------------------- dead carries and ys

def two_carries(t_feeds_s: bool) -> Graph:
    """s' = s + x (+ t when t_feeds_s), t' = t * x + s; ys: s', t'; only s and ys[0] used."""
    g = Graph("f", [T(4), T(4), T(5, 4)])
    body = region("body", T(4), T(4), T(4))
    s, t, x = body.inputs
    s2 = op(body, "tc.add", [s, x], alpha=1)
    if t_feeds_s:
        s2 = op(body, "tc.add", [s2.result, t], alpha=1)
    t2 = op(body, "tc.add", [op(body, "tc.mul", [t, x]).result, s], alpha=1)
    body.outputs = [s2.result, t2.result, s2.result, t2.result]
    loop = scan(g, [], g.inputs[:2], [g.inputs[2]], body)
    g.outputs = [loop.results[0], loop.results[2]]
    return g


def test_unused_carry_and_y_are_dropped():
    g = two_carries(t_feeds_s=False)
    out = control(g)
    same_results(g, out)
    loop = the(out, "tc.scan")
    assert loop.attrs["num_carry"] == 1 and len(loop.results) == 2
    assert names(loop.regions[0]) == ["tc.add"]
    assert loop.operands == [out.inputs[0], out.inputs[2]]


def test_unused_carry_that_a_kept_carry_reads_stays():
    g = two_carries(t_feeds_s=True)
    out = control(g)
    same_results(g, out)
    loop = the(out, "tc.scan")
    assert loop.attrs["num_carry"] == 2 and len(loop.results) == 3      # ys[1] went


def test_all_results_unused_drops_the_loop():
    g = two_carries(t_feeds_s=True)
    g.outputs = [g.inputs[0]]
    assert names(control(g)) == []


def counting_while() -> Graph:
    """while i < n: (i + 1, acc + x, junk * 2, late + acc): only acc used."""
    g = Graph("f", [T(I64), T(4), T(4), T(4)])
    n, x, junk0, late0 = g.inputs
    zero = const(g, 0, np.int64)
    carry = [T(I64), T(4), T(4), T(4)]
    cnd = region("cond", T(I64), T(4), *carry)
    cnd.outputs = [op(cnd, "tc.lt", [cnd.inputs[2], cnd.inputs[0]]).result]
    body = region("body", T(I64), T(4), *carry)
    _, bx, i, acc, junk, late = body.inputs
    body.outputs = [op(body, "tc.add", [i, const(body, 1, np.int64)], alpha=1).result,
                    op(body, "tc.add", [acc, bx], alpha=1).result,
                    op(body, "tc.mul", [junk, const(body, 2.0)]).result,
                    op(body, "tc.add", [late, acc], alpha=1).result]
    loop = while_loop(g, [n, x], [zero, x, junk0, late0], cnd, body)
    g.outputs = [loop.results[1]]
    return g


def test_while_drops_unused_carries_but_keeps_what_the_condition_reads():
    g = counting_while()
    out = control(g)
    same_results(g, out)
    loop = the(out, "tc.while_loop")
    assert [v.type for v in loop.results] == [T(I64), T(4)]       # i (the condition), acc
    assert [len(r.inputs) for r in loop.regions] == [4, 4]


# ---------------------------------------------------------------- operands

def test_unused_and_repeated_consts_are_dropped():
    g = Graph("f", [T(4), T(4), T(4), T(3, 4)])
    a, b, h0, xs = g.inputs
    body = region("body", T(4), T(4), T(4), T(4), T(4))
    a1, a2, _b, h, x = body.inputs
    hn = op(body, "tc.add", [op(body, "tc.mul", [h, a1]).result, op(body, "tc.mul", [h, a2]).result], alpha=1)
    hn = op(body, "tc.add", [hn.result, x], alpha=1)
    body.outputs = [hn.result, hn.result]
    loop = scan(g, [a, a, b], [h0], [xs], body)
    g.outputs = list(loop.results)
    out = control(g)
    same_results(g, out)
    new = the(out, "tc.scan")
    assert new.attrs["num_consts"] == 1 and new.operands == [a for a in out.inputs if a is not out.inputs[1]]
    muls = [o for o in new.regions[0].ops if o.name == "tc.mul"]
    assert muls[0].operands[1] is muls[1].operands[1] is new.regions[0].inputs[0]


def test_while_drops_a_const_neither_region_reads():
    assert the(control(counting_while()), "tc.while_loop").attrs["num_consts"] == 2  # n, x read
    g = counting_while()
    body = g.ops[-1].regions[1]
    acc = body.inputs[3]
    body.outputs[1] = op(body, "tc.add", [acc, acc], alpha=1).result        # x unread now
    out = control(g)
    same_results(g, out)
    loop = the(out, "tc.while_loop")
    assert loop.attrs["num_consts"] == 1 and loop.operands[0] is out.inputs[0]


# ---------------------------------------------------------------- loop-invariant code motion

def invariant_scan() -> Graph:
    """A scan body computing W * 2, exp(c) and a nested cond on consts only (invariant), a
    rand (never hoisted), and the carry update that uses them."""
    g = Graph("f", [T(3, 3), T(3), T(BOOL), T(3), T(4, 3)])
    w, c, p, h0, xs = g.inputs
    body = region("body", T(3, 3), T(3), T(BOOL), T(3), T(3))
    bw, bc, bp, h, x = body.inputs
    w2 = op(body, "tc.mul", [bw, const(body, 2.0)])
    ec = op(body, "tc.exp", [bc])
    then, other = region("then", T(3)), region("else", T(3))
    then.outputs = [op(then, "tc.neg", [then.inputs[0]]).result]
    other.outputs = [other.inputs[0]]
    pc = cond(body, bp, [ec.result], then, other)
    r = body.add_op("tc.rand", [], {"size": (3,), "dtype": None}, [T(3)])
    noise = op(body, "tc.mul", [r.result, const(body, 0.0)])
    t = op(body, "tc.matmul", [w2.result, h])
    hn = op(body, "tc.add", [op(body, "tc.add", [t.result, pc.result], alpha=1).result, x], alpha=1)
    hn = op(body, "tc.add", [hn.result, noise.result], alpha=1)
    body.outputs = [hn.result, ec.result]
    loop = scan(g, [w, c, p], [h0], [xs], body)
    g.outputs = list(loop.results)
    return g


def test_invariant_ops_leave_a_scan_body():
    g = invariant_scan()
    out = control(g)
    same_results(g, out)
    assert names(out) == ["tc.constant", "tc.mul", "tc.exp", "tc.cond", "tc.scan"]
    body = the(out, "tc.scan").regions[0]
    assert "tc.rand" in names(body) and not {"tc.exp", "tc.cond"} & set(names(body))
    assert [o.name for o in body.ops if o.name == "tc.mul"] == ["tc.mul"]     # rand * 0 only
    assert the(out, "tc.scan").attrs["num_consts"] == 3      # W * 2, exp(c), the cond's result


def test_invariant_ops_leave_both_regions_of_a_while_loop():
    g = Graph("f", [T(I64), T(4), T(4)])
    n, c, acc0 = g.inputs
    cnd = region("cond", T(I64), T(4), T(I64), T(4))
    twice = op(cnd, "tc.mul", [cnd.inputs[0], const(cnd, 2, np.int64)])
    cnd.outputs = [op(cnd, "tc.lt", [cnd.inputs[2], twice.result]).result]
    body = region("body", T(I64), T(4), T(I64), T(4))
    _, bc, i, acc = body.inputs
    ec = op(body, "tc.exp", [op(body, "tc.neg", [bc]).result])
    body.outputs = [op(body, "tc.add", [i, const(body, 1, np.int64)], alpha=1).result,
                    op(body, "tc.add", [acc, ec.result], alpha=1).result]
    loop = while_loop(g, [n, c], [const(g, 0, np.int64), acc0], cnd, body)
    g.outputs = list(loop.results)
    out = control(g)
    same_results(g, out)
    cnd2, body2 = the(out, "tc.while_loop").regions
    assert names(cnd2) == ["tc.lt"] and names(body2) == ["tc.constant", "tc.add", "tc.add"]
    assert the(out, "tc.while_loop").attrs["num_consts"] == 2       # n * 2, exp(-c)


# ---------------------------------------------------------------- ops on x rows

def elman() -> Graph:
    """h = tanh(x @ Wx + b + h @ Wh), ys h and exp(x): x @ Wx + b and exp(x) need no step."""
    g = Graph("elman", [T(3, 4), T(4, 4), T(4), T(2, 4), T(5, 2, 3)])
    wx, wh, b, h0, xs = g.inputs
    body = region("body", T(3, 4), T(4, 4), T(4), T(2, 4), T(2, 3))
    bwx, bwh, bb, h, x = body.inputs
    xw = op(body, "tc.add", [op(body, "tc.matmul", [x, bwx]).result, bb], alpha=1)
    hn = op(body, "tc.tanh", [op(body, "tc.add", [xw.result, op(body, "tc.matmul", [h, bwh]).result],
                                 alpha=1).result])
    body.outputs = [hn.result, hn.result, op(body, "tc.exp", [x]).result]
    loop = scan(g, [wx, wh, b], [h0], [xs], body, reverse=True)
    g.outputs = list(loop.results)
    return g


def test_matmul_and_elementwise_on_x_run_over_all_steps():
    g = elman()
    out = control(g)
    same_results(g, out)
    loop = the(out, "tc.scan")
    mm = [o for o in out.ops if o.name == "tc.matmul"]
    assert len(mm) == 1 and mm[0].results[0].type == T(5, 2, 4)         # xs @ Wx, batched
    # + b stays: the body adds it to the row it reads anyway (a stack of xw + b would be
    # written and read once more); then h @ Wh and after
    assert names(loop.regions[0]) == ["tc.add", "tc.matmul", "tc.add", "tc.tanh"]
    assert loop.attrs["num_consts"] == 2 and set(loop.operands[:2]) == {out.inputs[1], out.inputs[2]}
    assert len(loop.results) == 2                      # the exp(x) y is exp(xs) itself
    assert out.outputs[2] is the(out, "tc.exp").results[0]
    assert [v.type for v in loop.operands[3:]] == [T(5, 2, 4)]            # the original xs went


@pytest.mark.parametrize("x_row, w, x_left, hoisted", [
    ((2, 3), (3, 4), True, True),        # x[i] @ W
    ((3,), (3, 4), True, True),          # a vector row: xs @ W is each row's product
    ((3,), (3,), True, True),            # dot products
    ((2, 3), (3,), True, True),
    ((4, 2, 3), (4, 3, 5), True, True),  # W's batch matches x's
    ((3,), (2, 3, 4), True, False),      # W's batch dims would lead
    ((2, 3), (6, 3, 4), True, False),
    ((3, 2), (4, 3), False, True),       # W @ x[i]
    ((3,), (4, 3), False, False),        # W @ (vector): xs would be a matrix
    ((3, 2), (5, 4, 3), False, False),
])
def test_matmul_on_x_is_hoisted_only_where_it_computes_every_row(x_row, w, x_left, hoisted):
    length = 3
    g = Graph("f", [T(*w), T(length, *x_row)])
    body = region("body", T(*w), T(*x_row))
    bw, x = body.inputs
    y = op(body, "tc.matmul", [x, bw] if x_left else [bw, x])
    body.outputs = [y.result]
    g.outputs = list(scan(g, [g.inputs[0]], [], [g.inputs[1]], body).results)
    out = control(g)
    same_results(g, out)
    assert ("tc.scan" not in names(out)) == hoisted      # the one y is the hoisted matmul


def test_elementwise_on_x_moves_only_for_a_matmul_or_when_the_body_no_longer_needs_it():
    """1 - x_i used by the body stays in it (a hoisted copy would be one more stack to write
    and read); (x_i * 2) @ W moves with its matmul although the body also reads x_i * 2;
    exp(x_i) that is only a y is exp(xs)."""
    g = Graph("f", [T(3, 4), T(2, 3), T(5, 2, 3)])
    body = region("body", T(3, 4), T(2, 3), T(2, 3))
    w, h, x = body.inputs
    one_minus = op(body, "tc.sub", [x], self=1, alpha=1).result
    doubled = op(body, "tc.mul", [x], other=2.0).result
    projected = op(body, "tc.matmul", [doubled, w]).result
    hn = op(body, "tc.tanh", [op(body, "tc.add", [op(body, "tc.mul", [h, one_minus]).result, doubled],
                                 alpha=1).result]).result
    body.outputs = [hn, projected, op(body, "tc.exp", [x]).result]
    g.outputs = list(scan(g, [g.inputs[0]], [g.inputs[1]], [g.inputs[2]], body).results)
    out = control(g)
    same_results(g, out)
    outside = names(out)
    assert "tc.sub" not in outside and "tc.matmul" in outside and "tc.exp" in outside
    assert "tc.mul" in outside and "tc.sub" in names(the(out, "tc.scan").regions[0])


def test_elementwise_on_x_with_a_row_of_fewer_dims_stays():
    """x[i] (3,) + c (2, 3) broadcasts per step; xs (5, 3) + c would not."""
    g = Graph("f", [T(2, 3), T(5, 3)])
    body = region("body", T(2, 3), T(3))
    body.outputs = [op(body, "tc.add", [body.inputs[1], body.inputs[0]], alpha=1).result]
    g.outputs = list(scan(g, [g.inputs[0]], [], [g.inputs[1]], body).results)
    out = control(g)
    same_results(g, out)
    assert "tc.add" in names(the(out, "tc.scan").regions[0])


def test_an_op_on_x_and_the_carry_stays():
    g = rnn_scan()
    out = control(g)
    same_results(g, out)
    assert names(out) == ["tc.scan"] and len(out.ops[0].regions[0].ops) == 4


def test_control_returns_a_graph_without_regions_as_it_is():
    g = Graph("f", [T(4)])
    g.outputs = [op(g, "tc.exp", g.inputs).result]
    assert control(g) is g


def test_control_rewrites_nested_loops_innermost_first():
    g = Graph("f", [T(3, 3), T(3), T(2, 4, 3)])
    w, h0, xss = g.inputs
    outer = region("outer", T(3, 3), T(3), T(4, 3))
    ow, oh, xs = outer.inputs
    inner = region("inner", T(3, 3), T(3), T(3))
    iw, ih, x = inner.inputs
    xw = op(inner, "tc.matmul", [x, op(inner, "tc.exp", [iw]).result])
    inner.outputs = [op(inner, "tc.add", [ih, xw.result], alpha=1).result]
    loop = scan(outer, [ow], [oh], [xs], inner)
    outer.outputs = [loop.results[0], loop.results[0]]
    g.outputs = list(scan(g, [w], [h0], [xss], outer).results)
    out = control(g)
    same_results(g, out)
    # exp(W) left both loops; x @ exp(W), first hoisted over the inner xs into the outer
    # body, then over the outer xs too
    assert names(out) == ["tc.exp", "tc.matmul", "tc.scan"]
    assert the(out, "tc.matmul").results[0].type == T(2, 4, 3)
    outer_body = the(out, "tc.scan").regions[0]
    assert names(outer_body) == ["tc.scan"]
    assert names(the(outer_body, "tc.scan").regions[0]) == ["tc.add"]


def test_pipeline_on_the_rewrites():
    for make in (elman, invariant_scan, counting_while, lambda: two_carries(False)):
        g = make()
        out = optimize(g)
        same_results(g, out)
        text = print_graph(out)
        assert "tc.scan" in text or "tc.while_loop" in text


# ---------------------------------------------------------------- random loops

def random_ops(rnd, g: Graph, values: list, depth: int = 0) -> list:
    """A few random ops on `values` (3x3 matrices): unary, add/mul with a value or a
    constant, matmul, a scan nested inside, a cond, a rand (times 0, so results compare)."""
    values = list(values)
    for _ in range(rnd.randint(0, 7)):
        a, kind = rnd.choice(values), rnd.random()
        if kind < 0.3:
            values.append(op(g, rnd.choice(["tc.exp", "tc.neg", "tc.tanh", "tc.sin"]), [a]).result)
        elif kind < 0.55:
            b = rnd.choice(values + [const(g, rnd.random())])
            values.append((op(g, "tc.add", [a, b], alpha=1) if rnd.random() < 0.5 else op(g, "tc.mul", [a, b])).result)
        elif kind < 0.7:
            values.append(op(g, "tc.matmul", [a, rnd.choice(values)]).result)
        elif kind < 0.8 and depth < 2:
            row = op(g, "tc.unsqueeze", [a], dim=0).result
            body = region("inner", T(3, 3), T(3, 3), T(3, 3))
            inner = random_ops(rnd, body, body.inputs, depth + 1)
            body.outputs = [rnd.choice(inner), rnd.choice(inner)]
            loop = scan(g, [a], [rnd.choice(values)], [op(g, "tc.cat", [row, row], dim=0).result], body)
            ys = op(g, "tc.sum", [loop.results[1]], dim=(0,), keepdim=False, dtype=None).result
            values.append(rnd.choice([loop.results[0], ys]))
        elif kind < 0.9:
            p = (const(g, rnd.random() < 0.5, np.bool_) if rnd.random() < 0.5 else
                 op(g, "tc.gt", [op(g, "tc.sum", [a], dim=None, keepdim=False, dtype=None).result,
                                 const(g, 0.0)]).result)
            then, other = region("then", T(3, 3), T(3, 3)), region("else", T(3, 3), T(3, 3))
            then.outputs = [op(then, "tc.exp", [then.inputs[0]]).result]
            other.outputs = [other.inputs[rnd.randint(0, 1)]]
            values.append(cond(g, p, [a, rnd.choice(values)], then, other).result)
        else:
            r = g.add_op("tc.rand", [], {"size": (3, 3), "dtype": None}, [T(3, 3)]).result
            values.append(op(g, "tc.add", [a, op(g, "tc.mul", [r, const(g, 0.0)]).result], alpha=1).result)
    return values


def random_scan(seed: int) -> Graph:
    import random
    rnd = random.Random(seed)
    k, c, n, length = rnd.randint(0, 2), rnd.randint(0, 3), rnd.randint(1, 2), rnd.choice([0, 1, 3])
    g = Graph("f", [T(3, 3)] * (k + c) + [T(length, 3, 3)] * n)
    consts = [rnd.choice(g.inputs[:k + c]) for _ in range(k)]         # repeats happen
    body = region("body", *[T(3, 3)] * (k + c + n))
    values = random_ops(rnd, body, body.inputs)
    body.outputs = [rnd.choice(values) for _ in range(c + rnd.randint(0, 2))]
    loop = scan(g, consts, g.inputs[k:k + c], g.inputs[k + c:], body, reverse=rnd.random() < 0.3)
    g.outputs = [r for r in loop.results if rnd.random() < 0.6]
    return g


def random_while(seed: int) -> Graph:
    import random
    rnd = random.Random(seed)
    k, c = rnd.randint(0, 2), rnd.randint(0, 3)
    g = Graph("f", [T(I64)] + [T(3, 3)] * (k + c))
    consts = [g.inputs[0]] + [rnd.choice(g.inputs[1:]) for _ in range(k)]
    init = [const(g, 0, np.int64)] + g.inputs[1 + k:]
    types = [v.type for v in consts + init]
    k += 1
    cnd = region("cond", *types)
    limit = cnd.inputs[0] if rnd.random() < 0.5 else op(cnd, "tc.mul", [cnd.inputs[0], const(cnd, 1, np.int64)]).result
    cnd.outputs = [op(cnd, "tc.lt", [cnd.inputs[k], limit]).result]
    body = region("body", *types)
    values = random_ops(rnd, body, [v for v in body.inputs if v.type == T(3, 3)] or [const(body, np.ones((3, 3)))])
    step = op(body, "tc.add", [body.inputs[k], const(body, 1, np.int64)], alpha=1).result
    body.outputs = [step] + [rnd.choice(values) for _ in range(len(init) - 1)]
    g.outputs = [r for r in while_loop(g, consts, init, cnd, body).results if rnd.random() < 0.6]
    return g


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("make", [random_scan, random_while])
def test_random_loops_keep_their_meaning(make, seed):
    g = make(seed)
    for out in (control(g), optimize(g)):
        same_results(g, out, trials=1)
        assert parse_graph(print_graph(out)) == out


def test_a_while_body_keeps_ops_that_could_raise_or_not_end():
    """Hoisted out of a while loop that runs no step, an index_select with a bad index
    would raise where the program did not; a loop hoisted out might not end."""
    import numpy as np
    import tracecomp as tc
    from tracecomp.runtime.interpreter import run_graph

    def program(n, idx, table):
        def body(c):
            i, acc = c
            return i + 1, acc + tc.index_select(table, 0, idx).sum()
        return tc.while_loop(lambda c: c[0] < n, body, (tc.tensor(np.int64(0)), tc.tensor(0.0)))[1]
    lowered = tc.trace(program, backend="interp").lower(tc.tensor(np.int64(0)), tc.tensor(np.array([5])),
                                                         tc.tensor(np.ones(3, np.float32)))
    loop = [op for op in lowered.graph.ops if op.name == "tc.while_loop"][0]
    assert "tc.index_select" in [o.name for o in loop.regions[1].ops]
    # no step runs, so the out-of-range index is never used: no error
    out = run_graph(lowered.graph, [np.int64(0), np.array([5]), np.ones(3, np.float32)])
    assert float(out[0]) == 0.0


# ---------------------------------------------------------------- sums of products

@pytest.mark.parametrize("a_kind, b_kind", [("x^T", "y"), ("x", "x"), ("y", "x^T"), ("y^T", "y"), ("x^T", "x^T")])
@pytest.mark.parametrize("reverse", [False, True])
def test_a_carry_summing_products_of_rows_is_one_product_after_the_loop(a_kind, b_kind, reverse):
    """acc + a_i @ b_i over the steps (a weight gradient: dW += h_i^T da_i) becomes
    acc0 + (stacked a) @ (stacked b); the loop keeps no carry of the weight's shape.
    A row is an x row or a y (here z_i * s_i, s a second carry), either read transposed."""
    length, m, kk, n = 4, 3, 2, 5
    kinds = {"a": a_kind, "b": b_kind}
    shapes = {name: ((kk, m) if name == "a" else (n, kk)) if kinds[name].endswith("^T")
              else ((m, kk) if name == "a" else (kk, n)) for name in kinds}
    xs_types = [T(*shapes[name]) for name in kinds]     # x rows, or the z rows of a y
    g = Graph("f", [T(m, n), T()] + [T(length, *t.shape) for t in xs_types])
    body = region("body", T(m, n), T(), *xs_types)
    acc, scale = body.inputs[:2]
    operands, ys = {}, []
    for i, name in enumerate(kinds):
        v = body.inputs[2 + i]
        if kinds[name].startswith("y"):
            v = op(body, "tc.mul", [v, scale]).result
            ys.append(v)
        operands[name] = op(body, "tc.permute", [v], dims=(1, 0)).result if kinds[name].endswith("^T") else v
    product = op(body, "tc.matmul", [operands["a"], operands["b"]]).result
    next_scale = op(body, "tc.mul", [scale], other=0.9).result
    body.outputs = [op(body, "tc.add", [acc, product], alpha=1).result, next_scale] + ys
    loop = scan(g, [], g.inputs[:2], g.inputs[2:], body, reverse=reverse, length=length)
    g.outputs = list(loop.results)
    out = control(g)
    same_results(g, out)
    [new] = [o for o in out.ops if o.name == "tc.scan"]
    assert [v.type for v in new.results[:new.attrs["num_carry"]]] == [T()]
    assert any(o.name == "tc.matmul" and o.results[0].type == T(m, n) for o in out.ops)


def test_a_sum_whose_rows_are_not_stacked_stays_in_the_loop():
    """acc + h_i^T h_i with h a carry: no stack of h exists, so the sum stays a carry."""
    g = Graph("f", [T(3, 3), T(2, 3), T(4, 2, 3)])
    body = region("body", T(3, 3), T(2, 3), T(2, 3))
    acc, h, x = body.inputs
    hn = op(body, "tc.tanh", [op(body, "tc.add", [h, x], alpha=1).result]).result
    product = op(body, "tc.matmul", [op(body, "tc.permute", [h], dims=(1, 0)).result, h]).result
    body.outputs = [op(body, "tc.add", [acc, product], alpha=1).result, hn]
    g.outputs = list(scan(g, [], [g.inputs[0], g.inputs[1]], [g.inputs[2]], body).results)
    out = control(g)
    same_results(g, out)
    assert the(out, "tc.scan").attrs["num_carry"] == 2


def test_the_lstm_weight_gradient_leaves_the_backward_loop():
    """tc.grad of a recurrent scan, h' = tanh(x + h @ W), with respect to W and the xs (as
    an LSTM's projected inputs are): the backward scan stacks the xs' gradients and the
    forward the hs, so dW = sum h_i^T dx_i is one product after the loop; no (8, 8) sum
    is carried.  The gradients match the unrolled loop's."""
    import tracecomp as tc
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 8)) * 0.3
    xs = rng.standard_normal((5, 3, 8))

    def loss(w, xs, unrolled):
        def cell(h, x):
            h = tc.tanh(x + h @ w)
            return h, None
        h = tc.zeros((3, 8), dtype=tc.float64)
        if unrolled:
            for t in range(xs.shape[0]):
                h, _ = cell(h, xs[t])
        else:
            h, _ = tc.scan(cell, h, xs)
        return (h * h).sum()
    scanned = tc.trace(tc.grad(lambda w, xs: loss(w, xs, False), argnums=(0, 1)))
    graph = scanned.lower(w, xs).optimized
    scans = [o for o in graph.ops if o.name == "tc.scan"]
    assert len(scans) == 2 and all(
        v.type.shape != (8, 8) for o in scans for v in o.results[:o.attrs["num_carry"]])
    want = tc.trace(tc.grad(lambda w, xs: loss(w, xs, True), argnums=(0, 1)))(w, xs)
    for got, ref in zip(scanned(w, xs), want):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-12)
