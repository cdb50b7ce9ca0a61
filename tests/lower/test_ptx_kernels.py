"""The fast CUDA kernels: 16-byte vector elementwise launches (nvptx/vector.py), the
128 x 128 register-blocked SGEMM (nvptx/sgemm.py) and rows held in registers
(nvptx/rowcache.py).  Each runs on the host emulator against the CPU backend (random data,
sizes off the tile and off 4, odd strides, k = 1, batches, float64 falling back), and
its PTX shows what the module docstrings claim; ptxas -v (where installed) shows no
local memory in the hot kernels."""
import re

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.lower.nvptx import launch as L
from tracecomp.lower.nvptx.program import compile_program
from tracecomp.runtime.cuda.emulator import EmulatedContext
from tracecomp.runtime.cuda.ptxas import assemble, find_ptxas
from tracecomp.runtime.cuda.runner import CudaProgram

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) is not installed")
RNG = np.random.default_rng(11)


def _emulate(call, inputs):
    low = tc.trace(call).lower(*inputs)
    prog = CudaProgram(low.program, EmulatedContext())
    got = prog.on_host(inputs) if hasattr(prog, "on_host") else prog(inputs)
    want = low.compiled(inputs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5)
    return prog.gpu.launches


def _gpu(call, *inputs, arch="sm_90"):
    return compile_program(tc.trace(call).lower(*inputs).program, arch)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------- elementwise

CHAIN = lambda x: ((x * 2 + 1).exp() * 0.5).tanh()


@pytest.mark.parametrize("n", [1, 3, 4, 1027, 64 * 256 * 4 * 3 + 5])
def test_vector_elementwise_covers_every_point(n):
    """Sizes under 4, off 4 (the scalar tail) and beyond what the emulator's 3 blocks of
    64 threads cover in one step (the grid-stride loop)."""
    x = _f32(n)
    launches = _emulate(CHAIN, [x])
    assert [(l.kind, l.vector) for l in launches] == [("elementwise", 4)]


def test_vector_elementwise_in_place_and_several_operands():
    x, y = _f32(7, 33), _f32(7, 33)
    launches = _emulate(lambda x, y: (x * y + 1, tc.maximum(x, y) - y, (x + y).sqrt().abs()), [x, y])
    assert all(l.vector == 4 for l in launches)


def test_broadcasts_and_other_dtypes_keep_the_scalar_loop():
    x, b = _f32(8, 12), _f32(12)
    launches = _emulate(lambda x, b: x + b, [x, b])
    assert [l.vector for l in launches] == [1]
    launches = _emulate(lambda x: x * 2, [RNG.standard_normal(30)])          # float64
    assert [l.vector for l in launches] == [1]


def test_vector_elementwise_ptx_and_grid():
    g = _gpu(CHAIN, np.ones(1 << 26, np.float32))
    (l,) = g.launches
    assert l.grid == (L.VECTOR_BLOCKS, 1, 1) and l.block == (256, 1, 1)
    assert re.search(r"ld\.global(\.nc)?\.v4\.(f32|b32)", g.ptx)
    assert re.search(r"st\.global\.v4\.(f32|b32)", g.ptx)
    small = _gpu(CHAIN, np.ones(4096, np.float32)).launches[0]
    assert small.grid == (16, 1, 1) and small.vector == 4


# ---------------------------------------------------------------- matmul

@pytest.fixture
def large_tiles(monkeypatch):
    """The 128 x 128 kernel for small shapes too (the emulator runs it)."""
    monkeypatch.setattr(L, "LARGE_MATMUL_MIN_TILES", 1)


MATMUL_SHAPES = {
    "edges": ((70, 33), (33, 130)),            # odd k: scalar reads everywhere
    "interior": ((130, 44), (44, 136)),        # a full tile with vector reads, k % 8 = 4
    "k=1": ((65, 1), (1, 64)),
    "batched": ((2, 3, 20, 9), (3, 9, 70)),
    "many-tiles": ((520, 8), (8, 136)),        # more tiles than the emulator's 3 blocks
}


@pytest.mark.parametrize("shapes", MATMUL_SHAPES.values(), ids=MATMUL_SHAPES.keys())
def test_large_tiles_match_the_cpu_backend(large_tiles, shapes):
    a, b = (_f32(*s) for s in shapes)
    c = np.ones(shapes[1][-1], np.float32)
    launches = _emulate(lambda a, b, c: tc.relu(a @ b + c), [a, b, c])
    assert [(l.kind, l.tile, l.block) for l in launches] == [("matmul", 128, (256, 1, 1))]
    _emulate(lambda a, b: a.mT @ a, [a, b])                    # transposed a: vector reads along i
    _emulate(lambda a, b: b.mT @ a.mT, [a, b])                 # both transposed


def test_large_tiles_with_a_transposed_b_and_float64_fallback(large_tiles):
    x, w = _f32(132, 40), _f32(136, 40)
    launches = _emulate(lambda x, w: x @ w.mT, [x, w])        # b read along k
    assert launches[0].tile == 128
    xd, wd = RNG.standard_normal((70, 20)), RNG.standard_normal((20, 40))
    launches = _emulate(lambda x, w: x @ w, [xd, wd])
    assert [(l.tile, l.block) for l in launches] == [(64, (16, 16, 1))]


def test_tile_choice_by_size():
    small = _gpu(lambda a, b: a @ b, _f32(256, 64), _f32(64, 256)).launches[0]
    assert (small.tile, small.block) == (64, (16, 16, 1))
    big = _gpu(lambda a, b: a @ b, np.ones((4096, 4096), np.float32), np.ones((4096, 4096), np.float32))
    (l,) = big.launches
    assert (l.tile, l.block, l.grid) == (128, (256, 1, 1), (32, 32, 1))
    assert len(re.findall(r"ld\.shared\.v4\.(f32|b32)", big.ptx)) >= 4 * 8 * 2     # both k loops
    assert re.search(r"ld\.global(\.nc)?\.v4\.(f32|b32)", big.ptx)
    assert re.search(r"st\.shared\.v4\.(f32|b32)", big.ptx)
    assert len(re.findall(r"fma\.rn\.f32", big.ptx)) >= 2 * 512
    assert ".minnctapersm 2" in big.ptx


@needs_ptxas
def test_large_tiles_fit_two_blocks_per_sm():
    a = np.ones((4096, 4096), np.float32)
    for call in (lambda a, b: a @ b, lambda a, b: a.mT @ b, lambda a, b: tc.relu(a @ b.mT)):
        g = _gpu(call, a, a)
        (fig,) = assemble(g.ptx, "sm_90").values()
        assert fig.registers <= 128 and fig.shared_bytes == 2 * 2 * 8 * 132 * 4


# ---------------------------------------------------------------- rows in registers

ROWS = {
    "softmax": (lambda r: tc.softmax(r, dim=-1), (5, 300)),          # 5 rows > the emulator's 3 blocks
    "softmax-odd": (lambda r: tc.softmax(r, dim=-1), (4, 301)),      # E % 4 != 0: scalar lanes
    "reductions": (lambda r: (r.sum(dim=-1), r.amax(dim=-1), r.argmax(dim=1)), (6, 1000)),
    "layernorm": (lambda r: tc.layer_norm(r, (257,)), (3, 257)),      # a partial last chunk
    "layernorm-v4": (lambda r: tc.layer_norm(r, (520,)), (3, 520)),
    "full-sum": (lambda r: r.sum(), (700,)),
    "long": (lambda r: tc.softmax(r, dim=-1), (2, 6000)),             # 512 threads
}


@pytest.mark.parametrize("case", ROWS.values(), ids=ROWS.keys())
def test_rows_in_registers_match_the_cpu_backend(case):
    call, shape = case
    launches = _emulate(call, [_f32(*shape)])
    assert all(l.kind == "rows" and l.row_extent == shape[-1] for l in launches)


def test_unaligned_scan_rows_take_the_scalar_loop():
    """A scan hands each step its row of xs at 24-byte offsets: the vector loop must check
    the pointers (a 16-byte access there would fault) and leave the row to the scalar one."""
    def step(c, x):
        return c * 0.5 + x, (x * 2 + 1).exp() + c
    c, xs = _f32(2, 3), _f32(5, 2, 3)
    low = tc.trace(lambda c, xs: tc.scan(step, c, xs)).lower(c, xs)
    prog = CudaProgram(low.program, EmulatedContext())
    got = prog.on_host([c, xs]) if hasattr(prog, "on_host") else prog([c, xs])
    for g, w in zip(got, low.compiled([c, xs])):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5)
    assert any(l.vector == 4 for l in prog.gpu.launches)


def test_rows_in_registers_float64_and_in_place_division():
    launches = _emulate(lambda r: tc.softmax(r, dim=-1), [RNG.standard_normal((3, 200))])
    assert launches[0].row_extent == 200
    _emulate(lambda r: r / r.sum(dim=-1, keepdim=True), [_f32(4, 130)])


def test_rows_in_registers_read_and_write_once():
    x = np.ones((8192, 4096), np.float32)
    for call, stores in ((lambda r: tc.softmax(r, dim=-1), 4), (lambda r: r.sum(dim=-1), 0),
                         (lambda r: tc.layer_norm(r, (4096,)), 4)):
        g = _gpu(call, x)
        (l,) = g.launches
        assert (l.kind, l.block, l.row_extent) == ("rows", (256, 1, 1), 4096)
        body = g.ptx[g.ptx.index(".entry"):]
        assert len(re.findall(r"ld\.global(\.nc)?\.v4\.(f32|b32)", body)) == 4      # 16 elements a thread, once
        assert len(re.findall(r"st\.global\.v4\.(f32|b32)", body)) == stores     # (+ a 1-wide copy: unaligned)
        assert "shfl.sync.bfly" in body


def test_rows_longer_than_the_cache_keep_the_block_stride():
    (l,) = _gpu(lambda r: tc.softmax(r, dim=-1), np.ones((4, 10000), np.float32)).launches
    assert l.kind == "rows" and l.row_extent == 0


@needs_ptxas
def test_fast_kernels_use_no_local_memory():
    x = np.ones((8192, 4096), np.float32)
    for call in (lambda r: tc.softmax(r, dim=-1), lambda r: r.sum(dim=-1), lambda r: tc.layer_norm(r, (4096,)),
                 CHAIN):
        (fig,) = assemble(_gpu(call, x).ptx, "sm_90").values()
        assert fig.spill_stores == 0 and fig.stack_bytes == 0, fig.summary()
