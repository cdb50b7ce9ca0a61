"""The loop IR's checker and MLIR printer.

Hand-built kernels (every statement kind, every Unary/Binary fn for each dtype kind it is
defined for, every cast, selects, constants, broadcasting and transposed index maps,
reductions, parallel loops, dynamic sizes) are checked, printed, and fed to mlir-opt
without --allow-unregistered-dialect; one kernel has golden text; a table of broken
kernels gives the IRError message each must produce.
"""
from __future__ import annotations

import math
import re
import subprocess

import pytest

from tracecomp.dtypes import DType
from tracecomp.errors import IRError
from tracecomp.ir.mlir_tool import find_mlir_opt
from tracecomp.lower import loops as L
from tracecomp.lower.loops import (INDEX, Accumulator, Binary, Buffer, Cast, Const, Kernel, Let,
                                   Load, Loop, Reduce, Select, Store, Unary, Var)
from tracecomp.lower.loops_check import (BINARY_KINDS, UNARY_KINDS, check_kernel, dtype_kind,
                                         dtype_name)
from tracecomp.lower.loops_printer import BINARY_OPS, UNARY_OPS, print_kernel, print_kernels

F32, F64, I32, I64, BOOL = DType.float32, DType.float64, DType.int32, DType.int64, DType.bool
DTYPES = (F32, F64, I32, I64, BOOL, INDEX)
MLIR_OPT = find_mlir_opt()
needs_mlir_opt = pytest.mark.skipif(
    MLIR_OPT is None, reason="mlir-opt not found (neither /usr/lib/llvm-22/bin/mlir-opt nor on PATH)")


def mlir_opt_accepts(text: str) -> None:
    """Parse and verify `text` with plain mlir-opt (no unregistered dialects allowed); on
    failure show the diagnostics and the function they point into."""
    proc = subprocess.run([MLIR_OPT, "-", "-o", "-"], input=text, capture_output=True, text=True,
                          timeout=60)
    if proc.returncode != 0:
        lines = text.splitlines()
        at = int(m.group(1)) if (m := re.search(r"<stdin>:(\d+):", proc.stderr)) else len(lines)
        start = max((n for n in range(at) if "func.func" in lines[n]), default=0)
        closing = lines[start][:len(lines[start]) - len(lines[start].lstrip())] + "}"
        end = next((n for n in range(at - 1, len(lines)) if lines[n] == closing), len(lines) - 1)
        pytest.fail(f"mlir-opt rejected:\n{proc.stderr}\n" + "\n".join(lines[start:end + 1]))


def idx(name: str) -> Var:
    return Var(name, INDEX)


i_, j_ = idx("i"), idx("j")


# --- kernel builders ---------------------------------------------------------------------
def _storage(d) -> DType:
    """Index values live in int64 buffers."""
    return I64 if d == INDEX else d


def elementwise(name: str, in_dtypes, make, n: int = 8) -> Kernel:
    """y[i] = make(x0[i], x1[i], ...); index operands are int64 loads cast to index."""
    bufs = [Buffer(f"x{k}", _storage(d), (n,), "input") for k, d in enumerate(in_dtypes)]
    args = [Load(b.name, (i_,), b.dtype) for b in bufs]
    args = [Cast(a, INDEX) if d == INDEX else a for a, d in zip(args, in_dtypes)]
    value = make(*args)
    if value.dtype == INDEX:
        value = Cast(value, I64)
    return Kernel(name, bufs + [Buffer("y", value.dtype, (n,), "output")],
                  [Loop("i", n, [Store("y", (i_,), value)])])


def _cases(table: dict[str, str]):
    return [(fn, d) for fn, kinds in table.items() for d in DTYPES if dtype_kind(d) in kinds]


def _label(d) -> str:
    return dtype_name(d)


UNARY_CASES = {f"unary-{fn}-{_label(d)}": elementwise(
    f"unary_{fn}_{_label(d)}", [d], lambda x, fn=fn, d=d: Unary(fn, x, d))
    for fn, d in _cases(UNARY_KINDS)}
BINARY_CASES = {f"binary-{fn}-{_label(d)}": elementwise(
    f"binary_{fn}_{_label(d)}", [d, d],
    lambda a, b, fn=fn, d=d: Binary(fn, a, b, BOOL if fn in L.COMPARISONS else d))
    for fn, d in _cases(BINARY_KINDS)}
CAST_CASES = {f"cast-{_label(s)}-{_label(t)}": elementwise(
    f"cast_{_label(s)}_{_label(t)}", [s], lambda x, t=t: Cast(x, t))
    for s in DTYPES for t in DTYPES}
SELECT_CASES = {f"select-{_label(d)}": elementwise(
    f"select_{_label(d)}", [BOOL, d, d], lambda c, a, b, d=d: Select(c, a, b, d))
    for d in DTYPES}
SPECIAL = {F32: (0.0, -0.0, 1e-5, 0.1, 3.4028234663852886e38, math.inf, -math.inf, math.nan, 2),
           F64: (1e-300, 1e300, -math.inf, math.nan), I32: (-2 ** 31, 2 ** 31 - 1),
           I64: (-2 ** 63, 2 ** 63 - 1), BOOL: (True, False), INDEX: (0, 2 ** 40)}


def _chain(d):
    """maximum(...maximum(c0, c1)..., cn) over the special constants of `d`."""
    e = Const(SPECIAL[d][0], d)
    for v in SPECIAL[d][1:]:
        e = Binary("maximum", e, Const(v, d), d)
    return e


CONST_CASES = {f"const-{_label(d)}": elementwise(f"const_{_label(d)}", [], lambda d=d: _chain(d))
               for d in SPECIAL}


def broadcast_2d() -> Kernel:
    """y[i, j] = x[i, j] + row[0, j] * col[i, 0]: broadcast dims are indexed by Const 0."""
    zero = Const(0, INDEX)
    body = Binary("add", Load("x", (i_, j_), F32), Binary(
        "mul", Load("row", (zero, j_), F32), Load("col", (i_, zero), F32), F32), F32)
    return Kernel("broadcast_2d", [Buffer("x", F32, (4, 8), "input"), Buffer("row", F32, (1, 8), "input"),
                                   Buffer("col", F32, (4, 1), "input"), Buffer("y", F32, (4, 8), "output")],
                  [Loop("i", 4, [Loop("j", 8, [Store("y", (i_, j_), body)])])])


def flat_index() -> Kernel:
    """A reshape view: y[i, j] = x[i * 8 + j], and back: z[k] = y[k // 8, k % 8]."""
    flat = Binary("add", Binary("mul", i_, Const(8, INDEX), INDEX), j_, INDEX)
    k = idx("k")
    unflat = (Binary("floordiv", k, Const(8, INDEX), INDEX), Binary("mod", k, Const(8, INDEX), INDEX))
    return Kernel("flat_index", [Buffer("x", F64, (32,), "input"), Buffer("y", F64, (4, 8), "temp"),
                                 Buffer("z", F64, (32,), "output")],
                  [Loop("i", 4, [Loop("j", 8, [Store("y", (i_, j_), Load("x", (flat,), F64))])]),
                   Loop("k", 32, [Store("z", (k,), Load("y", unflat, F64))])])


def transpose() -> Kernel:
    return Kernel("transpose", [Buffer("x", I32, (8, 4), "input"), Buffer("y", I32, (4, 8), "output")],
                  [Loop("i", 4, [Loop("j", 8, [Store("y", (i_, j_), Load("x", (j_, i_), I32))])])])


def row_reduce(parallel: bool = False, sizes=()) -> Kernel:
    """Row sums and row argmax (a pair of accumulators: best value and its index)."""
    n, m = (sizes or (4, 8))
    v, best, at = Var("v", F32), Var("best", F32), idx("at")
    take = Var("take", BOOL)
    total = Reduce("j", m, [Accumulator("s", F32, Const(0.0, F32))],
                   [Let("v", Load("x", (i_, j_), F32))], [Binary("add", Var("s", F32), v, F32)])
    argmax = Reduce("j", m, [Accumulator("best", F32, Const(-math.inf, F32)),
                             Accumulator("at", INDEX, Const(0, INDEX))],
                    [Let("v", Load("x", (i_, j_), F32)), Let("take", Binary("gt", v, best, BOOL))],
                    [Select(take, v, best, F32), Select(take, j_, at, INDEX)])
    return Kernel(f"row_reduce{'_parallel' if parallel else ''}{'_dynamic' if sizes else ''}",
                  [Buffer("x", F32, (n, m), "input"), Buffer("sum", F32, (n,), "output"),
                   Buffer("arg", I64, (n,), "output"), Buffer("max", F32, (n,), "output")],
                  [Loop("i", n, [total, Store("sum", (i_,), Var("s", F32)), argmax,
                                 Store("arg", (i_,), Cast(at, I64)), Store("max", (i_,), best)],
                        parallel=parallel)], sizes=list(sizes))


def matmul_dynamic() -> Kernel:
    """c[i, j] = sum_k a[i, k] * b[k, j] with every dim a runtime size."""
    k = idx("k")
    acc = Reduce("k", "K", [Accumulator("acc", F64, Const(0, F64))], [],
                 [Binary("add", Var("acc", F64), Binary("mul", Load("a", (i_, k), F64),
                                                        Load("b", (k, j_), F64), F64), F64)])
    return Kernel("matmul", [Buffer("a", F64, ("M", "K"), "input"), Buffer("b", F64, ("K", "N"), "input"),
                             Buffer("c", F64, ("M", "N"), "output")],
                  [Loop("i", "M", [Loop("j", "N", [acc, Store("c", (i_, j_), Var("acc", F64))])],
                        parallel=True)], sizes=["M", "K", "N"])


def nested_reduce_0d() -> Kernel:
    """The sum of a matrix into a 0-d buffer: a Reduce inside a Reduce, Lets at top level."""
    inner = Reduce("j", 8, [Accumulator("r", F32, Const(0.0, F32))], [],
                   [Binary("add", Var("r", F32), Load("x", (i_, j_), F32), F32)])
    outer = Reduce("i", 4, [Accumulator("t", F32, Const(0.0, F32))], [inner],
                   [Binary("add", Var("t", F32), Var("r", F32), F32)])
    return Kernel("total", [Buffer("x", F32, (4, 8), "input"), Buffer("y", F32, (), "output")],
                  [Let("scale", Const(0.5, F32)), outer,
                   Store("y", (), Binary("mul", Var("t", F32), Var("scale", F32), F32))])


def scoping_and_names() -> Kernel:
    """Sibling loops reuse names; IR names that look like generated ones; odd characters;
    a Reduce without accumulators; an empty loop; a kernel name that must be quoted."""
    body = lambda: [Let("cst", Load("x", (i_,), F32)), Let("v0", Unary("neg", Var("cst", F32), F32)),
                    Let("c0", Unary("exp", Var("v0", F32), F32)),
                    Let("t#1", Binary("add", Var("c0", F32), Const(1.0, F32), F32)),
                    Store("y", (i_,), Var("t#1", F32))]
    return Kernel("odd-names.k", [Buffer("x", F32, (8,), "input"), Buffer("y", F32, (8,), "output")],
                  [Loop("i", 8, body()), Loop("i", 8, body()), Reduce("i", 4, [], [], []),
                   Loop("e", 0, [])])


STRUCTURE_CASES = {k.name: k for k in (
    broadcast_2d(), flat_index(), transpose(), row_reduce(), row_reduce(parallel=True),
    row_reduce(sizes=("n", "m")), matmul_dynamic(), nested_reduce_0d(), scoping_and_names())}
ALL = {**STRUCTURE_CASES, **UNARY_CASES, **BINARY_CASES, **CAST_CASES, **SELECT_CASES, **CONST_CASES}


@pytest.mark.parametrize("name", list(ALL))
def test_kernel_checks_and_prints(name):
    kernel = ALL[name]
    check_kernel(kernel)
    text = print_kernel(kernel)
    assert text.startswith("func.func @") and text.rstrip().endswith("}")
    assert all(not line.startswith(" ") or (len(line) - len(line.lstrip())) % 2 == 0
               for line in text.splitlines())


@needs_mlir_opt
@pytest.mark.mlir
@pytest.mark.parametrize("name", list(STRUCTURE_CASES))
def test_mlir_opt_accepts_kernel(name):
    mlir_opt_accepts(print_kernel(STRUCTURE_CASES[name]))


@needs_mlir_opt
@pytest.mark.mlir
@pytest.mark.parametrize("group", ["structure", "unary", "binary", "cast", "select", "const"])
def test_mlir_opt_accepts_module(group):
    """One mlir-opt run per group of kernels (a module of them; failures name the function)."""
    kernels = {"structure": STRUCTURE_CASES, "unary": UNARY_CASES, "binary": BINARY_CASES,
               "cast": CAST_CASES, "select": SELECT_CASES, "const": CONST_CASES}[group]
    text = print_kernels(kernels.values())
    assert text.startswith("module {\n  func.func @") and text.endswith("}\n")
    mlir_opt_accepts(text)


def test_printer_lowers_exactly_what_the_checker_allows():
    assert set(UNARY_OPS) == {(fn, k) for fn, kinds in UNARY_KINDS.items() for k in kinds}
    assert set(BINARY_OPS) == {(fn, k) for fn, kinds in BINARY_KINDS.items() for k in kinds}
    for fn in L.UNARY + L.BINARY:        # every fn has a float or a bool form
        assert "f" in (UNARY_KINDS | BINARY_KINDS)[fn] or "b" in (UNARY_KINDS | BINARY_KINDS)[fn]


def test_cases_cover_every_fn_and_statement_kind():
    assert {name.split("-")[1] for name in UNARY_CASES} == set(L.UNARY)
    assert {name.split("-")[1] for name in BINARY_CASES} == set(L.BINARY)
    text = "\n".join(print_kernel(k) for k in STRUCTURE_CASES.values())
    for op in ("scf.for", "scf.parallel", "iter_args", "scf.yield", "memref.load", "memref.store",
               "memref<?x?xf64>", "memref<f32>", "index"):
        assert op in text


GOLDEN = """\
func.func @rowsum(%x: memref<2x3xf32>, %y: memref<2xf32>) {
  %c0 = arith.constant 0 : index
  %c2 = arith.constant 2 : index
  %c1 = arith.constant 1 : index
  %cst = arith.constant 0.0 : f32
  %c3 = arith.constant 3 : index
  %cst_0 = arith.constant 0.5 : f32
  scf.parallel (%i) = (%c0) to (%c2) step (%c1) {
    %s = scf.for %j = %c0 to %c3 step %c1 iter_args(%s_iter = %cst) -> (f32) {
      %v0 = memref.load %x[%i, %j] : memref<2x3xf32>
      %e = math.exp %v0 : f32
      %s_next = arith.addf %s_iter, %e : f32
      scf.yield %s_next : f32
    }
    %v1 = arith.mulf %s, %cst_0 : f32
    memref.store %v1, %y[%i] : memref<2xf32>
  }
  func.return
}
"""


def test_golden_text():
    s = Var("s", F32)
    k = Kernel("rowsum", [Buffer("x", F32, (2, 3), "input"), Buffer("y", F32, (2,), "output")],
               [Loop("i", 2, [Reduce("j", 3, [Accumulator("s", F32, Const(0.0, F32))],
                                     [Let("e", Unary("exp", Load("x", (i_, j_), F32), F32))],
                                     [Binary("add", s, Var("e", F32), F32)]),
                              Store("y", (i_,), Binary("mul", s, Const(0.5, F32), F32))],
                      parallel=True)])
    assert print_kernel(k) == GOLDEN
