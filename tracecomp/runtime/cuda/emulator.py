"""A GPU emulated on the host CPU, to test the generated kernels where no GPU exists.

EmulatedContext offers the methods of driver.Context that runner.CudaProgram uses
(alloc, copies, load, launch, synchronize), so the whole device path runs unchanged but
for the last step: instead of PTX, the module's LLVM IR (the same IR the PTX comes from,
before optimization) is compiled for the host, with the NVVM intrinsics replaced by calls
into Python:
  special registers   each emulated thread's ids (threading.local);
  barrier0            a threading.Barrier over the block's threads;
  shfl.sync.bfly      an exchange among the 32 threads of the warp (two barriers);
  shared memory       the address-space-3 globals become plain globals: blocks run one
                      after another, so one copy is the current block's shared memory.
Every thread of a block is an OS thread (ctypes drops the GIL while native code runs), so
barriers and shuffles block and resume as on a GPU, lock step aside.  It is slow (a
Python call per register read, shuffle and barrier) and meant for small inputs only.
A barrier that times out (a thread that never arrives: a kernel bug) fails the launch.
"""
from __future__ import annotations

import ctypes
import re
import threading
from typing import Sequence

import numpy as np

from ...core.errors import BackendError
from ..jit import compile_module
from ...lower.nvptx.program import GpuModule

SREGS = {f"{reg}.{axis}": 3 * i + j for i, reg in enumerate(("tid", "ntid", "ctaid", "nctaid"))
         for j, axis in enumerate("xyz")}
TIMEOUT = 60.0
STRIDED_GRID = 3        # blocks per grid dimension the emulator runs of a strided launch
NARROW_BLOCK = 64       # threads per block it runs of an elementwise launch
_SREG = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32)
_BARRIER = ctypes.CFUNCTYPE(None)
_SHFL_I32 = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32, ctypes.c_int32)
_SHFL_F32 = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_float, ctypes.c_int32)

_HOOKS = """
@"emu.hooks" = global [4 x ptr] zeroinitializer
define internal i32 @"emu.sreg"(i32 %which) {
  %f = load ptr, ptr @"emu.hooks"
  %r = call i32 %f(i32 %which)
  ret i32 %r
}
define internal void @"emu.barrier"() {
  %p = getelementptr [4 x ptr], ptr @"emu.hooks", i32 0, i32 1
  %f = load ptr, ptr %p
  call void %f()
  ret void
}
define internal i32 @"emu.shfl.i32"(i32 %mask, i32 %v, i32 %lanes, i32 %clamp) {
  %p = getelementptr [4 x ptr], ptr @"emu.hooks", i32 0, i32 2
  %f = load ptr, ptr %p
  %r = call i32 %f(i32 %v, i32 %lanes)
  ret i32 %r
}
define internal float @"emu.shfl.f32"(i32 %mask, float %v, i32 %lanes, i32 %clamp) {
  %p = getelementptr [4 x ptr], ptr @"emu.hooks", i32 0, i32 3
  %f = load ptr, ptr %p
  %r = call float %f(float %v, i32 %lanes)
  ret float %r
}
"""


def host_ir(llvm_ir: str) -> str:
    """The NVPTX module's IR rewritten to call the emulator's hooks (see the module doc)."""
    lines = [ln for ln in llvm_ir.splitlines()
             if not (ln.startswith("declare") and "llvm.nvvm." in ln)
             and not ln.startswith(("target triple", "target datalayout"))]
    text = "\n".join(lines).replace("addrspace(3) ", "").replace(" addrspace(3)", "")
    for name, which in SREGS.items():
        text = text.replace(f'call i32 @"llvm.nvvm.read.ptx.sreg.{name}"()',
                            f'call i32 @"emu.sreg"(i32 {which})')
    text = text.replace('@"llvm.nvvm.barrier0"', '@"emu.barrier"')
    text = re.sub(r'@"llvm\.nvvm\.shfl\.sync\.bfly\.(i32|f32)"', r'@"emu.shfl.\1"', text)
    if "llvm.nvvm." in text:
        raise BackendError("the emulator has no hook for " + re.search(r"llvm\.nvvm\.[\w.]+", text).group(0))
    return text + _HOOKS


class _Block:
    """The state the threads of one running block share."""

    def __init__(self, block: Sequence[int]):
        self.size = block[0] * block[1] * block[2]
        self.barrier = threading.Barrier(self.size, timeout=TIMEOUT)
        warps = -(-self.size // 32)
        self.warp_barriers = [threading.Barrier(min(32, self.size - 32 * w), timeout=TIMEOUT) for w in range(warps)]
        self.lanes = [[0] * 32 for _ in range(warps)]
        self.failed: list[BaseException] = []


class EmulatedModule:
    def __init__(self, ctx: "EmulatedContext", gpu: GpuModule):
        names = [launch.name for launch in gpu.launches]
        self.library = compile_module(host_ir(gpu.llvm_ir), exports=names + ["emu.hooks"])
        self.ctx = ctx
        self.local = threading.local()
        self.block: _Block | None = None
        self.hooks = (_SREG(self._sreg), _BARRIER(self._barrier), _SHFL_I32(self._shuffle),
                      _SHFL_F32(self._shuffle))
        table = (ctypes.c_void_p * 4).from_address(self.library.address("emu.hooks"))
        for i, hook in enumerate(self.hooks):
            table[i] = ctypes.cast(hook, ctypes.c_void_p).value
        self.functions = {n: self.library.address(n) for n in names}
        self.strided = {l.name for l in gpu.launches if l.kind not in ("partials", "finish")}
        self.narrow = {l.name for l in gpu.launches if l.kind == "elementwise"}

    def function(self, name: str):
        return (self, name)

    def unload(self) -> None:
        self.functions = {}
        self.library = None          # the JIT frees the code with its last reference

    # ---- hooks, called from the emulated threads
    def _sreg(self, which: int) -> int:
        return self.local.sregs[which]

    def _wait(self, barrier: threading.Barrier) -> None:
        try:
            barrier.wait()
        except threading.BrokenBarrierError as e:
            self.block.failed.append(e)

    def _barrier(self) -> None:
        self._wait(self.block.barrier)

    def _shuffle(self, value, lanes: int):
        tid = self.local.linear
        warp, lane = divmod(tid, 32)
        slots = self.block.lanes[warp]
        slots[lane] = value
        self._wait(self.block.warp_barriers[warp])
        other = slots[lane ^ lanes]
        self._wait(self.block.warp_barriers[warp])
        return other

    # ---- running a launch
    def run(self, name: str, grid: Sequence[int], block: Sequence[int], args: Sequence[int]) -> None:
        fn = ctypes.CFUNCTYPE(None, *([ctypes.c_uint64] * len(args)))(self.functions[name])
        if name in self.strided:      # grid-stride loops: a small grid covers everything, slowly
            grid = tuple(min(g, STRIDED_GRID) for g in grid)
        if name in self.narrow:       # they read the block size too: fewer threads, same code
            block = (min(block[0], NARROW_BLOCK), *block[1:])
        for bz in range(grid[2]):
            for by in range(grid[1]):
                for bx in range(grid[0]):
                    self._run_block(fn, (bx, by, bz), grid, block, args)

    def _run_block(self, fn, ctaid, grid, block, args) -> None:
        self.block = state = _Block(block)

        def thread(tx, ty, tz):
            self.local.sregs = (tx, ty, tz, *block, *ctaid, *grid)
            self.local.linear = tx + block[0] * (ty + block[1] * tz)
            fn(*args)
        threads = [threading.Thread(target=thread, args=(x, y, z))
                   for z in range(block[2]) for y in range(block[1]) for x in range(block[0])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if state.failed:
            raise BackendError(f"emulated kernel: a barrier timed out in block {ctaid} "
                               "(threads disagree on the barriers they reach)")


class EmulatedContext:
    """Host memory and the emulator behind driver.Context's interface."""
    compute_capability = (8, 0)
    name = "tracecomp emulator"

    def __init__(self):
        self.memory: dict[int, np.ndarray] = {}

    def make_current(self) -> None:
        pass

    def load(self, gpu: GpuModule) -> EmulatedModule:
        return EmulatedModule(self, gpu)

    def alloc(self, nbytes: int) -> int:
        # 256-byte aligned like cuMemAlloc; poisoned so a kernel that reads before it writes shows
        raw = np.full(max(int(nbytes), 1) + 256, 0xCD, np.uint8)
        ptr = raw.ctypes.data + (-raw.ctypes.data) % 256
        self.memory[ptr] = raw
        return ptr

    def free(self, ptr: int) -> None:
        del self.memory[ptr]

    def to_device(self, ptr: int, array: np.ndarray) -> None:
        a = np.ascontiguousarray(array)
        ctypes.memmove(ptr, a.ctypes.data, a.nbytes)

    def to_host(self, array: np.ndarray, ptr: int) -> np.ndarray:
        ctypes.memmove(array.ctypes.data, ptr, array.nbytes)
        return array

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        ctypes.memmove(dst, src, nbytes)

    def launch(self, fn, grid, block, args, shared_bytes: int = 0) -> None:
        module, name = fn
        module.run(name, grid, block, [a.value for a in args])

    def synchronize(self) -> None:
        pass
