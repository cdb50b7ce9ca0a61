"""Hostile indices (issue 33, item 1): indices the function computes must raise when out of
range, in compiled (tc.trace) and exported (tc.export + tc.load) code, as they do eagerly,
with the ShapeError an index argument raises: op, index value, dim, size and the user's line.

Each finding has a test run both ways (`run` fixture); then in-range computed indices (with
negatives wrapped) must still give NumPy's answers, the error record must not outlive a
failed call, several threads failing at once must give one well-defined error, the checks
must be skipped where the range is known, and tc.trace(..., check_indices=False) is the one
(unsafe) way to clamp silently.
"""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.core.errors import ShapeError

X10 = np.arange(10, dtype=np.float32) * 10


def compiled(fn, args):
    return tc.trace(fn)(*args)


def exported(fn, args, tmp_path, example=None):
    if shutil.which("cc") is None:
        pytest.skip("exporting needs a C compiler ('cc' is missing)")
    path = str(tmp_path / f"lib{fn.__name__}.so")
    tc.export(fn, list(example or args), path)
    return tc.load(path)(*args)


@pytest.fixture(params=["compiled", "exported"])
def run(request, tmp_path):
    """run(fn, args, example=None): fn compiled or exported (for `example`'s shapes) on args."""
    if request.param == "compiled":
        return lambda fn, args, example=None: compiled(fn, args)
    return lambda fn, args, example=None: exported(fn, args, tmp_path, example)


def raises_index_error(run, fn, args, op: str, value: int, size: int, example=None):
    with pytest.raises(ShapeError) as info:
        run(fn, args, example)
    text = str(info.value)
    assert f"{op}: index {value} is out of bounds for dim 0 with size {size}" in text, text
    assert "test_hostile_indices.py:" in text, text          # the user's line
    return text


# ---------------------------------------------------------------- the findings

def test_index_one_past_the_end(run):
    def fn(x, i):
        return x[i + 1]
    raises_index_error(run, fn, [X10, np.array(9)], "index_select", 10, 10, [X10, np.array(2)])


def test_gather_of_a_huge_computed_index(run):
    def fn(x, i):
        return tc.gather(x, 0, i * 2 ** 40)
    raises_index_error(run, fn, [X10, np.array([1])], "gather", 2 ** 40, 10, [X10, np.array([0])])


def test_assignment_one_past_the_end(run):
    def fn(x, i):
        y = x * 1
        y[i + 1] = -5
        return y
    raises_index_error(run, fn, [X10, np.array(9)], "index_select", 10, 10, [X10, np.array(2)])


def test_nan_cast_to_an_index(run):
    def fn(x, v):
        return x[(v * float("nan")).long()]
    v = np.array([1.0], np.float32)
    raises_index_error(run, fn, [X10, v], "index_select", -2 ** 63, 10)


def test_nan_argument_cast_to_an_index(run):
    def fn(x, v):                   # a float argument is checked where its cast is used
        return x[v.long()]
    raises_index_error(run, fn, [X10, np.array([2.0, np.nan], np.float32)], "index_select", -2 ** 63, 10,
                       [X10, np.array([2.0, 3.0], np.float32)])


def test_negative_computed_index_below_minus_size(run):
    def fn(x, i):
        return x[i - 20]
    raises_index_error(run, fn, [X10, np.array([0, 15])], "index_select", -20, 10, [X10, np.array([12, 15])])


def test_negative_computed_gather_index(run):
    def fn(x, i):                   # gather does not count negative indices from the end
        return tc.gather(x, 0, i - 1)
    raises_index_error(run, fn, [X10, np.array([0, 3])], "gather", -1, 10, [X10, np.array([1, 3])])


def test_index_add_at_computed_indices(run):
    def fn(x, i, src):
        return tc.index_add(x, 0, i + 1, src)
    src = np.ones(10, np.float32)
    raises_index_error(run, fn, [X10, np.arange(10), src], "index_add", 10, 10,
                       [X10, np.arange(10) % 9, src])


def test_scatter_at_computed_indices(run):
    def fn(x, i, src):
        return tc.scatter(x, 0, i * 3 + 3, src)
    src = np.ones(4, np.float32)
    text = raises_index_error(run, fn, [X10, np.arange(4), src], "scatter.src", 12, 10,
                              [X10, np.arange(4) % 3, src])
    assert "scatter" in text


# ---------------------------------------------------------------- right answers in range

def test_in_range_computed_indices_give_numpys_answers(run):
    def fn(x, i, src):
        a = x[i - 5]                               # negatives count from the end
        b = tc.gather(x, 0, i * 2)
        c = tc.index_add(x, 0, i + 1, src)
        y = x * 1
        y[i - 3] = -5.0
        return a, b, c, y
    i = np.array([0, 1, 4], np.int64)
    src = np.array([1, 2, 3], np.float32)
    a, b, c, y = run(fn, [X10, i, src])
    c_want, y_want = X10.copy(), X10.copy()
    np.add.at(c_want, i + 1, src)
    y_want[i - 3] = -5
    np.testing.assert_array_equal(np.asarray(a), X10[i - 5])
    np.testing.assert_array_equal(np.asarray(b), X10[i * 2])
    np.testing.assert_array_equal(np.asarray(c), c_want)
    np.testing.assert_array_equal(np.asarray(y), y_want)


def test_a_failed_call_leaves_no_error_behind(run):
    def fn(x, i):
        return x[i + 1]
    f = tc.trace(fn)
    with pytest.raises(ShapeError):
        f(X10, np.array(9))
    assert float(np.asarray(f(X10, np.array(2)))) == X10[3]


def test_many_threads_failing_report_one_well_defined_index():
    """A parallel gather where many elements fail on several threads: the error names the
    largest offending index (compared as unsigned: negative ones first), whatever the order."""
    n = 1 << 20
    x = np.arange(n, dtype=np.float32)

    def fn(x, i):
        return tc.gather(x, 0, i + 1)
    i = np.arange(n, dtype=np.int64)
    i[1000::7919] = n + 5
    i[-1] = n + 100
    f = tc.trace(fn)
    for _ in range(3):
        with pytest.raises(ShapeError, match=f"gather: index {n + 101} is out of bounds for dim 0 with size {n}"):
            f(x, i)
    i[5] = -7
    with pytest.raises(ShapeError, match=f"gather: index -6 is out of bounds"):
        f(x, i)


def test_the_loop_interpreter_raises_the_same_error():
    from tracecomp.lower.loops.interp import run_program

    def fn(x, i):
        return x[i + 1]
    program = tc.trace(fn).lower(X10, np.array(9)).program
    with pytest.raises(ShapeError, match="index_select: index 10 is out of bounds for dim 0 with size 10"):
        run_program(program, [X10, np.array(9)])
    assert float(run_program(program, [X10, np.array(2)])[0]) == X10[3]


# ---------------------------------------------------------------- where no check is needed

@pytest.mark.parametrize("fn", [
    lambda x, i: x[tc.arange(3) + 2],                     # an arange's range is known
    lambda x, i: x[tc.argsort(x)],                        # sort positions lie in the dim
    lambda x, i: x[i],                                    # an argument: checked before the kernels
    lambda x, i: x[tc.full((2,), 9, dtype=tc.int64)],
], ids=["arange", "argsort", "argument", "full"])
def test_indices_known_to_be_in_range_are_not_checked_in_the_kernels(fn):
    lowered = tc.trace(fn).lower(X10, np.array([1, 2]))
    assert lowered.program.computed_checks == []
    assert "atomic_rmw" not in lowered.as_text("loops")


def test_a_computed_index_is_checked_in_the_loops():
    def fn(x, i):
        return x[i + 1]
    lowered = tc.trace(fn).lower(X10, np.array(2))
    [check] = lowered.program.computed_checks
    assert (check.op, check.dim, check.size) == ("index_select", 0, 10)
    assert "memref.atomic_rmw maxu" in lowered.as_text("loops")


# ---------------------------------------------------------------- the escape hatch

def test_check_indices_false_clamps_unchecked():
    def fn(x, i):
        return x[i + 1]
    f = tc.trace(fn, check_indices=False)
    assert float(np.asarray(f(X10, np.array(9)))) == X10[9]       # unsafe: the nearest element
    assert f.lower(X10, np.array(9)).program.computed_checks == []
    with pytest.raises(ShapeError):                                  # arguments are still checked
        tc.trace(lambda x, i: x[i], check_indices=False)(X10, np.array(10))


# ---------------------------------------------------------------- the PTX path

def test_the_ptx_records_failures_with_atomics():
    from tracecomp.lower.nvptx.program import compile_program

    def fn(x, i):
        return tc.gather(x, 0, i + 1)
    ptx = compile_program(tc.trace(fn).lower(X10, np.arange(4)).program).ptx
    assert re.search(r"atom(\.global)?\.max\.u64", ptx), ptx[-3000:]


def test_the_device_runner_raises_on_the_emulator():
    from tracecomp.runtime.cuda.emulator import EmulatedContext
    from tracecomp.runtime.cuda.runner import CudaProgram

    def fn(x, i):
        return tc.gather(x, 0, i + 1)
    program = CudaProgram(tc.trace(fn).lower(X10, np.arange(4)).program, EmulatedContext())
    with pytest.raises(ShapeError, match="gather: index 10 is out of bounds for dim 0 with size 10"):
        program([X10, np.array([0, 9, 2, 3])])
    np.testing.assert_array_equal(program.on_host([X10, np.array([0, 8, 2, 3])])[0], X10[[1, 9, 3, 4]])


def test_exported_dynamic_sizes_name_their_value(tmp_path):
    if shutil.which("cc") is None:
        pytest.skip("exporting needs a C compiler ('cc' is missing)")

    def fn(x, i):
        return tc.gather(x, 0, i + 1)
    path = str(tmp_path / "libdyn.so")
    tc.export(fn, [X10, np.arange(4)], path, dynamic={"x": {0: "n"}, "i": {0: "m"}})
    g = tc.load(path)
    x = np.arange(20, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(g(x, np.arange(5) * 3)), x[np.arange(5) * 3 + 1])
    with pytest.raises(ShapeError, match=r"gather: index 21 is out of bounds for dim 0 with size n = 20"):
        g(x, np.arange(5) * 5)
