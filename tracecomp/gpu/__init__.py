"""The CUDA path: loop-IR kernels as NVPTX kernels (PTX text from llvmlite's NVPTX target),
checked with NVIDIA's `ptxas`, and run through the CUDA driver API where a GPU is present.

    launch.py            how each top-level statement of a kernel maps onto a grid (the plan)
    nvptx_target.py      the NVPTX target machine, PTX ISA versions, LLVM IR -> PTX
    nvptx_intrinsics.py  special registers, barriers, warp shuffles, shared memory, atomics
    nvptx_codegen.py     launches -> LLVM IR functions (grid-stride loops, rows, serial)
    nvptx_reduce.py      block reductions (shuffles + shared memory) and split long rows
    nvptx_matmul.py      the shared-memory tiled, register-blocked Matmul
    program.py           a scheduled Program -> PTX + launches (a GpuModule)
    mlir_print.py        the launches as MLIR loops mapped to GPU processors (mlir-opt checks it)
    ptxas.py             running ptxas and reading its -v figures
    report.py            the PTX with its launches and ptxas figures (`--stage ptx`)
    cuda_driver.py       the CUDA driver API over ctypes
    runner.py            a GpuModule run on a device (tc.trace(fn, device="cuda"))
    emulator.py          a host emulation of the device, to test the kernels without a GPU
    export_ptx.py        tc.export(..., target="cuda"): the PTX and a JSON of its launches
"""
