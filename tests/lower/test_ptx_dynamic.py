"""Dynamic sizes on the PTX path (issue 36): kernels that take the run-time sizes as
parameters, grids evaluated per call, buffers sized per call, host loops over a tile count
known at run time; one compile (`tc.trace(fn, device="cuda", dynamic=...)`) run on the host
emulator at three sizes against eager; `tc.export(..., target="cuda", dynamic=...)` PTX
assembled by ptxas, its JSON naming the sizes and evaluable at any size."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.core.symbolic import DynamicShapeError
from tracecomp.lower.nvptx import launch as L
from tracecomp.lower.nvptx.grid import Blocks, grid_dim, size_text
from tracecomp.lower.nvptx.hostloops import HostLoop, in_order
from tracecomp.lower.loops.ir import Binary, Const, INDEX, Var
from tracecomp.runtime.cuda.ptxas import assemble, find_ptxas

F = tc.nn.functional
RNG = np.random.default_rng(36)
needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) is not installed")


@pytest.fixture(autouse=True)
def emulator(monkeypatch):
    monkeypatch.setenv("TRACECOMP_CUDA_EMULATOR", "1")


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _eager(fn, args):
    out = fn(*[tc.tensor(a) for a in args])
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


def _run_sizes(fn, make, dynamic, sizes, tol=2e-5):
    """fn compiled once for CUDA with `dynamic` dims, run at each size (args make(n))
    against eager; returns the traced function."""
    f = tc.trace(fn, device="cuda", dynamic=dynamic)
    for n in sizes:
        args = make(n)
        out = f(*args)
        got = [np.asarray(o.cpu()) for o in (out if isinstance(out, (list, tuple)) else [out])]
        want = _eager(fn, args)
        assert [g.shape for g in got] == [w.shape for w in want]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    assert len(f.signatures) == 1, f.signatures      # one compile served every size
    return f


def _launches(f, *args):
    return f.lower(*args).compiled.gpu.launches


# ---------------------------------------------------------------- one compile, three sizes

CHAIN = lambda x: ((x * 2 + 1).exp() * 0.5).tanh() + x.sin()


def test_elementwise_chain_grid_follows_the_size():
    """300 x 3 is not a multiple of the block size (256), 2 x 3 and 7 x 3 not of the 4
    points a thread takes per step (vector.py's tail); the grid is an expression."""
    f = _run_sizes(CHAIN, lambda n: [_f32(n, 3)], {"x": {0: "n"}}, (2, 7, 300))
    (launch,) = _launches(f, _f32(5, 3))
    assert launch.kind == "elementwise" and launch.vector == 4 and isinstance(launch.grid[0], Blocks)
    assert launch.grid_at({"size_n": 300}) == (-(-900 // 256), 1, 1)
    assert launch.grid_at({"size_n": 10 ** 8}) == (L.VECTOR_BLOCKS, 1, 1)
    assert launch.params[-1] == "size_n"


def test_softmax_rows_and_column_sums():
    """Rows of a run-time length (a block per row, the row's threads share it)."""
    _run_sizes(lambda x: x.softmax(dim=-1), lambda n: [_f32(2, n)], {"x": {1: "n"}}, (2, 9, 33))
    _run_sizes(lambda x: (x.sum(dim=0), x.amax(dim=1)), lambda n: [_f32(n, 5)], {"x": {0: "n"}}, (2, 9, 33))


def test_matmul_over_a_dynamic_batch_and_inner_size():
    """m and k known at run time (67: not a multiple of the 64 tile); a batched product
    with a dynamic batch."""
    _run_sizes(lambda a, b: a @ b, lambda n: [_f32(n, n + 1), _f32(n + 1, 5)],
               {"a": {0: "m", 1: "k"}, "b": {0: "k"}}, (2, 9, 67))
    _run_sizes(lambda a, b: a @ b, lambda n: [_f32(n, 3, 4), _f32(n, 4, 2)], {"a": {0: "b"}, "b": {0: "b"}},
               (2, 3, 5))


def test_a_dynamic_product_chooses_its_tiles_per_call(monkeypatch):
    """Both matmul kernels are compiled; the tile count at 128 x 128 picks one per call
    (large_matmul's rule, its threshold lowered so the emulator runs the large one)."""
    monkeypatch.setattr(L, "LARGE_MATMUL_MIN_TILES", 2)
    f = tc.trace(lambda a, b: a @ b, device="cuda", dynamic={"a": {0: "m"}})
    b = _f32(9, 70)
    ran = []
    runner = f.lower(_f32(3, 9), b).compiled
    launch = runner.ctx.launch
    monkeypatch.setattr(runner.ctx, "launch", lambda fn, *a, **k: (ran.append(fn[1]), launch(fn, *a, **k)))
    for m in (3, 129):
        a = _f32(m, 9)
        np.testing.assert_allclose(np.asarray(f(a, b).cpu()), a @ b, rtol=2e-5, atol=2e-5)
    large, small = runner.gpu.launches
    assert (large.tile, small.tile) == (L.LARGE_TILE, L.MATMUL_TILE)
    assert ran == [small.name, large.name]
    when = large.when.to_json()
    assert when["at_least"] == 2 and [eval(when["value"], {}, {"m": m}) for m in (3, 129, 300)] == [1, 2, 3]
    assert small.when.to_json()["below"] == 2


def test_a_long_row_of_run_time_length_is_split_where_it_is_long_enough(monkeypatch):
    """Partials over a fixed number of chunks, each as long as the row needs (some empty:
    n = 4 over 3 chunks of 2), or one block where the row is short; thresholds lowered for
    the emulator."""
    monkeypatch.setattr(L, "SPLIT_MIN_EXTENT", 4)
    monkeypatch.setattr(L, "DYNAMIC_SPLIT_CHUNKS", 3)
    for fn in (lambda x: x.sum(), lambda x: x.argmax()):
        f = _run_sizes(fn, lambda n: [_f32(n) - 10], {"x": {0: "n"}}, (3, 4, 64))
        launches = _launches(f, _f32(5))
        assert [(l.kind, str(l.when)) for l in launches] == [("partials", "n >= 4"), ("finish", "n >= 4"),
                                                              ("rows", "n < 4")]


def test_layernorm_mlp_forward():
    def mlp(x, ln_w, ln_b, w1, b1, w2):
        return F.gelu(F.layer_norm(x, (6,), ln_w, ln_b) @ w1 + b1) @ w2
    weights = [_f32(6), _f32(6), _f32(6, 8), _f32(8), _f32(8, 6)]
    _run_sizes(mlp, lambda n: [_f32(n, 6)] + weights, {"x": {0: "batch"}}, (2, 5, 9), tol=1e-4)


def test_attention_over_a_dynamic_sequence_runs_its_tile_loops_on_the_host():
    """The tile counts are run-time values: the launches inside take the loop vars."""
    qkv = {name: {1: "seq"} for name in "qkv"}
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    f = _run_sizes(fn, lambda n: [_f32(1, n, 8) for _ in range(3)], qkv, (2, 3, 9), tol=1e-4)
    launches = _launches(f, *[_f32(2, 4, 8) for _ in range(3)])
    looped = [l for l in launches if l.loops]
    assert looped and all(l.kernel.sizes[-len(l.loops):] == [h.var for h in l.loops] for l in looped)


@pytest.mark.slow
def test_attention_with_full_tiles_and_a_short_last_one():
    """Sequences past the 64-row tile: the host loops run (causal: a triangular nest)."""
    qkv = {name: {1: "seq"} for name in "qkv"}
    for causal in (True, False):
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        _run_sizes(fn, lambda n: [_f32(1, n, 8) for _ in range(3)], qkv, (3, 70, 130), tol=1e-4)


@pytest.mark.slow
def test_train_step_with_a_dynamic_batch():
    def loss(w1, b1, w2, b2, x, y):
        return F.cross_entropy(tc.relu(x @ w1 + b1) @ w2 + b2, y)
    grad = tc.grad(loss, argnums=(0, 1, 2, 3))

    def step(w1, b1, w2, b2, x, y):
        return tuple(p - 0.1 * g for p, g in zip((w1, b1, w2, b2), grad(w1, b1, w2, b2, x, y)))
    weights = [_f32(6, 8), _f32(8), _f32(8, 3), _f32(3)]
    _run_sizes(step, lambda n: weights + [_f32(n, 6), RNG.integers(0, 3, n)],
               {"x": {0: "batch"}, "y": {0: "batch"}}, (2, 5, 9), tol=1e-4)


# ---------------------------------------------------------------- errors

def test_a_call_whose_shapes_break_the_size_equations_names_the_input():
    f = tc.trace(lambda x, y: x + y, device="cuda", dynamic={"x": {0: "n"}, "y": {0: "n"}})
    f(_f32(3, 2), _f32(3, 2))
    runner = f.lower(_f32(3, 2), _f32(3, 2)).compiled
    with pytest.raises(tc.ArgumentError, match="input 1 axis 0 must be n = 4"):
        runner.on_host([_f32(4, 2), _f32(5, 2)])
    with pytest.raises(tc.ArgumentError, match="input 0 axis 1 must be 2"):
        runner.on_host([_f32(4, 3), _f32(4, 3)])


def test_a_kernel_without_a_ptx_lowering_names_its_op_line_and_sizes(monkeypatch):
    from tracecomp.core.errors import BackendError
    from tracecomp.lower.nvptx import program

    def refuse(kernel):
        raise BackendError("no PTX lowering for this nest")
    monkeypatch.setattr(program, "plan_kernel", refuse)
    f = tc.trace(lambda x: x.exp(), device="cuda", dynamic={"x": {0: "n"}})
    with pytest.raises(BackendError, match=r"no PTX lowering for this nest \(PTX for tc.exp at .*test_ptx_dynamic.py:"
                                           r"\d+.*; dynamic sizes n\)"):
        f(_f32(3))


def test_random_draws_keep_static_shapes():
    f = tc.trace(lambda x: F.dropout(x, 0.5), device="cuda", dynamic={"x": {0: "n"}})
    with pytest.raises(DynamicShapeError, match="random draws"):
        f(_f32(4, 2))


def test_the_ptx_stage_of_a_dynamic_trace_needs_no_gpu(monkeypatch):
    from tracecomp.runtime.cuda import driver
    if driver.available():
        pytest.skip("a GPU is here: the dynamic compile loads the module")
    monkeypatch.delenv("TRACECOMP_CUDA_EMULATOR")
    f = tc.trace(CHAIN, device="cuda", dynamic={"x": {0: "n"}})
    ptx = f.lower(_f32(5, 3)).as_text("ptx")
    assert re.search(r"\.param \.u64 \w+_param_2", ptx)        # (in0, out, size_n)
    with pytest.raises(tc.TracecompError, match="CUDA is not available"):
        f(_f32(5, 3))


# ---------------------------------------------------------------- grids and host loops

def test_grid_dims_are_ints_expressions_or_the_cap():
    n, qb = Var("size_n", INDEX), Var("qb", INDEX)
    assert grid_dim([4, 100], 256, 9) == 2
    blocks = grid_dim([n, 3], 256, 65535)
    assert isinstance(blocks, Blocks) and blocks.at({"size_n": 1000}) == 12 and blocks.at({"size_n": 1}) == 1
    assert blocks.to_json()["points"] == "(n * 3)"
    assert grid_dim([qb], 64, 7) == 7                       # a loop var the host does not know
    assert grid_dim([Binary("minimum", qb, n, INDEX)], 1, 9, {"qb"}).at({"qb": 2, "size_n": 5}) == 2
    assert size_text(Binary("floordiv", n, Const(64, INDEX), INDEX)) == "(n // 64)"


def test_host_loops_run_their_launches_in_order():
    n = Var("size_n", INDEX)
    outer = HostLoop("qb", n, [])
    inner = HostLoop("kb", Binary("add", Var("qb", INDEX), Const(1, INDEX), INDEX), [])

    class Call:
        def __init__(self, name, loops):
            self.name, self.loops = name, loops
    calls = [Call("a", ()), Call("b", (outer,)), Call("c", (outer, inner)), Call("d", (outer,)), Call("e", ())]
    ran = [(c.name, e.get("qb"), e.get("kb")) for c, e in in_order(calls, {"size_n": 2})]
    assert ran == [("a", None, None), ("b", 0, None), ("c", 0, 0), ("d", 0, None),
                   ("b", 1, None), ("c", 1, 0), ("c", 1, 1), ("d", 1, None), ("e", None, None)]


# ---------------------------------------------------------------- export

def _export(tmp_path, fn, args, dynamic):
    path = str(tmp_path / "model.ptx")
    described = tc.export(fn, args, path, target="cuda", dynamic=dynamic)
    with open(tmp_path / "model.json") as f:
        assert json.load(f) == json.loads(json.dumps(described))
    with open(path) as f:
        return described, f.read()


def _grid(dims, sizes: dict) -> list[int]:
    """What a loader does with a launch's grid: min(ceil(points / per_block), max)."""
    return [d if isinstance(d, int) else min(-(-eval(d["points"], {}, sizes) // d["per_block"]), d["max"])
            for d in dims]


def test_exported_json_names_the_sizes_and_evaluates_at_any_size(tmp_path):
    fn = lambda x, w: (x @ w).softmax(dim=1) + x.sum(dim=1, keepdim=True)
    meta, _ = _export(tmp_path, fn, [_f32(5, 8), _f32(8, 8)], {"x": {0: "batch"}})
    assert meta["sizes"] == ["batch"] and meta["dynamic"] == [{"name": "batch", "input": 0, "axis": 0}]
    assert meta["inputs"][0]["shape"] == ["batch", 8] and meta["outputs"][0]["shape"] == ["batch", 8]
    assert all("size_batch" in launch["params"] for launch in meta["launches"])
    planned = tc.trace(fn, device="cuda", dynamic={"x": {0: "batch"}}).lower(_f32(5, 8), _f32(8, 8))
    for n in (1, 77, 5000):
        want = [list(l.grid_at({"size_batch": n})) for l in planned.compiled.gpu.launches]
        assert [_grid(launch["grid"], {"batch": n}) for launch in meta["launches"]] == want


@needs_ptxas
def test_exported_dynamic_ptx_assembles(tmp_path):
    def model(x, mask_w, w):
        h = F.layer_norm(x, (8,)) @ w
        return F.scaled_dot_product_attention(h, h, h, is_causal=True) * mask_w
    meta, ptx = _export(tmp_path, model, [_f32(2, 5, 8), _f32(8), _f32(8, 8)], {"x": {1: "seq"}})
    figures = assemble(ptx, meta["arch"])
    assert {launch["entry"] for launch in meta["launches"]} == set(figures)
    looped = [launch for launch in meta["launches"] if "loops" in launch]
    assert looped and all(launch["loops"][-1]["var"] in launch["params"] for launch in looped)
    assert any("seq" in loop["trips"] for launch in looped for loop in launch["loops"])


def _dynamic_table(every: int = 1):
    """(sample, Lowered) of every `every`-th op sample traced with each of its inputs' dims
    of size >= 2 dynamic (those that trace so: others read a size as a number, or are
    error cases)."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from tables.op_samples import SAMPLES
    out = []
    for s in [s for name, ss in SAMPLES.items() if name not in ("rand", "randn") for s in ss][::every]:
        dynamic = {i: {a: f"d{i}_{a}" for a, n in enumerate(np.shape(x)) if n >= 2} for i, x in enumerate(s.inputs)}
        dynamic = {i: d for i, d in dynamic.items() if d}
        try:
            lowered = tc.trace(s.call).lower_dynamic(tuple(s.inputs), dynamic) if dynamic else None
            if lowered is not None and any(k.sizes for k in lowered.program.kernels):
                out.append((s, lowered))
        except tc.TracecompError:
            continue
    return out


@needs_ptxas
@pytest.mark.slow
def test_op_table_kernels_over_dynamic_sizes_assemble():
    """About 1100 programs, 60 per module: measured 3 minutes on a loaded 2-core machine."""
    from tracecomp.lower.nvptx.program import compile_batch
    programs = [lowered.program for _, lowered in _dynamic_table()]
    assert len(programs) > 500
    for lo in range(0, len(programs), 60):
        ptx, launches = compile_batch(programs[lo:lo + 60], "sm_90")
        assert {l.name for ls in launches for l in ls} == set(assemble(ptx, "sm_90"))


@pytest.mark.slow
def test_op_table_samples_over_dynamic_sizes_run_on_the_emulator():
    """Every 7th op sample (about 170), its dims dynamic, on the emulator against the CPU
    backend's compile of the same dynamic program (2.5 minutes)."""
    from tracecomp.runtime.cuda.emulator import EmulatedContext
    from tracecomp.runtime.cuda.runner import CudaProgram
    ctx = EmulatedContext()
    cases = _dynamic_table(every=7)
    assert len(cases) > 100
    for s, lowered in cases:
        want = lowered.compiled(list(s.inputs))
        got = CudaProgram(lowered.program, ctx).on_host(list(s.inputs))
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=1e-4, atol=1e-4,
                                       err_msg=f"{s.op}: {s.desc}")


def test_static_export_is_unchanged(tmp_path):
    meta, _ = _export(tmp_path, CHAIN, [_f32(4, 3)], None)
    assert "sizes" not in meta and all(isinstance(d, int) for launch in meta["launches"] for d in launch["grid"])


@pytest.mark.slow
def test_the_gpu_check_runs_its_dynamic_cases(tmp_path):
    """benchmarks/gpu_check.py's DYN step, on the emulator at its small sizes."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    import gpu_check
    assert gpu_check.main(["--emulator", "--quick", "--no-tests", "--workloads", "DYN", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "gpu_check.json").read_text())["dynamic"]
    assert len(rows) == 5 and all(r["ok"] and r["compiles"] == 1 for r in rows)
    assert "| causal attention |" in (tmp_path / "gpu_check.md").read_text()
