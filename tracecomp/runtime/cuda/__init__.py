"""Running the CUDA code of lower/nvptx: checked with NVIDIA's `ptxas`, run through the CUDA
driver API where a GPU is present, or on an emulator of the device.

    ptxas.py     running ptxas and reading its -v figures
    report.py    the PTX with its launches and ptxas figures (`--stage ptx`)
    driver.py    the CUDA driver API over ctypes
    runner.py    a GpuModule run on a device (tc.trace(fn, device="cuda"))
    emulator.py  a host emulation of the device, to test the kernels without a GPU
    memory.py    the context, the memory pool and DeviceArray (device tensors' values)
    dlpack.py    DLPack structs over ctypes: device arrays shared with other libraries

The package is `tc.cuda` too: is_available, synchronize, empty_cache, ...."""

# `tc.cuda`: PyTorch's torch.cuda functions that a GPU user reaches for.
from .memory import available as is_available, context as _context, pool as _pool


def device_count() -> int:
    """1 where a GPU (or the emulator) can be used, else 0: tracecomp runs on cuda:0."""
    return 1 if is_available() else 0


def synchronize() -> None:
    """Wait until the device has finished every launch queued so far."""
    _context().synchronize()


def empty_cache() -> None:
    """Give the memory pool's free blocks back to the driver."""
    _pool().empty()


def memory_allocated() -> int:
    """Bytes in live device arrays (rounded up to the pool's size classes)."""
    return _pool().held


def get_device_name() -> str:
    return _context().name
