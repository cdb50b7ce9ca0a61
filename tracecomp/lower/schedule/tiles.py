"""Block sizes of the CPU matmul (llvm/gemm/matmul.py) and the workspace they need.

The packed kernel (GotoBLAS/BLIS structure) computes C in register tiles of MR x NR from
panels it copies into the workspace: a KC x NC panel of B (in micro-panels of NR columns)
and an MC x KC block of A (in micro-panels of MR rows).  The sizes follow the caches of
the host this was tuned on, AMD Zen 5 (per core: 48 KB L1d, 1 MB L2; 32 AVX-512 registers,
two 512-bit FMA pipes with 4 cycles of latency):
- MR x NR: the accumulators are MR * NR / L vector registers (L = 16 f32 or 8 f64 lanes);
  two FMA pipes times four cycles need >= 8 independent accumulators, and each step
  loads NR / L vectors of B and broadcasts MR elements of A, so a taller tile loads less
  per FMA.  In L1 every tile from 6 x 32 to 14 x 32 ran at the FMA peak; on whole products
  8 x 32 was best by a few percent (the sweep: BENCHMARKS.md, "Figures that were in the
  code"), and 8 x 16 for f64: 16 accumulators + 2 B vectors + broadcasts, no spills;
- KC: the B micro-panel (KC x NR) stays in L1 while the A micro-panels stream past it:
  256 * 32 * 4 bytes = 32 KB of the 48 KB (f64: 256 * 16 * 8 = 32 KB), leaving room for
  the A micro-panel (8 KB / 16 KB) and the C tile.  Each K-block reads and writes C once
  more, which the micro-kernel hides by prefetching its C tile; a KC of 384 or 512 gained
  nothing;
- MC: the A block (MC x KC) stays in L2 while B's micro-panels stream through L1: f32
  MC = 192 -> 192 KB, f64 MC = 96 -> 192 KB; well under 1 MB, because each core's L2 also
  holds B micro-panels and C lines in flight;
- NC: the B panel (KC x NC) is read from L3 (shared) once per A block: NC = 2048 columns
  -> 2 MB (f32) per thread, a fraction of the 32 MB L3.
For a small problem each block shrinks to the problem (rounded up to whole tiles), and so
does the workspace: `workspace_elements` is what the scheduler allocates, per-thread
panels (each 64-byte aligned) for up to `max_threads()` threads.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ...dtypes import DType

MIN_PACKED_SIDE = 8             # thinner products run faster as vectorized plain loops...
THIN_PACKED_FLOPS = 1 << 22     # ...unless big enough that reading B once wins (m, n >= 2)
SPLIT_MIN_TILES = 4             # register tiles a dim needs for threads to split it (2 x 2 items)


@dataclass(frozen=True)
class Tiles:
    mr: int           # register tile rows
    nv: int           # register tile columns, in vectors
    lanes: int        # elements per vector register
    mc: int           # A block rows (a multiple of mr)
    kc: int           # depth of a packed panel
    nc: int           # B panel columns (a multiple of nr)

    @property
    def nr(self) -> int:
        return self.nv * self.lanes


TILES = {DType.float32: Tiles(mr=8, nv=2, lanes=16, mc=192, kc=256, nc=2048),
         DType.float64: Tiles(mr=8, nv=2, lanes=8, mc=96, kc=256, nc=2048)}


def max_threads() -> int:
    """Threads a packed matmul may use: its workspace holds panels for this many."""
    return max(1, min(os.cpu_count() or 1, 64))


def uses_packed(dtype: DType, m: int, n: int, k: int) -> bool:
    """Whether the CPU code generator should run the packed kernel: floats, nothing empty,
    and both m and n at least MIN_PACKED_SIDE, where a register tile is mostly used (the
    vectorized loop expansion measured faster on thinner products, and always on vectors),
    or at least 2 in a product so big that streaming B once beats the padding."""
    if dtype not in TILES or k == 0 or min(m, n) < 2:
        return False
    return min(m, n) >= MIN_PACKED_SIDE or 2 * m * n * k >= THIN_PACKED_FLOPS


@dataclass(frozen=True)
class Blocks:
    """Block sizes for one problem: the tiles' blocks clipped to it."""
    tiles: Tiles
    mc: int
    kc: int
    nc: int
    split_m: bool        # threads split the rows (else the columns) of each matrix

    @property
    def a_elements(self) -> int:
        return _aligned(self.mc * self.kc, self.tiles)

    @property
    def b_elements(self) -> int:
        return _aligned(self.kc * self.nc, self.tiles)

    @property
    def thread_elements(self) -> int:
        """Workspace elements one thread packs into: its A block, then its B panel."""
        return self.a_elements + self.b_elements

    def split_tiles(self, m: int, n: int) -> int:
        """Register tiles along the split dim (the most parts worth making)."""
        return -(-m // self.tiles.mr) if self.split_m else -(-n // self.tiles.nr)


def _aligned(elements: int, t: Tiles) -> int:
    """Rounded up to whole vectors (64 bytes), so every panel starts 64-byte aligned."""
    return _round_up(elements, t.lanes)


def blocks(dtype: DType, m: Optional[int], n: Optional[int], k: Optional[int]) -> Blocks:
    """Block sizes for an m x k @ k x n product; None for a size known only at run time
    (a dynamic dim of an exported library), which the blocks then do not shrink to."""
    t = TILES[dtype]
    m_tiles = -(-m // t.mr) if m is not None else None
    n_tiles = -(-n // t.nr) if n is not None else None
    # Each part packs its own panels: split rows and every part packs all of B (k x n),
    # split columns and every part packs all of A (m x k).  So split the dim whose other
    # operand is smaller (W4's 256x784 @ 784x512: the columns), unless that dim has too
    # few register tiles to share out.  A run-time size counts as large.
    if m is None or n is None:
        split_m = m is None
    elif min(m_tiles, n_tiles) >= SPLIT_MIN_TILES:
        split_m = n <= m
    else:
        split_m = m_tiles >= n_tiles
    # K-blocks of equal depth (k = 784: 4 x 196, not 3 x 256 + 16): a thin last block
    # reads and writes all of C for a few FMAs per element.
    kc = -(-k // -(-k // t.kc)) if k is not None else t.kc
    mc = min(t.mc, _round_up(m, t.mr)) if m is not None else t.mc
    nc = min(t.nc, _round_up(n, t.nr)) if n is not None else t.nc
    return Blocks(t, mc, kc, nc, split_m)


def _round_up(x: int, step: int) -> int:
    return -(-x // step) * step


def workspace_elements(dtype: DType, m: Optional[int], n: Optional[int], k: Optional[int], batch: int) -> int:
    """Elements of the workspace buffer for a packed matmul of this size (None: a run-time
    size, as in `blocks`)."""
    bl = blocks(dtype, m, n, k)
    split = None if (m if bl.split_m else n) is None else bl.split_tiles(m, n)
    threads = max_threads() if split is None else min(max_threads(), batch * split)
    return bl.thread_elements * max(threads, 1)


def flops(m: int, n: int, k: int, batch: int = 1) -> int:
    return 2 * m * n * k * batch
