"""The launch plan: how each top-level statement of a loop-IR kernel maps onto a CUDA grid.

A Kernel's body is a sequence of top-level statements that must run in order (a scatter
copies, then accumulates), so each becomes its own launch on one stream:
  elementwise  a Loop nest: the perfectly nested outer loops are flattened into one
               iteration space that a grid-stride loop walks (one thread per point, any
               size); a store `buf[i] = buf[i] + v` that iterations may share (scatter)
               becomes an atomic add; over contiguous same-shape 4-byte buffers each
               thread takes 4 points a step on a grid of at most 64 blocks per SM of an
               H100 (vector.py);
  rows         a Loop nest whose innermost body holds a Reduce (or no Loop at all: a
               full reduction): one block per output point (block-stride over points);
               the block's threads split the Reduce, combine partials with warp shuffles
               and shared memory, then thread 0 stores; rows up to 8192 long are
               read once into registers and written once (rowcache.py);
  partials / finish   a rows nest with few long rows: `partials` has several blocks per
               row, each reducing a chunk into a workspace; `finish` combines the chunks
               of a row and runs the rest of the row's body (rows of a run-time length:
               both and a `rows` launch, each with a `when` on the length);
  columns      a Loop nest that accumulates into a buffer along some of its loops (a
               column reduction `out[j] = max(out[j], x[i, j])`): the loops whose points
               touch disjoint elements (j) are flattened into a grid-stride space, and each
               thread runs the others (i) in order for its points: no atomics, and a warp
               reads consecutive elements of each row;
  matmul       a Matmul: 64x64 output tiles, one block of 16x16 threads each (4x4
               elements per thread), staged through shared memory (matmul.py); float32
               products with many tiles take 128x128 tiles of 256 threads (sgemm.py);
  serial       anything whose iterations depend on each other: one thread.
Loops stride over what a grid does not cover, so a grid needs only enough blocks: a
number, or with dynamic dims an expression of the run-time sizes (grid.py's Blocks) the
host evaluates per call; a grid of 0 blocks means "nothing to do".
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional, Union

from ...core.dtypes import DType
from ...core.errors import BackendError
from ..loops.ir import (INDEX, Binary, Buffer, CheckedIndex, Const, Expr, Kernel, Let, Load, Loop, Matmul, Reduce,
                        Store, Var)
from .grid import GridDim, When, ceil_div, grid_at, grid_dim, is_size_expression, size_value
from ..loops import index as I
from .hostloops import HostLoop
from .rowplan import cache_extent, row_threads
from .shareable import cooperative
from ..loops.walk import buffers_read, buffers_written, statements, substitute, var_names, walk

ELEMENTWISE_THREADS = 256
MAX_BLOCKS = 65535             # gridDim.y/z limit; x is capped the same for simplicity
MATMUL_TILE = 64               # output tile of a matmul block (MATMUL_THREADS^2 threads, 4x4 each)
MATMUL_THREADS = 16
MATMUL_K = 16                  # k step staged in shared memory
LARGE_TILE = 128               # float32 matmuls with many tiles: sgemm.py's 128 x 128 tiles...
LARGE_THREADS = 256            # ...of 256 threads, 8 x 8 elements each
LARGE_MATMUL_MIN_TILES = 96    # (tests lower it to run the large tiles on small shapes)
VECTOR_WIDTH = 4               # elementwise points per thread and step over contiguous buffers
VECTOR_BLOCKS = 132 * 64       # their grid at most (132 SMs x 64: an H200 ran the W1 chain 12%
                               # faster than with 132 x 8, one wave of blocks of 256 threads)
THREAD_PER_ROW_MAX = 64        # rows no longer than this: one thread per row, not a block
SPLIT_MIN_EXTENT = 1 << 16     # rows at least this long are split over several blocks...
SPLIT_MAX_ROWS = 64            # ...when there are at most this many of them
SPLIT_TERMS_PER_THREAD = 16
DYNAMIC_SPLIT_CHUNKS = 4 * 132  # a split row of run-time length: this many chunks (4 blocks per SM
                                # of an H100), each as long as the length needs
COLUMNS_MIN_POINTS = 1024      # a columns plan needs this many parallel points to beat atomics


@dataclass
class Workspace:
    """A device temp the runtime allocates for a launch (a split reduction's partials)."""
    name: str
    dtype: DType
    elements: int


@dataclass
class Launch:
    name: str                          # the PTX entry point
    kernel: Kernel                     # the loop-IR kernel it belongs to
    kind: str                          # see the module docstring
    stmts: list                        # the loop-IR statements it runs
    block: tuple[int, int, int]
    grid: tuple[GridDim, GridDim, GridDim]   # ints, or Blocks over run-time sizes (grid.py)
    workspaces: list[Workspace] = field(default_factory=list)
    chunks: int = 1                    # partials/finish: blocks per row
    shared: set = field(default_factory=set)   # buffers the launch both loads and stores
    shared_bytes: int = 0              # static shared memory (set by the code generator)
    vector: int = 1                    # elementwise: points per thread and step (vector.py)
    tile: int = 0                      # matmul: the output tile of a block (64 or 128: sgemm.py)
    row_extent: int = 0                # rows: the row length held in registers (rowcache.py), or 0
    loops: tuple = ()                  # host loops around it, outermost first (hostloops.py)
    when: Optional[When] = None        # runs only where this holds at the call's sizes (grid.py)

    @property
    def params(self) -> list[str]:
        """Argument order of the entry point: buffers, sizes (then host loop vars), workspaces."""
        return ([b.name for b in self.kernel.buffers] + list(self.kernel.sizes)
                + [w.name for w in self.workspaces])

    @property
    def empty(self) -> bool:
        """Is the grid empty whatever the sizes (nothing to do)?"""
        return 0 in self.grid

    def grid_at(self, sizes: dict[str, int]) -> tuple[int, int, int]:
        """The grid once the size parameters ({"size_batch": 7}) are known."""
        return grid_at(self.grid, sizes)


def plan_kernel(kernel: Kernel) -> list[Launch]:
    """The launches that run `kernel`, in order."""
    body = unrolled(kernel.body)
    # (tile loops on the host: their products are a tile each, never worth the large tiles)
    return _plan_body(kernel, body, kernel.name, (), not any(isinstance(s, HostLoop) for s in body))


def _plan_body(kernel: Kernel, body: list, name: str, loops: tuple, choose: bool) -> list[Launch]:
    """The launches of `body` (unrolled) inside the host loops `loops`, whose vars `kernel`
    takes as parameters after its sizes; `choose`: a product over run-time sizes gets both
    matmul kernels, one chosen per call (_matmul)."""
    segments = _segments(body)
    if len(segments) > 1 and any(_defines(seg) for seg in segments[:-1]):
        # a later statement reads a name a top-level Let/Reduce binds: keep them together
        if any(isinstance(s, HostLoop) for s in body) or loops:
            raise BackendError(f"kernel '{kernel.name}': a loop over products with a run-time trip count "
                               "reads a value computed before it; it has no PTX lowering")
        return [_serial(kernel, kernel.body, kernel.name)]
    launches: list[Launch] = []
    for j, seg in enumerate(segments):
        sub = name if len(segments) == 1 else f"{name}_s{j}"
        if isinstance(seg[0], HostLoop):
            inner = dataclasses.replace(kernel, sizes=[*kernel.sizes, seg[0].var])
            launches += _plan_body(inner, seg[0].body, sub, loops + (seg[0],), choose)
            continue
        for launch in _plan_segment(kernel, seg, sub, choose):
            launch.loops = loops
            launches.append(launch)
    return launches


def unrolled(body: list) -> list:
    """`body` with every top-level Loop that holds a Matmul (the fused attention's loops
    over batch items and tiles) replaced by its iterations, the loop var a constant in
    each, or by a HostLoop where its trip count is known only at run time: a Matmul is a
    launch of its own, so the host runs that loop, a launch per statement (a grid over the
    batch items would be the GPU's own way: not done yet)."""
    out: list = []
    for s in body:
        if not (isinstance(s, Loop) and any(isinstance(n, Matmul) for n in statements(s.body))):
            out.append(s)
            continue
        trips = static_extent(s.extent)
        if trips is None:
            out.append(HostLoop(s.var, s.extent, unrolled(s.body)))
            continue
        for i in range(trips):
            value = Const(i, INDEX)
            out += unrolled(substitute(s.body, lambda n: value if n == Var(s.var, INDEX) else None))
    return out


def static_extent(e) -> Optional[int]:
    """An extent's value when it is a constant expression (after unrolling), else None."""
    return size_value(e, {})


def _segments(body: list) -> list[list]:
    """Top-level Loops, Matmuls and HostLoops alone; runs of other statements together."""
    out: list[list] = []
    run: list = []
    for s in body:
        if isinstance(s, (Loop, Matmul, HostLoop)):
            if run:
                out.append(run)
                run = []
            out.append([s])
        else:
            run.append(s)
    if run:
        out.append(run)
    return out


def accesses(stmts: list) -> list[tuple[str, tuple]]:
    """(buffer, index) of every Load and Store in the statements, nested ones included."""
    return [(n.buffer, n.index) for n in walk(stmts) if isinstance(n, (Load, Store))]


def row_disjoint(stmts: list, dims, shared: set[str]) -> bool:
    """Does every access to a buffer in `shared` index it with each outer loop var at one
    fixed position?  Then different points of the outer loops touch disjoint elements and
    may run on different threads or blocks (a row kernel that stores exp(x) and reads it
    back for its sum, then divides it in place)."""
    return all(disjoint_vars(stmts, dims, shared))


def disjoint_vars(stmts: list, dims, shared: set[str]) -> list[bool]:
    """Per loop of `dims`: does every access to a buffer in `shared` index it with that
    loop's var at one fixed position (so that its iterations touch disjoint elements)?"""
    indices = {name: [ix for buf, ix in accesses(stmts) if buf == name] for name in shared}
    out = []
    for v, _ in dims:
        var = Var(v, INDEX)
        out.append(all(set.intersection(*({p for p, e in enumerate(ix) if e == var} for ix in found))
                       for found in indices.values() if found))
    return out


def iteration_local(loop: Loop, shared: set[str]) -> bool:
    """Do the loop's accesses to `shared` buffers all use one index that includes the loop
    var?  Then its iterations may run on different threads."""
    var = Var(loop.var, INDEX)
    for name in shared:
        indices = {ix for buf, ix in accesses([loop]) if buf == name}
        if len(indices) > 1 or any(var not in ix for ix in indices):
            return False
    return True


def _defines(seg: list) -> bool:
    return any(isinstance(s, (Let, Reduce)) for s in seg)


def perfect_nest(stmt) -> tuple[list[tuple[str, Union[int, str]]], list]:
    """The outer loops of a nest while each body is exactly one Loop: ([(var, extent)], body)."""
    dims = []
    body = [stmt]
    while len(body) == 1 and isinstance(body[0], Loop):
        dims.append((body[0].var, body[0].extent))
        body = body[0].body
    return dims, body


def static_product(extents) -> Optional[int]:
    return math.prod(extents) if all(isinstance(e, int) for e in extents) else None


def _plan_segment(kernel: Kernel, seg: list, name: str, choose: bool = False) -> list[Launch]:
    if isinstance(seg[0], Matmul):
        return _matmul(kernel, seg[0], name, choose)
    dims, body = perfect_nest(seg[0]) if isinstance(seg[0], Loop) else ([], seg)
    loads, stores = buffers_read(seg), buffers_written(seg)
    shared = loads & stores
    atomic = bool(shared) and all_atomic(seg, shared)
    if shared and not row_disjoint(seg, dims, shared):      # (no dims: one row)
        columns, points = _columns(kernel, seg, dims, shared, name)
        if columns is not None and (not atomic or points is None or points >= COLUMNS_MIN_POINTS):
            return [columns]
        if not atomic:
            return [_serial(kernel, seg, name)]
    reduces = [s for s in body if isinstance(s, Reduce)]
    rows = static_product([e for _, e in dims])
    longest = max((r.extent if isinstance(r.extent, int) else SPLIT_MIN_EXTENT for r in reduces), default=0)
    if any(map(cooperative, reduces)) and not atomic and (not dims or longest > THREAD_PER_ROW_MAX):
        threads = min(256, max(32, 1 << (max(longest, 1) - 1).bit_length()))
        split = None if shared else _split_plan(kernel, seg, body, rows, threads, name)
        if split is not None and split[0].when is None:
            return split
        grid = grid_dim([e for _, e in dims], 1, MAX_BLOCKS, set(kernel.sizes))
        cached = cache_extent(kernel, body) or 0
        if cached:
            threads = max(threads, row_threads(cached)) if cached > 4096 else threads
        whole = Launch(name, kernel, "rows", seg, (threads, 1, 1), (grid, 1, 1), shared=shared, row_extent=cached)
        if split is not None:        # a run-time length: split where it is long enough
            whole.when = split[0].when.otherwise()
            return split + [whole]
        return [whole]
    if not dims:
        return [_serial(kernel, seg, name)]       # a 0-d store or a non-monoid full reduction
    if not atomic and contiguous_buffers(kernel, dims, body):
        blocks = grid_dim([e for _, e in dims], ELEMENTWISE_THREADS, VECTOR_BLOCKS)   # (small grids as before)
        return [Launch(name, kernel, "elementwise", seg, (ELEMENTWISE_THREADS, 1, 1), (blocks, 1, 1),
                       vector=VECTOR_WIDTH)]
    blocks = grid_dim([e for _, e in dims], ELEMENTWISE_THREADS, MAX_BLOCKS, set(kernel.sizes))
    return [Launch(name, kernel, "elementwise", seg, (ELEMENTWISE_THREADS, 1, 1), (blocks, 1, 1))]


VECTOR_DTYPES = (DType.float32, DType.int32)


def contiguous_buffers(kernel: Kernel, dims, body: list) -> set[str]:
    """The buffers of an elementwise nest that vector.py may access 4 points at a time:
    every Load/Store of them is `buf[v0, v1, ...]` with the nest's vars in order and buf
    shaped like the nest (element f at flat point f), of a 4-byte dtype.  Empty when the
    nest has other accesses that depend on its vars, other statements, extents that are not
    sizes (static, or expressions of run-time sizes), or no such buffer."""
    extents = tuple(e for _, e in dims)
    own = tuple(Var(v, INDEX) for v, _ in dims)
    loop_vars = {v for v, _ in dims}
    if not dims or not all(is_size_expression(e) for e in extents):
        return set()
    if any(not isinstance(s, (Let, Store)) for s in body):
        return set()
    found: set[str] = set()
    for n in walk(body):
        if isinstance(n, CheckedIndex):
            return set()
        if not isinstance(n, (Load, Store)):
            continue
        if tuple(n.index) == own and type(n) in (Load, Store):
            buf = kernel.buffer(n.buffer)
            if tuple(buf.shape) == extents and buf.dtype in VECTOR_DTYPES:
                found.add(n.buffer)
                continue
        if any(var_names(i) & loop_vars for i in n.index):
            return set()
    # a buffer also accessed some other way (a constant index) keeps the scalar code
    for n in walk(body):
        if isinstance(n, (Load, Store)) and n.buffer in found and tuple(n.index) != own:
            return set()
    return found


def _columns(kernel: Kernel, seg: list, dims, shared: set[str], name: str):
    """(the columns plan of a single loop nest (module docstring), its parallel points or
    None when they are not static), or (None, None) when none of its loops may run in
    parallel or its body holds a further Loop or Reduce."""
    if len(seg) != 1 or not isinstance(seg[0], Loop):
        return None, None
    _, body = perfect_nest(seg[0])
    parallel = disjoint_vars(seg, dims, shared)
    if not any(parallel) or any(isinstance(s, (Loop, Reduce)) for s in body):
        return None, None
    outer = [e for (_, e), p in zip(dims, parallel) if p]
    points = static_product(outer)
    blocks = grid_dim(outer, ELEMENTWISE_THREADS, MAX_BLOCKS, set(kernel.sizes))
    launch = Launch(name, kernel, "columns", seg, (ELEMENTWISE_THREADS, 1, 1), (blocks, 1, 1), shared=shared)
    return launch, points


def _split_plan(kernel: Kernel, seg: list, body: list, rows: Optional[int], threads: int,
                name: str) -> Optional[list[Launch]]:
    """partials + finish for few long rows whose one Reduce threads can share (module doc)."""
    reduces = [s for s in body if isinstance(s, Reduce)]
    if rows is None or rows > SPLIT_MAX_ROWS or len(reduces) != 1:
        return None
    r = reduces[0]
    static = isinstance(r.extent, int)
    if not cooperative(r) or (r.extent < SPLIT_MIN_EXTENT if static else not is_size_expression(r.extent)):
        return None
    if any(isinstance(s, (Loop, Reduce)) for s in body[:body.index(r)]):
        return None
    chunks = min(-(-r.extent // (threads * SPLIT_TERMS_PER_THREAD)), MAX_BLOCKS) if static else DYNAMIC_SPLIT_CHUNKS
    workspaces = [Workspace(f"{name}_part{k}", DType.int64 if a.dtype == INDEX else a.dtype, rows * chunks)
                  for k, a in enumerate(r.accumulators)]
    part = Launch(f"{name}_partials", kernel, "partials", seg, (threads, 1, 1), (chunks, rows, 1),
                  workspaces, chunks)
    fin = Launch(f"{name}_finish", kernel, "finish", seg, (threads, 1, 1), (rows, 1, 1),
                 workspaces, chunks)
    if not static:
        part.when = fin.when = When(r.extent, SPLIT_MIN_EXTENT, True)
    return [part, fin]


def _matmul(kernel: Kernel, s: Matmul, name: str, choose: bool = False) -> list[Launch]:
    """The product's launch; with `choose` and float32 operands of run-time sizes, both the
    large-tile launch and the 64 x 64 one, each run where the tile count (at 128 x 128)
    says (large_matmul's rule, decided per call)."""
    extents = (s.m, s.n, *s.batch)
    if choose and float32_operands(kernel, s) and any(static_extent(e) is None for e in extents) \
            and all(is_size_expression(e) for e in extents):
        tiles = I.mul(ceil_div(s.m, LARGE_TILE), ceil_div(s.n, LARGE_TILE))
        for b in s.batch:
            tiles = I.mul(tiles, I.expr(b))
        large = _matmul_launch(kernel, s, f"{name}_large", True)
        large.when = When(tiles, LARGE_MATMUL_MIN_TILES, True)
        small = _matmul_launch(kernel, s, name, False)
        small.when = When(tiles, LARGE_MATMUL_MIN_TILES, False)
        return [large, small]
    return [_matmul_launch(kernel, s, name, large_matmul(kernel, s))]


def _matmul_launch(kernel: Kernel, s: Matmul, name: str, large: bool) -> Launch:
    t = LARGE_TILE if large else MATMUL_TILE
    known = set(kernel.sizes)
    grid = (grid_dim([s.n], t, MAX_BLOCKS, known), grid_dim([s.m], t, MAX_BLOCKS, known),
            grid_dim(list(s.batch), 1, MAX_BLOCKS, known))
    block = (LARGE_THREADS, 1, 1) if large else (MATMUL_THREADS, MATMUL_THREADS, 1)
    return Launch(name, kernel, "matmul", [s], block, grid, tile=t)


def float32_operands(kernel: Kernel, s: Matmul) -> bool:
    return all(kernel.buffer(v.buffer).dtype == DType.float32 for v in s.views())


def large_matmul(kernel: Kernel, s: Matmul) -> bool:
    """Does `s` take sgemm.py's 128 x 128 tiles?  float32 operands, static sizes, and
    enough tiles to keep most of a GPU busy (smaller products keep 64 x 64 tiles: 4x the
    blocks; with run-time sizes, _matmul decides per call)."""
    if not float32_operands(kernel, s):
        return False
    sizes = [static_extent(e) for e in (s.m, s.n, *s.batch)]
    if any(e is None for e in sizes):
        return False
    m, n, *batch = sizes
    return -(-m // LARGE_TILE) * -(-n // LARGE_TILE) * math.prod(batch) >= LARGE_MATMUL_MIN_TILES


def _serial(kernel: Kernel, stmts: list, name: str) -> Launch:
    return Launch(name, kernel, "serial", list(stmts), (1, 1, 1), (1, 1, 1))


# ---------------------------------------------------------------- statement analysis

ATOMIC_DTYPES = (DType.float32, DType.float64, DType.int32, DType.int64)


def atomic_add_term(s: Store, buffers: dict[str, Buffer]) -> Optional[Expr]:
    """`v` when `s` is `buf[ix] = buf[ix] + v` (either order) on a dtype atomics can add."""
    u = s.value
    if not (isinstance(u, Binary) and u.fn == "add" and buffers[s.buffer].dtype in ATOMIC_DTYPES):
        return None
    own = Load(s.buffer, tuple(s.index), buffers[s.buffer].dtype)
    for mine, term in ((u.a, u.b), (u.b, u.a)):
        if mine == own:
            if s.buffer not in buffers_read(term) and s.buffer not in buffers_read(s.index):
                return term
    return None


def all_atomic(stmts: list, shared: set[str]) -> bool:
    """Every load of a buffer in `shared` is the read half of an atomic-add Store, which
    is the nest's only statement touching it (a scatter's accumulation)."""
    stores = [s for s in statements(stmts) if isinstance(s, Store)]
    others = [s for s in statements(stmts) if not isinstance(s, (Store, Loop))]
    for name in shared:
        mine = [s for s in stores if s.buffer == name]
        if not mine:
            return False
        fake = {name: Buffer(name, _store_dtype(mine[0]), (), "output")}
        if any(atomic_add_term(s, fake) is None for s in mine):
            return False
        for s in stores:
            if s.buffer != name and name in buffers_read(s):
                return False
        for s in others:
            if name in buffers_read(s):
                return False
    return True


def _store_dtype(s: Store):
    return s.value.dtype


