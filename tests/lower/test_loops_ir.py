"""The loop IR's checker and MLIR printer.

Hand-built kernels (every statement kind, every Unary/Binary fn for each dtype kind it is
defined for, every cast, selects, constants, broadcasting and transposed index maps,
reductions, parallel loops, dynamic sizes) are checked, printed, and fed to mlir-opt
without --allow-unregistered-dialect; one kernel has golden text; a table of broken
kernels gives the IRError message each must produce.
"""
from __future__ import annotations

import ctypes
import dataclasses
import math
import re
import subprocess

import numpy as np
import pytest

from tracecomp.core.dtypes import DType
from tracecomp.core.errors import IRError
from tracecomp.ir.mlir_tool import find_mlir_opt
from tracecomp.lower.loops import ir as L
from tracecomp.lower.loops.ir import (INDEX, Accumulator, Binary, Buffer, Cast, Const, Kernel, Let,
                                   Load, Loop, Reduce, Select, Store, Unary, Var)
from tracecomp.lower.loops.check import (BINARY_KINDS, UNARY_KINDS, check_kernel, dtype_kind,
                                         dtype_name)
from tracecomp.lower.loops.interp import LoopInterpreter
from tracecomp.lower.loops.printer import BINARY_OPS, UNARY_OPS, print_kernel, print_kernels

F32, F64, I32, I64, BOOL = DType.float32, DType.float64, DType.int32, DType.int64, DType.bool
DTYPES = (F32, F64, I32, I64, BOOL, INDEX)
MLIR_OPT = find_mlir_opt()
needs_mlir_opt = pytest.mark.skipif(
    MLIR_OPT is None, reason="mlir-opt not found (not in /usr/lib/llvm-22/bin nor on PATH)")


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


UNARY_CASES = {f"unary-{fn}-{dtype_name(d)}": elementwise(
    f"unary_{fn}_{dtype_name(d)}", [d], lambda x, fn=fn, d=d: Unary(fn, x, d))
    for fn, d in _cases(UNARY_KINDS)}
BINARY_CASES = {f"binary-{fn}-{dtype_name(d)}": elementwise(
    f"binary_{fn}_{dtype_name(d)}", [d, d],
    lambda a, b, fn=fn, d=d: Binary(fn, a, b, BOOL if fn in L.COMPARISONS else d))
    for fn, d in _cases(BINARY_KINDS)}
CAST_CASES = {f"cast-{dtype_name(s)}-{dtype_name(t)}": elementwise(
    f"cast_{dtype_name(s)}_{dtype_name(t)}", [s], lambda x, t=t: Cast(x, t))
    for s in DTYPES for t in DTYPES}
SELECT_CASES = {f"select-{dtype_name(d)}": elementwise(
    f"select_{dtype_name(d)}", [BOOL, d, d], lambda c, a, b, d=d: Select(c, a, b, d))
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


CONST_CASES = {f"const-{dtype_name(d)}": elementwise(f"const_{dtype_name(d)}", [], lambda d=d: _chain(d))
               for d in SPECIAL}


def broadcast_2d() -> Kernel:
    """y[i, j] = x[i, j] + row[0, j] * col[i, 0]: broadcast dims are indexed by Const 0."""
    zero = Const(0, INDEX)
    body = Binary("add", Load("x", (i_, j_), F32), Binary(
        "mul", Load("row", (zero, j_), F32), Load("col", (i_, zero), F32), F32), F32)
    buffers = [Buffer("x", F32, (4, 8), "input"), Buffer("row", F32, (1, 8), "input"),
               Buffer("col", F32, (4, 1), "input"), Buffer("y", F32, (4, 8), "output")]
    return Kernel("broadcast_2d", buffers, [Loop("i", 4, [Loop("j", 8, [Store("y", (i_, j_), body)])])])


def flat_index() -> Kernel:
    """A reshape view: y[i, j] = x[i * 8 + j], and back: z[k] = y[k // 8, k % 8]."""
    flat = Binary("add", Binary("mul", i_, Const(8, INDEX), INDEX), j_, INDEX)
    k = idx("k")
    eight = Const(8, INDEX)
    unflat = (Binary("floordiv", k, eight, INDEX), Binary("mod", k, eight, INDEX))
    return Kernel("flat_index", [Buffer("x", F64, (32,), "input"), Buffer("y", F64, (4, 8), "temp"),
                                 Buffer("z", F64, (32,), "output")],
                  [Loop("i", 4, [Loop("j", 8, [Store("y", (i_, j_), Load("x", (flat,), F64))])]),
                   Loop("k", 32, [Store("z", (k,), Load("y", unflat, F64))])])


def transpose() -> Kernel:
    return Kernel("transpose", [Buffer("x", I32, (8, 4), "input"), Buffer("y", I32, (4, 8), "output")],
                  [Loop("i", 4, [Loop("j", 8, [Store("y", (i_, j_), Load("x", (j_, i_), I32))])])])


def row_reduce(parallel: bool = False, sizes=()) -> Kernel:
    """Row means and row argmax (a pair of accumulators: best value and its index); with
    `sizes`, the dims are runtime sizes and the mean divides by the size parameter m."""
    n, m = (Var(s, INDEX) for s in sizes) if sizes else (4, 8)
    count = Cast(m if sizes else Const(m, INDEX), F32)
    v, best, at = Var("v", F32), Var("best", F32), idx("at")
    take = Var("take", BOOL)
    total = Reduce("j", m, [Accumulator("s", F32, Const(0.0, F32))],
                   [Let("v", Load("x", (i_, j_), F32))], [Binary("add", Var("s", F32), v, F32)])
    argmax = Reduce("j", m, [Accumulator("best", F32, Const(-math.inf, F32)),
                             Accumulator("at", INDEX, Const(0, INDEX))],
                    [Let("v", Load("x", (i_, j_), F32)), Let("take", Binary("gt", v, best, BOOL))],
                    [Select(take, v, best, F32), Select(take, j_, at, INDEX)])
    return Kernel(f"row_reduce{'_parallel' if parallel else ''}{'_dynamic' if sizes else ''}",
                  [Buffer("x", F32, (n, m), "input"), Buffer("mean", F32, (n,), "output"),
                   Buffer("arg", I64, (n,), "output"), Buffer("max", F32, (n,), "output")],
                  [Loop("i", n, [total, Store("mean", (i_,), Binary("div", Var("s", F32), count, F32)),
                                 argmax,
                                 Store("arg", (i_,), Cast(at, I64)), Store("max", (i_,), best)],
                        parallel=parallel)], sizes=list(sizes))


def matmul_dynamic() -> Kernel:
    """c[i, j] = sum_k a[i, k] * b[k, j] with every dim a runtime size."""
    k = idx("k")
    M, K, N = (Var(s, INDEX) for s in "MKN")
    acc = Reduce("k", K, [Accumulator("acc", F64, Const(0, F64))], [],
                 [Binary("add", Var("acc", F64), Binary("mul", Load("a", (i_, k), F64),
                                                        Load("b", (k, j_), F64), F64), F64)])
    buffers = [Buffer("a", F64, (M, K), "input"), Buffer("b", F64, (K, N), "input"),
               Buffer("c", F64, (M, N), "output")]
    return Kernel("matmul", buffers,
                  [Loop("i", M, [Loop("j", N, [acc, Store("c", (i_, j_), Var("acc", F64))])],
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
GROUPS = {"structure": STRUCTURE_CASES, "unary": UNARY_CASES, "binary": BINARY_CASES,
          "cast": CAST_CASES, "select": SELECT_CASES, "const": CONST_CASES}
ALL = {name: k for group in GROUPS.values() for name, k in group.items()}


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
    text = print_kernels(GROUPS[group].values())
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


def _scheduled_kernels() -> list[Kernel]:
    """Every kernel the scheduler makes for the shared op samples, renamed to be unique."""
    import tracecomp as tc
    from tables.op_samples import SAMPLES
    from tracecomp.lower.schedule.scheduler import schedule
    kernels = []
    for s in (s for samples in SAMPLES.values() for s in samples):
        try:
            program = schedule(tc.trace(s.call).lower(*s.inputs).optimized)
        except Exception:     # an error case of the op, or one the scheduler cannot do yet:
            continue          # test_schedule's business; here only what it emits is checked
        kernels += [dataclasses.replace(k, name=f"s{len(kernels) + n}_{k.name}")
                    for n, k in enumerate(program.kernels)]
    return kernels


@pytest.mark.mlir
def test_every_scheduled_kernel_checks_and_mlir_opt_accepts_it():
    """The contract from the scheduler's side: what it emits for every op sample is valid."""
    kernels = _scheduled_kernels()
    assert len(kernels) > 100
    for k in kernels:
        check_kernel(k)
    if MLIR_OPT is not None:
        mlir_opt_accepts(print_kernels(kernels))


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



# --- executing the printed MLIR: mlir-opt -> LLVM dialect -> mlir-translate -> llvmlite JIT ----
LOWER_TO_LLVM = ("--llvm-request-c-wrappers", "--convert-scf-to-cf", "--convert-math-to-funcs",
                 "--convert-math-to-llvm", "--convert-math-to-libm", "--expand-strided-metadata",
                 "--finalize-memref-to-llvm", "--convert-arith-to-llvm", "--convert-cf-to-llvm",
                 "--convert-func-to-llvm", "--reconcile-unrealized-casts")
A = {"f": [0.0, -0.0, 1.5, -2.5, 0.5, -7.25, math.nan, 3.0], "i": [0, -1, 5, -7, 3, 2, -2, 9]}
B = {"f": [2.0, 3.0, -1.5, -2.5, 0.5, 2.0, 1.0, -0.0], "i": [3, 2, -3, 2, -2, 2, 1, 4]}


def _jit(kernels):
    """Compile kernels through upstream MLIR's own lowering into an llvmlite MCJIT engine."""
    llvm = pytest.importorskip("llvmlite.binding")
    translate = MLIR_OPT.replace("mlir-opt", "mlir-translate")
    run = lambda cmd, text: subprocess.run(cmd, input=text, capture_output=True, text=True,
                                           timeout=120, check=True).stdout
    try:
        version = run([translate, "--version"], "")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"{translate} not found")
    if f"version {llvm.llvm_version_info[0]}." not in version:
        pytest.skip(f"llvmlite's LLVM {llvm.llvm_version_info} differs from mlir-translate's")
    ir = run([translate, "--mlir-to-llvmir", "-"],
             run([MLIR_OPT, "-", *LOWER_TO_LLVM], print_kernels(kernels)))
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    machine = llvm.Target.from_default_triple().create_target_machine()
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(ir), machine)
    engine.finalize_object()
    return engine


def _call(engine, kernel: Kernel, arrays: dict, sizes: dict) -> None:
    """Call `_mlir_ciface_<name>` with a memref descriptor per buffer, then the sizes."""
    descs = []
    for a in (arrays[b.name] for b in kernel.buffers):
        rank, i64 = a.ndim, ctypes.c_int64
        desc = type("Desc", (ctypes.Structure,), {"_fields_": [
            ("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p), ("offset", i64),
            ("sizes", i64 * rank), ("strides", i64 * rank)]})
        strides = [st // a.itemsize for st in a.strides]
        descs.append(desc(a.ctypes.data, a.ctypes.data, 0, (i64 * rank)(*a.shape),
                          (i64 * rank)(*strides)))
    fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(descs), *[ctypes.c_int64] * len(sizes))
    fn(engine.get_function_address("_mlir_ciface_" + kernel.name))(
        *[ctypes.addressof(d) for d in descs], *sizes.values())


def _inputs(kernel: Kernel, rng) -> dict:
    """Operands with zeros, -0, NaN and negatives; divisors nonzero; no NaN into int casts."""
    arrays = {}
    for k, b in enumerate(kernel.buffers):
        kind, shape = dtype_kind(b.dtype), tuple(8 if isinstance(d, Var) else d for d in b.shape)
        if b.role != "input" or kind == "b" or math.prod(shape) != 8:
            data = rng.standard_normal(shape) if kind == "f" else rng.integers(0, 2, shape)
        else:
            data = np.reshape((B if k else A)[kind], shape)
            if kernel.name.startswith("cast_float") or kernel.name.startswith("binary_pow_int"):
                data = np.abs(np.nan_to_num(data))
        arrays[b.name] = np.array(data if b.role == "input" else np.zeros(shape), b.dtype.np)
    return arrays


def _static(kernel: Kernel, size: int) -> Kernel:
    """The kernel with every extent and dim that is a size parameter replaced by `size`."""
    fix = lambda e: size if isinstance(e, Var) else e
    def stmt(s):
        if isinstance(s, (Loop, Reduce)):
            return dataclasses.replace(s, extent=fix(s.extent), body=[stmt(t) for t in s.body])
        return s
    return Kernel(kernel.name, [dataclasses.replace(b, shape=tuple(map(fix, b.shape)))
                                for b in kernel.buffers], [stmt(s) for s in kernel.body])


@needs_mlir_opt
@pytest.mark.mlir
@pytest.mark.parametrize("group", ["structure", "unary", "binary", "cast", "select", "const"])
def test_compiled_mlir_agrees_with_the_loop_interpreter(group):
    """The printed MLIR, compiled by MLIR's own lowering, computes what loops_interp does:
    the semantics the printer's tables claim (floored mod, NaN rules, casts, sign...)."""
    kernels = [k for k in GROUPS[group].values() if k.name != "unary_sign_bool"]  # np.sign(bool)
    engine, rng = _jit(kernels), np.random.default_rng(0)
    for k in kernels:
        arrays = _inputs(k, rng)
        expected = {n: a.copy() for n, a in arrays.items()}
        static = _static(k, 8)
        with np.errstate(all="ignore"):      # size parameters used as values are 8 too
            LoopInterpreter(static, expected).block(static.body, {s: 8 for s in k.sizes})
        _call(engine, k, arrays, {s: 8 for s in k.sizes})
        for b in k.buffers:
            np.testing.assert_allclose(arrays[b.name].astype(float), expected[b.name].astype(float),
                                       rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=k.name)


# --- broken kernels ------------------------------------------------------------------------
X = Load("x", (i_,), F32)


def bad(*body, buffers=(), sizes=()) -> Kernel:
    """Kernel 'bad': x f32[8] input, c f32[8] constant, y f32[8] and m i64[4, 8] outputs."""
    return Kernel("bad", [Buffer("x", F32, (8,), "input"), Buffer("c", F32, (8,), "constant"),
                          Buffer("y", F32, (8,), "output"), Buffer("m", I64, (4, 8), "output"),
                          *buffers], list(body), sizes=list(sizes))


def loop(*body, var="i", extent=8, parallel=False) -> Loop:
    return Loop(var, extent, list(body), parallel)


def put(value) -> Loop:
    return loop(Store("y", (i_,), value))


def acc(name="s", dtype=F32, init=None) -> Accumulator:
    return Accumulator(name, dtype, Const(0.0, F32) if init is None else init)


def total(var="j", body=(), init=None) -> Reduce:
    """A sum over `var` in range(8) into accumulator s."""
    return Reduce(var, 8, [acc(init=init)], list(body), [Var("s", F32)])


# (id, kernel, the IRError message after "kernel 'bad'")
BROKEN = [
    ("use-before-def", bad(loop(Store("y", (i_,), Var("t", F32)), Let("t", X))),
     " at Loop i in range(8) > Store y[i]: 't' is used before it is defined"),
    ("let-twice", bad(Let("t", Const(1.0, F32)), Let("t", Const(2.0, F32))),
     " at Let t: 't' is defined twice: by Let t and by Let t"),
    ("shadowed-loop-var", bad(loop(loop(Store("y", (i_,), X)))),
     " at Loop i in range(8) > Loop i in range(8): 'i' is defined twice: by Loop i in range(8)"
     " and by Loop i in range(8)"),
    ("let-shadows-size", bad(Let("n", Const(0, INDEX)), sizes=["n"]),
     " at Let n: 'n' is defined twice: by size parameter and by Let n"),
    ("loop-body-is-local", bad(loop(Let("t", X)), Let("u", Var("t", F32))),
     " at Let u: 't' is used before it is defined"),
    ("reduce-var-is-local", bad(total(), Let("u", idx("j"))),
     " at Let u: 'j' is used before it is defined"),
    ("acc-in-own-init", bad(total(init=Var("s", F32))),
     " at Reduce j in range(8) -> (s): 's' is used before it is defined"),
    ("acc-clashes-with-let", bad(Let("s", Const(1.0, F32)), total()),
     " at Reduce j in range(8) -> (s): 's' is defined twice: by Let s and by Reduce j in "
     "range(8) -> (s)"),
    ("acc-twice-after", bad(total(), total("k")),
     " at Reduce k in range(8) -> (s): 's' is defined twice: by Reduce j in range(8) -> (s) "
     "and by Reduce k in range(8) -> (s)"),
    ("load-unknown-buffer", bad(put(Load("w", (i_,), F32))),
     " at Loop i in range(8) > Store y[i]: Load w[i] names an unknown buffer 'w' (buffers: x, "
     "c, y, m)"),
    ("store-unknown-buffer", bad(loop(Store("w", (i_,), X))),
     " at Loop i in range(8) > Store w[i]: Store w[i] names an unknown buffer 'w' (buffers: x,"
     " c, y, m)"),
    ("load-index-count", bad(loop(Store("y", (i_,), Cast(Load("m", (i_,), I64), F32)))),
     " at Loop i in range(8) > Store y[i]: Load m[i] has 1 index, but buffer 'm' has 2 dims "
     "(shape (4, 8))"),
    ("store-index-count", bad(loop(Store("y", (i_, i_), X))),
     " at Loop i in range(8) > Store y[i, i]: Store y[i, i] has 2 indices, but buffer 'y' has "
     "1 dim (shape (8,))"),
    ("store-dtype", bad(put(Cast(X, F64))),
     " at Loop i in range(8) > Store y[i]: the stored value cast<float64>(x[i]) has dtype "
     "float64, but buffer 'y' holds float32 (Cast the value)"),
    ("store-input", bad(loop(Store("x", (i_,), X))),
     " at Loop i in range(8) > Store x[i]: writes buffer 'x', whose role is 'input' (read-only)"),
    ("store-constant", bad(loop(Store("c", (i_,), X))),
     " at Loop i in range(8) > Store c[i]: writes buffer 'c', whose role is 'constant' "
     "(read-only)"),
    ("index-not-index", bad(loop(Store("y", (Cast(i_, I64),), X))),
     ' at Loop i in range(8) > Store y[cast<int64>(i)]: index 0 of Store y[cast<int64>(i)] has'
     ' dtype int64, expected index (Cast it to index)'),
    ("load-dtype", bad(put(Load("x", (i_,), F64))),
     " at Loop i in range(8) > Store y[i]: Load x[i] has dtype float64, but buffer 'x' holds "
     "float32"),
    ("var-dtype", bad(loop(Store("y", (Var("i", I64),), X))),
     " at Loop i in range(8) > Store y[i]: Var 'i' has dtype int64, but Loop i in range(8) "
     "defines it with dtype index"),
    ("binary-dtypes", bad(put(Binary("add", X, Const(1.0, F64), F32))),
     ' at Loop i in range(8) > Store y[i]: operand dtypes of add(x[i], 1.0) disagree: float32 '
     'vs float64 (Cast one of them)'),
    ("binary-result", bad(put(Binary("add", X, X, F64))),
     ' at Loop i in range(8) > Store y[i]: add(x[i], x[i]) has dtype float64, expected float32'),
    ("comparison-result", bad(put(Binary("lt", X, X, F32))),
     ' at Loop i in range(8) > Store y[i]: lt(x[i], x[i]) has dtype float32, expected bool'),
    ("select-cond", bad(put(Select(X, X, X, F32))),
     ' at Loop i in range(8) > Store y[i]: the condition of select(x[i], x[i], x[i]) has dtype'
     ' float32, expected bool'),
    ("select-arms", bad(put(Select(Const(True, BOOL), X, Const(1, I32), F32))),
     ' at Loop i in range(8) > Store y[i]: select(True, x[i], 1) has dtype float32 but its '
     'arms have float32 and int32'),
    ("unknown-unary", bad(put(Unary("relu", X, F32))),
     " at Loop i in range(8) > Store y[i]: unknown Unary fn 'relu' in relu(x[i]) (known: neg, "
     "abs, sign, floor, ceil, round, exp, exp2, expm1, log, log2, log1p, sin, cos, tan, tanh, "
     "erf, sqrt, rsqrt, not, logical_not)"),
    ("unknown-binary", bad(put(Binary("hypot", X, X, F32))),
     " at Loop i in range(8) > Store y[i]: unknown Binary fn 'hypot' in hypot(x[i], x[i]) "
     "(known: add, sub, mul, div, pow, maximum, minimum, atan2, floordiv, mod, fmod, and, or, xor, "
     "eq, ne, lt, le, gt, ge)"),
    ("unary-kind", bad(put(Cast(Unary("exp", Const(1, I32), I32), F32))),
     " at Loop i in range(8) > Store y[i]: Unary 'exp' is not defined for int32 in exp(1) (it "
     "takes float; Cast the operand)"),
    ("binary-kind", bad(put(Select(Binary("and", X, X, F32), X, X, F32))),
     " at Loop i in range(8) > Store y[i]: Binary 'and' is not defined for float32 in "
     "and(x[i], x[i]) (it takes bool or integer; Cast the operand)"),
    ("index-kind", bad(loop(Store("y", (Binary("div", i_, i_, INDEX),), X))),
     " at Loop i in range(8) > Store y[div(i, i)]: Binary 'div' is not defined for index in "
     "div(i, i) (it takes float or integer; Cast the operand)"),
    ("unary-dtype", bad(put(Unary("neg", X, F64))),
     " at Loop i in range(8) > Store y[i]: neg(x[i]) has dtype float64, but Unary 'neg' keeps "
     "its operand's dtype float32"),
    ("update-count", bad(Reduce("j", 8, [acc(), acc("t")], [], [Var("s", F32)])),
     ' at Reduce j in range(8) -> (s, t): 2 accumulators but 1 update; give one update per '
     'accumulator'),
    ("update-dtype", bad(Reduce("j", 8, [acc()], [], [Const(1, I64)])),
     " at Reduce j in range(8) -> (s): accumulator 's' of dtype float32 has update 1 of dtype "
     "int64"),
    ("init-dtype", bad(Reduce("j", 8, [acc(init=Const(0, I64))], [], [Var("s", F32)])),
     " at Reduce j in range(8) -> (s): accumulator 's' of dtype float32 has init 0 of dtype int64"),
    ("reduce-body-store", bad(total(body=[Store("y", (idx("j"),), X)])),
     ' at Reduce j in range(8) -> (s) > Store y[j]: a Reduce body holds only Let and Reduce '
     'statements, not Store'),
    ("extent-negative", bad(loop(extent=-1)),
     ' at Loop i in range(-1): extent -1 is neither an int >= 0 nor a size parameter (no sizes'
     ' declared)'),
    ("extent-unknown-size", bad(loop(extent=Var("n", INDEX)), sizes=["m"]),
     " at Loop i in range(n): extent n is neither an int >= 0 nor a size parameter (sizes: m)"),
    ("extent-name-not-expression", bad(loop(extent="n"), sizes=["n"]),     # one size form: Var("n")
     " at Loop i in range('n'): extent 'n' is neither an int >= 0 nor a size parameter (sizes: n)"),
    ("extent-float", bad(Reduce("j", 2.0, [], [], [])),
     ' at Reduce j in range(2.0) -> (): extent 2.0 is neither an int >= 0 nor a size parameter'
     ' (no sizes declared)'),
    ("parallel-in-parallel", bad(loop(loop(var="j", parallel=True), parallel=True)),
     ' at parallel Loop i in range(8) > parallel Loop j in range(8): parallel Loop j is nested'
     ' inside parallel Loop i in range(8); only one loop of a nest may be parallel (make the '
     'inner one sequential)'),
    ("const-kind", bad(put(Cast(Const(1.5, I32), F32))),
     ' at Loop i in range(8) > Store y[i]: Const 1.5 is not an integer value, but has dtype int32'),
    ("const-int-range", bad(put(Cast(Const(2 ** 31, I32), F32))),
     ' at Loop i in range(8) > Store y[i]: Const 2147483648 is out of range for int32'),
    ("const-float-range", bad(put(Const(1e39, F32))),
     ' at Loop i in range(8) > Store y[i]: Const 1e+39 is out of range for float32 (use inf '
     'explicitly)'),
    ("const-bool-for-float", bad(put(Const(True, F32))),
     ' at Loop i in range(8) > Store y[i]: Const True is not a float value, but has dtype float32'),
    ("bad-dtype", bad(put(Cast(Const(1.0, "float16"), F32))),
     " at Loop i in range(8) > Store y[i]: 1.0 has dtype 'float16'; expected a tracecomp DType"
     " or 'index'"),
    ("not-a-statement", bad(X),
     ': x[i] (Load) is not a statement (expected Let, Store, Loop, Reduce, Matmul or PackB)'),
    ("not-an-expression", bad(put(1.0)),
     ' at Loop i in range(8) > Store y[i]: 1.0 (float) is not an expression (expected Const, '
     'Var, Load, Unary, Binary, Select, Cast or CheckedIndex)'),
    ("buffer-twice", bad(buffers=[Buffer("x", F32, (8,), "output")]),
     ": two buffers are named 'x'"),
    ("buffer-dim", bad(buffers=[Buffer("w", F32, ("n", 8), "output")]),
     ": buffer 'w' has dim 'n' in shape ('n', 8), neither an int >= 0 nor a size parameter (no"
     " sizes declared)"),
    ("buffer-role", bad(buffers=[Buffer("w", F32, (8,), "scratch")]),
     ": buffer 'w' has role 'scratch', expected one of input, output, temp, constant, errors"),
    ("buffer-dtype", bad(buffers=[Buffer("w", INDEX, (8,), "temp")]),
     ": buffer 'w' has dtype 'index'; buffers hold a tracecomp DType"),
    ("empty-kernel-name", Kernel("", [], []),
     ": the kernel name must be a non-empty string"),
]


@pytest.mark.parametrize("kernel, message", [(k, m) for _, k, m in BROKEN],
                         ids=[name for name, _, _ in BROKEN])
def test_broken_kernel_message(kernel, message):
    with pytest.raises(IRError) as info:
        check_kernel(kernel)
    assert str(info.value) == f"kernel '{kernel.name}'" + message
    with pytest.raises(IRError):          # the printer checks first
        print_kernel(kernel)


def test_valid_scoping_is_accepted():
    """Accumulators are visible after their Reduce; sibling scopes may reuse names."""
    check_kernel(bad(total(), Let("u", Var("s", F32)), loop(Let("t", X)), loop(Let("t", X)),
                     loop(Store("y", (i_,), X), parallel=True), loop(parallel=True)))


def test_module_needs_distinct_kernel_names():
    with pytest.raises(IRError, match="two kernels are named 'transpose'"):
        print_kernels([transpose(), transpose()])
