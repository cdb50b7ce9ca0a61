"""The CUDA path: loop-IR kernels as NVPTX kernels (PTX text from llvmlite's NVPTX target),
checked with NVIDIA's `ptxas`, and run through the CUDA driver API where a GPU is present.

    launch.py          how each top-level statement of a kernel maps onto a grid (the plan)
    nvptx_target.py    the NVPTX target machine, PTX ISA versions, module stamping
    nvptx_codegen.py   launches -> LLVM IR functions (grid-stride loops, block reductions)
    nvptx_intrinsics.py special registers, barriers, warp shuffles, shared memory
    nvptx_matmul.py    the shared-memory tiled Matmul
    program.py         a scheduled Program -> PTX + launches (a GpuModule)
    ptxas.py           running ptxas and reading its -v figures
    cuda_driver.py     the CUDA driver API over ctypes
    runner.py          a GpuModule run on a device (tc.trace(fn, device="cuda"))
    export_ptx.py      tc.export(..., target="cuda"): the PTX and a JSON of launches
"""
