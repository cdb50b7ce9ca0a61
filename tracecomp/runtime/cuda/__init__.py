"""Running the CUDA code of lower/nvptx: checked with NVIDIA's `ptxas`, run through the CUDA
driver API where a GPU is present, or on an emulator of the device.

    ptxas.py     running ptxas and reading its -v figures
    report.py    the PTX with its launches and ptxas figures (`--stage ptx`)
    driver.py    the CUDA driver API over ctypes
    runner.py    a GpuModule run on a device (tc.trace(fn, device="cuda"))
    emulator.py  a host emulation of the device, to test the kernels without a GPU"""
