"""The PTX path without a GPU: every kernel of the op table and of an MLP training step
compiled for sm_80 and sm_90 and assembled by NVIDIA's ptxas (skipped with a reason when
ptxas is missing); launch planning; the PTX's shape (grid-stride loops, shuffles, shared
memory, atomics, 64-bit indices); ptxas -v parsing."""
import re

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.core.errors import BackendError
from tracecomp.lower.nvptx import target as nvptx_target
from tracecomp.lower.nvptx.launch import plan_kernel
from tracecomp.lower.nvptx.program import compile_batch, compile_program
from tracecomp.runtime.cuda.ptxas import assemble, find_ptxas, parse_verbose

from tables.op_samples import SAMPLES

ARCHS = ("sm_80", "sm_90")
needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) is not installed")
CASES = [s for name, ss in SAMPLES.items() if name not in ("rand", "randn") for s in ss]
BATCH = 120       # programs per module: one LLVM run and one ptxas run per batch and arch


def _program(call, *inputs):
    return tc.trace(call).lower(*inputs).program


def _table_programs(lo: int, hi: int):
    programs = []
    for s in CASES[lo:hi]:
        try:
            programs.append(_program(s.call, *s.inputs))
        except tc.TracecompError:
            pass        # an error case: it never reaches a backend
    return programs


def _assemble_all(programs, arch):
    ptx, launches = compile_batch(programs, arch)
    assert f".version {nvptx_target.ptx_isa(arch)}" in ptx and f".target {arch}" in ptx
    figures = assemble(ptx, arch)
    names = {launch.name for ls in launches for launch in ls}
    assert names == set(figures), names ^ set(figures)
    return launches, figures


@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("lo", range(0, len(CASES), BATCH))
def test_op_table_kernels_assemble(lo, arch):
    programs = _table_programs(lo, lo + BATCH)
    _assemble_all(programs, arch)


def mlp_loss(w1, b1, w2, b2, x, target):
    h = tc.relu(x @ w1 + b1)
    return tc.cross_entropy(h @ w2 + b2, target)


def _mlp_inputs(batch=32, d_in=64, hidden=48, classes=10):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((d_in, hidden), np.float32) * 0.1, np.zeros(hidden, np.float32),
            rng.standard_normal((hidden, classes), np.float32) * 0.1, np.zeros(classes, np.float32),
            rng.standard_normal((batch, d_in), np.float32), rng.integers(0, classes, batch))


@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
def test_mlp_training_step_assembles(arch):
    step = tc.trace(tc.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3)))
    program = step.lower(*_mlp_inputs()).program
    launches, figures = _assemble_all([program], arch)
    kinds = {launch.kind for launch in launches[0]}
    assert {"matmul", "rows", "elementwise"} <= kinds
    assert all(f.spill_stores == 0 for f in figures.values())


def _ptx_and_plan(fn, *inputs):
    g = compile_program(_program(fn, *inputs))
    return g.ptx, g.launches


def test_elementwise_is_a_grid_stride_loop_with_32_bit_indices():
    ptx, launches = _ptx_and_plan(lambda x: x * tc.sigmoid(1.702 * x) + 0.5 * tc.sin(x) * tc.exp(-x * x),
                                  np.ones((64, 100), np.float32))
    assert [l.kind for l in launches] == ["elementwise"]
    assert launches[0].block == (256, 1, 1) and launches[0].grid == (25, 1, 1)
    assert "%nctaid.x" in ptx and "%ctaid.x" in ptx
    assert "call" not in ptx            # transcendentals are inlined polynomials, no libdevice


def test_huge_iteration_spaces_use_64_bit_indices():
    a, b = np.ones((1 << 16, 1), np.float32), np.ones((1, 1 << 15), np.float32)
    ptx, launches = _ptx_and_plan(lambda a, b: a + b, a, b)
    assert launches[0].grid == (65535, 1, 1)
    body = ptx[ptx.index(".entry"):]
    assert re.search(r"setp\.\w+\.[us]64\s+%p\d+, %rd\d+, 2147483648", body)     # the 64-bit flat bound


def test_reduction_uses_shuffles_and_shared_memory():
    ptx, launches = _ptx_and_plan(lambda x: x.sum(dim=1), np.ones((8, 1000), np.float32))
    assert [l.kind for l in launches] == ["rows"]
    assert launches[0].block == (256, 1, 1) and launches[0].grid == (8, 1, 1)
    assert "shfl.sync.bfly" in ptx and "bar.sync" in ptx and ".shared" in ptx


def test_argmax_over_long_rows_is_a_block_search():
    ptx, launches = _ptx_and_plan(lambda x: x.argmax(dim=1), np.ones((8, 1000), np.float32))
    assert [l.kind for l in launches] == ["rows"] and "shfl.sync.bfly" in ptx
    _, launches = _ptx_and_plan(lambda x: x.argmax(), np.ones(1 << 20, np.float32))
    assert [l.kind for l in launches] == ["partials", "finish"]
    assert [w.dtype.label for w in launches[0].workspaces] == ["float32", "int64"]


def test_short_rows_take_one_thread_each():
    _, launches = _ptx_and_plan(lambda x: x.amax(dim=1), np.ones((1000, 10), np.float32))
    assert [l.kind for l in launches] == ["elementwise"]


def test_long_rows_are_split_over_blocks_and_finished_in_a_second_pass():
    _, launches = _ptx_and_plan(lambda x: x.sum(), np.ones(1 << 20, np.float32))
    assert [l.kind for l in launches] == ["partials", "finish"]
    part, fin = launches
    assert part.grid == (256, 1, 1) and fin.grid == (1, 1, 1)
    assert part.workspaces[0].elements == 256 and part.workspaces == fin.workspaces


def test_column_reductions_give_each_thread_a_column():
    """amax(0) has no atomic: a thread per column walks the rows (it used to be one thread
    for everything); a sum over many columns does the same instead of atomics, one over
    few columns keeps them."""
    ptx, launches = _ptx_and_plan(lambda x: x.amax(0), np.ones((300, 70), np.float32))
    assert [l.kind for l in launches] == ["elementwise", "columns"]
    assert not re.search(r"(red|atom)\.global", ptx)
    _, launches = _ptx_and_plan(lambda x: x.sum(0), np.ones((64, 4096), np.float32))
    assert [l.kind for l in launches] == ["elementwise", "columns"] and launches[1].grid == (16, 1, 1)
    ptx, launches = _ptx_and_plan(lambda x: x.sum(0), np.ones((4096, 512), np.float32))
    assert [l.kind for l in launches] == ["elementwise", "elementwise"]
    assert re.search(r"(red|atom)\.global\.add\.f32", ptx)


@needs_ptxas
def test_column_reductions_assemble():
    ptx, _ = _ptx_and_plan(lambda x: (x.amax(0), x.prod(1), (x > 0).all(0)), np.ones((300, 70), np.float32))
    assemble(ptx, "sm_80")


def test_scatter_add_uses_atomics():
    ptx, launches = _ptx_and_plan(lambda x, i, v: x.index_add(0, i, v), np.zeros((5, 3), np.float32),
                                  np.array([0, 4, 0]), np.ones((3, 3), np.float32))
    assert [l.kind for l in launches] == ["elementwise", "elementwise"]
    assert re.search(r"(red|atom)\.global\.add\.f32", ptx)


def test_matmul_is_tiled_through_shared_memory_with_its_epilogue():
    ptx, launches = _ptx_and_plan(lambda a, b, c: tc.relu(a @ b + c), np.ones((40, 30), np.float32),
                                  np.ones((30, 20), np.float32), np.ones(20, np.float32))
    assert [l.kind for l in launches] == ["matmul"]
    assert launches[0].block == (16, 16, 1) and launches[0].grid == (1, 1, 1)
    assert launches[0].shared_bytes == (16 * 65 + 16 * 64) * 4          # a (padded) and b slices
    assert "bar.sync" in ptx and "fma.rn.f32" in ptx and "max" in ptx


def test_kernels_with_dependent_statements_keep_their_order():
    k = _program(lambda x, i, v: x.index_add(0, i, v), np.zeros((5, 3), np.float32),
                 np.array([0, 4, 0]), np.ones((3, 3), np.float32)).kernels[-1]
    names = [launch.name for launch in plan_kernel(k)]
    assert names == [f"{k.name}_s0", f"{k.name}_s1"]


def test_default_arch_and_isa_versions():
    assert nvptx_target.DEFAULT_ARCH == "sm_80"
    assert nvptx_target.ptx_isa("sm_80") == "7.0" and nvptx_target.ptx_isa("sm_90") == "7.8"
    with pytest.raises(tc.ArgumentError, match="unknown CUDA architecture 'sm_35'"):
        compile_program(_program(lambda x: x + 1, np.ones(3, np.float32)), "sm_35")


def test_ptx_stage_prints():
    low = tc.trace(lambda x: x.exp().sum()).lower(np.ones((4, 4), np.float32))
    assert ".entry" in low.as_text("ptx")


@needs_ptxas
def test_ptxas_rejections_raise_with_its_diagnostics():
    with pytest.raises(BackendError, match=r"ptxas -arch=sm_80 rejected the PTX[\s\S]*<ptx>"):
        assemble(".version 7.0\n.target sm_80\n.address_size 64\n.visible .entry k() { bogus; }\n", "sm_80")


def test_parse_verbose_reads_every_entry():
    text = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k0_add' for 'sm_80'
ptxas info    : Function properties for k0_add
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers, 128 bytes smem, 368 bytes cmem[0]
ptxas info    : Compiling entry function 'k1_sum' for 'sm_80'
ptxas info    : Function properties for k1_sum
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 368 bytes cmem[0]
"""
    figs = parse_verbose(text)
    assert figs["k0_add"].registers == 12 and figs["k0_add"].spill_stores == 4
    assert figs["k0_add"].shared_bytes == 128 and figs["k0_add"].barriers == 1
    assert figs["k0_add"].stack_bytes == 8
    assert figs["k1_sum"].registers == 8 and figs["k1_sum"].shared_bytes == 0


def test_export_target_cuda_writes_ptx_and_its_launches(tmp_path):
    import json
    x, w = np.ones((8, 4), np.float32), np.ones((4, 3), np.float32)
    md = tc.export(lambda x, w: tc.softmax(x @ w, dim=1), [x, w], str(tmp_path / "model.ptx"), target="cuda")
    ptx = (tmp_path / "model.ptx").read_text()
    js = json.loads((tmp_path / "model.json").read_text())
    assert js == json.loads(json.dumps(md)) and js["arch"] == "sm_80" and js["name"] == "model"
    assert [i["shape"] for i in js["inputs"]] == [[8, 4], [4, 3]] and js["outputs"][0]["shape"] == [8, 3]
    for launch in js["launches"]:
        assert f".entry {launch['entry']}(" in ptx
        assert all(p in js["buffers"] for p in launch["params"])
    assert js["launches"][0]["kind"] == "matmul" and js["launches"][0]["block"] == [16, 16, 1]
    with pytest.raises(tc.ArgumentError, match="unknown target 'tpu'"):
        tc.export(lambda x: x, [x], str(tmp_path / "m.ptx"), target="tpu")
    if find_ptxas():
        assemble(ptx, "sm_80")


@needs_ptxas
def test_cli_dump_ptx_prints_launches_and_ptxas_figures(tmp_path, monkeypatch, capsys):
    from tracecomp.cli import main
    (tmp_path / "gpumodel.py").write_text(
        "import tracecomp as tc\n"
        "def linear(x, w, b):\n    return tc.relu(x @ w + b).sum(dim=1)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["dump", "gpumodel:linear", "--input", "f32[64,32]", "--input", "f32[32,48]",
                 "--input", "f32[48]", "--stage", "ptx", "--arch", "sm_90"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("// tracecomp: @linear for sm_90 (PTX ISA 7.8)")
    assert re.search(r"// \S+_matmul: matmul, block 16x16x1, grid 1x1x1, 8256 bytes static shared\n"
                     r"//   ptxas -v: \d+ registers, 0 bytes spill stores", out)
    assert re.search(r"// \S+_add_relu_sum: elementwise, block 256x1x1, grid 1x1x1", out)
    assert ".target sm_90" in out


def _mlir_opt(text: str, *passes: str) -> str:
    import subprocess
    from tracecomp.ir.mlir_tool import find_mlir_opt
    proc = subprocess.run([find_mlir_opt(), *passes, "-"], input=text, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[:3000]
    return proc.stdout


@pytest.mark.mlir
@pytest.mark.skipif(__import__("tracecomp.ir.mlir_tool", fromlist=["x"]).find_mlir_opt() is None,
                    reason="mlir-opt not found (not in /usr/lib/llvm-22/bin nor on PATH)")
def test_gpu_loop_ir_is_accepted_by_mlir_opt_and_maps_to_gpu_launches():
    from tracecomp.lower.nvptx.mlir_print import print_gpu_loops

    def f(x, w, i, v):
        h = tc.relu(x @ w)
        return tc.softmax(h, dim=1), x.sum(), x.argmax(dim=1), h.index_add(0, i, v)
    program = _program(f, np.ones((40, 70), np.float32), np.ones((70, 36), np.float32),
                       np.array([0, 3]), np.ones((2, 36), np.float32))
    step = tc.trace(tc.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3))).lower(*_mlp_inputs()).program
    for p in (program, step):
        gpu = compile_program(p)
        text = print_gpu_loops(gpu)
        assert text.count("func.func") == len(gpu.launches)
        assert "#gpu.loop_dim_map<processor = block_x" in text and "processor = thread_x" in text
        _mlir_opt(text)
        converted = _mlir_opt(text, "--convert-parallel-loops-to-gpu")
        assert "gpu.launch" in converted


def test_rows_that_store_and_reread_their_own_row_stay_parallel():
    """A fused softmax stores exp(x - max) into its output, sums it back and divides in
    place: rows are disjoint, so rows stay one block each and the row's loops are shared
    by the block's threads (not one thread for everything)."""
    _, launches = _ptx_and_plan(lambda x: tc.softmax(x, dim=1), np.ones((64, 512), np.float32))
    assert [l.kind for l in launches] == ["rows"] and launches[0].shared
    _, launches = _ptx_and_plan(lambda x: tc.softmax(x, dim=1), np.ones((512, 10), np.float32))
    assert [l.kind for l in launches] == ["elementwise"]
