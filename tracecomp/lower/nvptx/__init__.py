"""The CUDA code generator: loop-IR kernels as NVPTX kernels (PTX text from llvmlite's NVPTX target).

    launch.py       how each top-level statement of a kernel maps onto a grid (the plan)
    target.py       the NVPTX target machine, PTX ISA versions, LLVM IR -> PTX
    intrinsics.py   special registers, barriers, warp shuffles, shared memory, atomics
    codegen.py      launches -> LLVM IR functions (grid-stride loops, rows, serial)
    reduce.py       block reductions (shuffles + shared memory) and split long rows
    matmul.py       the shared-memory tiled, register-blocked Matmul
    kernels.py      each launch as an NVPTX kernel function
    program.py      a scheduled Program -> PTX + launches (a GpuModule)
    mlir_print.py   the launches as MLIR loops mapped to GPU processors (mlir-opt checks it)

Running it (the driver, ptxas, the emulator) lives in runtime/cuda/."""
