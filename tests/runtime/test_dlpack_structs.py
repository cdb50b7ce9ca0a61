"""runtime/cuda/dlpack.py: the DLPack C structs over ctypes. This machine has no GPU, so
the tests run the code on host memory, as device (kDLCPU, 0).

Independent readers check the layout: PyTorch and NumPy consume the capsules we produce,
and we read the capsules PyTorch produces. The fixed offsets come from dlpack.h on a
64-bit platform. A (kDLCUDA, 0) capsule goes only through our own reader, because a CPU
build of PyTorch cannot take it."""
import ctypes
import gc
import sys
import threading
import weakref

import numpy as np
import pytest

from tracecomp.core.errors import ArgumentError, DTypeError
from tracecomp.runtime.cuda import dlpack as D

torch = pytest.importorskip("torch")
from torch.utils.dlpack import from_dlpack as torch_from_dlpack  # noqa: E402

CPU, CUDA = (D.kDLCPU, 0), (D.kDLCUDA, 0)


@pytest.fixture(autouse=True)
def registry_starts_and_ends_empty():
    gc.collect()
    assert not D._REGISTRY
    yield
    gc.collect()
    assert not D._REGISTRY, "an exported tensor was never released"


class Owner:
    """A stand-in for a device buffer. It counts how many are alive."""
    alive = 0

    def __init__(self):
        Owner.alive += 1

    def __del__(self):
        Owner.alive -= 1


def _export(arr, owner=None, device=CPU):
    return D.to_capsule(arr.ctypes.data, arr.shape, arr.dtype, device, arr if owner is None else owner)


# ---------------------------------------------------------------- layout

def test_struct_layout_matches_dlpack_h_on_64_bit():
    assert ctypes.sizeof(ctypes.c_void_p) == 8
    assert (ctypes.sizeof(D.DLDevice), ctypes.sizeof(D.DLDataType)) == (8, 4)
    assert {f: getattr(D.DLDataType, f).offset for f in ("code", "bits", "lanes")} == \
        {"code": 0, "bits": 1, "lanes": 2}
    offsets = {f: getattr(D.DLTensor, f).offset for f, _ in D.DLTensor._fields_}
    assert offsets == {"data": 0, "device": 8, "ndim": 16, "dtype": 20, "shape": 24,
                       "strides": 32, "byte_offset": 40}
    assert ctypes.sizeof(D.DLTensor) == 48
    assert (D.DLManagedTensor.manager_ctx.offset, D.DLManagedTensor.deleter.offset) == (48, 56)
    assert ctypes.sizeof(D.DLManagedTensor) == 64


def test_exported_struct_bytes_as_the_spec_lays_them_out():
    # Raw memory reads: checks the values where dlpack.h puts them, not through the ctypes fields.
    a = np.zeros((2, 3, 5), np.int16)
    cap = _export(a)
    (addr,) = D._REGISTRY
    raw = lambda off, ty: ty.from_address(addr + off).value  # noqa: E731
    assert raw(0, ctypes.c_void_p) == a.ctypes.data
    assert (raw(8, ctypes.c_int32), raw(12, ctypes.c_int32)) == CPU
    assert raw(16, ctypes.c_int32) == 3
    assert (raw(20, ctypes.c_uint8), raw(21, ctypes.c_uint8), raw(22, ctypes.c_uint16)) == (0, 16, 1)
    shape, strides = raw(24, ctypes.c_void_p), raw(32, ctypes.c_void_p)
    assert list((ctypes.c_int64 * 3).from_address(shape)) == [2, 3, 5]
    assert list((ctypes.c_int64 * 3).from_address(strides)) == [15, 5, 1]   # elements, not bytes
    assert raw(40, ctypes.c_uint64) == 0
    assert raw(56, ctypes.c_void_p)                                        # a deleter is set
    del cap


# ---------------------------------------------------------------- export, read by torch and numpy

ARRAYS = {
    "float32": np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5,
    "float64": np.linspace(-1, 1, 7),
    "int32": np.arange(-6, 6, dtype=np.int32).reshape(2, 6),
    "int64": np.array([2**40, -3, 7], np.int64),
    "bool": np.array([[True, False, True], [False, False, True]]),
    "uint8": np.array([0, 1, 200, 255], np.uint8),
    "0-d": np.array(3.25, np.float32),
    "empty": np.zeros((0, 4), np.float64),
    "3-d": np.arange(60, dtype=np.int64).reshape(3, 4, 5),
}


@pytest.mark.parametrize("name", ARRAYS)
def test_torch_reads_exported_host_array(name):
    a = ARRAYS[name].copy()
    t = torch_from_dlpack(_export(a))
    assert tuple(t.shape) == a.shape
    assert str(t.dtype).removeprefix("torch.") == a.dtype.name
    assert t.stride() == tuple(s // a.itemsize for s in a.strides) or a.size == 0
    np.testing.assert_array_equal(t.numpy(), a)
    if a.size:
        assert t.data_ptr() == a.ctypes.data
    del t


def test_writes_through_torch_change_the_numpy_array_and_owner_is_released():
    a = np.zeros((3, 4), np.float32)
    ref = weakref.ref(owner := Owner())
    t = torch_from_dlpack(D.to_capsule(a.ctypes.data, a.shape, a.dtype, CPU, owner))
    del owner
    assert ref() is not None and len(D._REGISTRY) == 1       # the consumer holds it
    t[1, 2] = 7.0
    t[2] += 1
    assert a[1, 2] == 7.0 and (a[2] == 1).all()              # zero copy
    del t
    gc.collect()
    assert ref() is None and not D._REGISTRY


def test_numpy_reads_exported_host_array():
    a = np.arange(10, dtype=np.int32)

    class Producer:                                          # numpy.from_dlpack takes objects, not capsules
        def __dlpack__(self, **kw):
            return _export(a)

        def __dlpack_device__(self):
            return CPU

    b = np.from_dlpack(Producer())
    assert b.ctypes.data == a.ctypes.data and b.dtype == a.dtype
    np.testing.assert_array_equal(b, a)
    del b


def test_unconsumed_capsule_calls_the_deleter_when_dropped():
    Owner.alive = 0
    owners = [Owner() for _ in range(5)]
    refs = [weakref.ref(o) for o in owners]
    caps = [D.to_capsule(4096 * (i + 1), (i, 2), np.float32, CUDA, o) for i, o in enumerate(owners)]
    del owners
    assert Owner.alive == 5 and len(D._REGISTRY) == 5
    del caps
    assert Owner.alive == 0 and all(r() is None for r in refs) and not D._REGISTRY


def test_capsule_dropped_on_a_c_error_path_still_frees_its_owner():
    # int() fails in C, and CPython drops the temporary capsule while the TypeError is
    # pending. A ctypes callback cannot hand that exception back, so the deleter still
    # runs, the TypeError goes to sys.unraisablehook, and the caller gets SystemError.
    ref = weakref.ref(owner := Owner())
    seen = []
    old, sys.unraisablehook = sys.unraisablehook, seen.append
    try:
        with pytest.raises((TypeError, SystemError)):
            int(D.to_capsule(64, (2,), np.float32, CUDA, owner))
    finally:
        sys.unraisablehook = old
    del owner
    assert ref() is None and not D._REGISTRY
    assert [type(u.exc_value) for u in seen] == [TypeError]   # the original error is reported, once


def test_release_runs_the_deleter_once_across_python_threads():
    owners = [Owner() for _ in range(64)]
    refs = [weakref.ref(o) for o in owners]
    caps = [D.to_capsule(8 * (i + 1), (i,), np.int32, CUDA, o) for i, o in enumerate(owners)]
    imported = [D.from_capsule(c) for c in caps]
    del owners, caps
    assert len(D._REGISTRY) == 64
    barrier = threading.Barrier(4)

    def work():
        barrier.wait()
        for im in imported:
            im.release()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not D._REGISTRY and all(r() is None for r in refs)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses pthread_create from the C library")
def test_deleter_called_from_threads_python_never_saw():
    # A C consumer may free from its own native threads. Each thread below starts directly
    # in our deleter (void f(void*) used as a start routine, its return value ignored) and
    # has no Python thread state. The ctypes thunk must take the GIL itself.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p,
                                    ctypes.c_void_p]
    libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]     # a CDLL call: releases the GIL
    owners = [Owner() for _ in range(16)]
    refs = [weakref.ref(o) for o in owners]
    caps = [D.to_capsule(16 * (i + 1), (i, 3), np.float32, CUDA, o) for i, o in enumerate(owners)]
    del owners
    addrs = list(D._REGISTRY)
    for c in caps:          # consume them the way a C consumer does: rename, then own the deleter
        assert ctypes.pythonapi.PyCapsule_SetName(ctypes.py_object(c), b"used_dltensor") == 0
    tids = []
    for a in addrs:
        fn = ctypes.cast(D.DLManagedTensor.from_address(a).deleter, ctypes.c_void_p).value
        tid = ctypes.c_ulong()
        assert libc.pthread_create(ctypes.byref(tid), None, fn, a) == 0
        tids.append(tid.value)
    for tid in tids:
        assert libc.pthread_join(tid, None) == 0
    del caps                # renamed: their destructors must not call the deleter again
    assert not D._REGISTRY and all(r() is None for r in refs)


# ---------------------------------------------------------------- import from torch

TORCH_TENSORS = {
    "contiguous": lambda: torch.arange(24, dtype=torch.float32).reshape(2, 3, 4),
    "transposed": lambda: torch.arange(24, dtype=torch.float64).reshape(2, 3, 4).transpose(0, 2),
    "sliced": lambda: torch.arange(40, dtype=torch.int64).reshape(5, 8)[1:4, 2:7],
    "bool": lambda: torch.tensor([[True, False], [False, True]]),
    "0-d": lambda: torch.tensor(2.5),
    "int32 stepped": lambda: torch.arange(30, dtype=torch.int32)[3::4],
    "uint8": lambda: torch.tensor([0, 7, 255], dtype=torch.uint8),
}


@pytest.mark.parametrize("name", TORCH_TENSORS)
def test_import_torch_tensor_matches_what_torch_reports(name):
    t = TORCH_TENSORS[name]()
    im = D.from_object(t)
    assert im.ptr == t.data_ptr()
    assert im.shape == tuple(t.shape)
    assert im.strides == t.stride()
    assert im.dtype == np.dtype(str(t.dtype).removeprefix("torch."))
    assert im.device == CPU
    assert im.is_contiguous == t.is_contiguous()
    # The pointer and strides reach the data: read it back through them.
    n = max(1, sum((d - 1) * s for d, s in zip(im.shape, im.strides)) + 1)
    buf = np.ctypeslib.as_array((ctypes.c_byte * (n * im.dtype.itemsize)).from_address(im.ptr))
    view = np.lib.stride_tricks.as_strided(buf.view(im.dtype), im.shape,
                                           [s * im.dtype.itemsize for s in im.strides])
    np.testing.assert_array_equal(view, t.numpy())
    if name == "sliced":
        assert t.storage_offset() and im.ptr == t.untyped_storage().data_ptr() + t.storage_offset() * 8
    im.release()
    im.release()                                             # harmless the second time
    assert im.released


def test_import_keeps_torch_memory_alive_until_release():
    # A torch tensor over a NumPy array keeps the array alive. The array's weakref shows
    # when torch's deleter has run.
    arr = np.arange(6, dtype=np.float32)
    ref = weakref.ref(arr)
    t = torch.from_numpy(arr)
    im = D.from_object(t)
    assert im.ptr == arr.ctypes.data
    del arr, t
    gc.collect()
    assert ref() is not None                                 # the import holds the memory
    im.release()
    gc.collect()
    assert ref() is None


def test_gc_of_an_unreleased_import_calls_the_deleter():
    ref = weakref.ref(owner := Owner())
    im = D.from_capsule(D.to_capsule(256, (4, 4), np.float64, CUDA, owner))
    del owner
    assert ref() is not None
    del im
    gc.collect()
    assert ref() is None and not D._REGISTRY


def test_is_contiguous_ignores_size_one_dims():
    im = D.from_object(torch.zeros(3, 1, 4).as_strided((3, 1, 4), (4, 99, 1)))
    assert im.is_contiguous and im.strides == (4, 99, 1)
    im.release()
    im = D.from_object(torch.zeros(4, 3).t())
    assert not im.is_contiguous
    im.release()


@pytest.mark.parametrize("dtype,names", [(torch.complex64, ("complex64", "kDLComplex")),
                                         (torch.complex128, ("complex128", "kDLComplex"))])
def test_unsupported_dtype_raises_dtype_error_naming_it(dtype, names):
    t = torch.zeros(3, dtype=dtype)
    cap = t.__dlpack__()
    with pytest.raises(DTypeError) as err:
        D.from_capsule(cap)
    assert all(n in str(err.value) for n in names)
    # Refused before consuming: the capsule stays the producer's, so its destructor frees it.
    assert ctypes.pythonapi.PyCapsule_IsValid(ctypes.py_object(cap), b"dltensor")
    with pytest.raises(DTypeError, match=names[0]):
        D.from_object(t)


def test_refused_capsule_is_freed_by_the_producer():
    arr = np.zeros(3, np.complex64)
    ref = weakref.ref(arr)
    t = torch.from_numpy(arr)
    cap = t.__dlpack__()
    del arr, t
    with pytest.raises(DTypeError):
        D.from_capsule(cap)
    gc.collect()
    assert ref() is not None                                 # the capsule still holds it
    del cap
    gc.collect()
    assert ref() is None


def test_lanes_other_than_one_are_refused():
    cap = D.to_capsule(512, (4,), np.float32, CUDA, None)
    (addr,) = D._REGISTRY
    D.DLManagedTensor.from_address(addr).dl_tensor.dtype.lanes = 4
    with pytest.raises(DTypeError, match="lanes=4"):
        D.from_capsule(cap)
    del cap


def test_used_or_foreign_capsules_raise_argument_error():
    t = torch.ones(2)
    cap = t.__dlpack__()
    D.from_capsule(cap).release()
    with pytest.raises(ArgumentError, match="already consumed"):
        D.from_capsule(cap)
    tt = torch_from_dlpack(cap2 := _export(np.ones(2)))
    with pytest.raises(ArgumentError, match="already consumed"):  # torch consumed it
        D.from_capsule(cap2)
    del tt
    with pytest.raises(ArgumentError):
        D.from_capsule(object())
    with pytest.raises(ArgumentError):
        D.from_object(3.0)


def test_null_strides_mean_contiguous():
    cap = D.to_capsule(1024, (2, 3, 4), np.uint8, CUDA, None)
    (addr,) = D._REGISTRY
    D.DLManagedTensor.from_address(addr).dl_tensor.strides = None
    im = D.from_capsule(cap)
    assert im.strides == (12, 4, 1) and im.is_contiguous
    im.release()


def test_from_object_passes_stream_only_when_given():
    calls = []

    class Producer:
        def __dlpack__(self, **kw):
            calls.append(kw)
            return D.to_capsule(2048, (3,), np.float32, CUDA, None)

    D.from_object(Producer()).release()
    D.from_object(Producer(), stream=1).release()
    assert calls == [{}, {"stream": 1}]


# ---------------------------------------------------------------- device (kDLCUDA, 0): our reader only

@pytest.mark.parametrize("shape,dtype", [((2, 3), np.float32), ((), np.int64), ((0, 5), np.bool_),
                                         ((4, 1, 7), np.float16)])
def test_cuda_round_trip_through_our_reader(shape, dtype):
    ptr = 0x7F0000001000
    ref = weakref.ref(owner := Owner())
    cap = D.to_capsule(ptr, shape, dtype, (D.kDLCUDA, 1), owner)
    del owner
    im = D.from_capsule(cap)
    assert (im.ptr, im.shape, im.dtype, im.device) == (ptr, shape, np.dtype(dtype), (2, 1))
    assert im.strides == tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
    assert im.is_contiguous
    del cap                                                  # consumed: dropping it frees nothing
    assert ref() is not None
    im.release()
    assert ref() is None


def test_to_capsule_rejects_bad_arguments():
    with pytest.raises(DTypeError):
        D.to_capsule(64, (2,), np.complex64, CUDA, None)
    with pytest.raises(DTypeError):
        D.to_capsule(64, (2,), np.dtype(">f4"), CUDA, None)
    with pytest.raises(ArgumentError):
        D.to_capsule(64, (-1,), np.float32, CUDA, None)
    with pytest.raises(ArgumentError):
        D.to_capsule(-8, (2,), np.float32, CUDA, None)
    with pytest.raises(ArgumentError):
        D.to_capsule(64, (2,), np.float32, "cuda", None)
