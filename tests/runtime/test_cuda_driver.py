"""Running on a device: the driver layer's errors, the no-GPU path of
tc.trace(fn, device="cuda"), the device runner on the host emulator (gpu/emulator.py:
the kernels' own code with threads, barriers and warp shuffles emulated), and, where a
GPU is present, every table op and an MLP training step on it against the CPU backend."""
import ctypes

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.runtime.cuda import driver as cuda_driver
from tracecomp.runtime.cuda.emulator import EmulatedContext
from tracecomp.runtime.cuda.runner import CudaProgram, arch_for

from tables.op_samples import SAMPLES, assert_outputs_match
from lower.test_ptx import _mlp_inputs, mlp_loss

HAVE_GPU = cuda_driver.available()
needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason="no CUDA GPU and driver on this machine")
CASES = [s for name, ss in SAMPLES.items() if name not in ("rand", "randn") for s in ss]
# One sample per op (its first), for the default run on the emulator; all of them are slow.
FIRST = list({s.op: s for s in reversed(CASES)}.values())[::-1]


def _as_list(out):
    """The outputs (any pytree of tensors) flattened, in host memory."""
    return [np.asarray(t.cpu()) for t in _leaves(out)]


def _leaves(out):
    if isinstance(out, (tuple, list)):
        return [x for o in out for x in _leaves(o)]
    return [out]


# ---------------------------------------------------------------- without a GPU

@pytest.mark.skipif(HAVE_GPU, reason="a GPU is present: the no-GPU error cannot happen")
def test_device_cuda_without_a_gpu_raises_one_clear_error():
    f = tc.trace(lambda x: x * 2, device="cuda")
    x = np.ones(3, np.float32)
    for _ in range(2):             # and again: the failure is cached, nothing crashes
        with pytest.raises(cuda_driver.CudaUnavailableError, match="CUDA is not available") as err:
            f(x)
        assert isinstance(err.value, tc.TracecompError) and isinstance(err.value, RuntimeError)
    assert ".entry" in f.lower(x).as_text("ptx")        # the PTX needs no GPU


def test_a_missing_driver_library_is_named():
    with pytest.raises(cuda_driver.CudaUnavailableError, match="libtracecomp-missing.so.1 could not be loaded"):
        cuda_driver.driver("libtracecomp-missing.so.1")


def test_unknown_devices_are_refused():
    with pytest.raises(tc.ArgumentError, match="unknown device 'tpu'"):
        tc.trace(lambda x: x, device="tpu")
    with pytest.raises(tc.ArgumentError, match="cannot take device='cuda'"):
        tc.trace(lambda x: x, device="cuda", backend="interp")


class _FakeLibrary:
    """Stands in for libcuda: every call returns the CUresult it is told to."""

    def __init__(self, results):
        self.results = results

    def __getattr__(self, name):
        def call(*args):
            if name == "cuGetErrorName":
                args[1]._obj.value = {2: b"CUDA_ERROR_OUT_OF_MEMORY"}.get(args[0])
            elif name == "cuGetErrorString":
                args[1]._obj.value = {2: b"out of memory"}.get(args[0])
            return self.results.get(name, 0)
        return call


def test_every_failing_call_raises_naming_the_call():
    drv = cuda_driver.Driver(_FakeLibrary({"cuMemAlloc_v2": 2}))
    with pytest.raises(cuda_driver.CudaError, match=r"cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY \(out of memory\)") as err:
        drv.call("cuMemAlloc_v2", ctypes.byref(ctypes.c_uint64()), 16)
    assert err.value.call == "cuMemAlloc_v2" and err.value.code == 2
    with pytest.raises(cuda_driver.CudaError, match="cuInit failed: CUDA_ERROR_999"):
        cuda_driver.Driver(_FakeLibrary({"cuInit": 999}))


def test_arch_follows_the_device():
    assert arch_for((8, 0)) == "sm_80" and arch_for((8, 6)) == "sm_86" and arch_for((9, 0)) == "sm_90"
    assert arch_for((12, 0)) == "sm_120"
    with pytest.raises(tc.TracecompError, match="compute capability 7.5"):
        arch_for((7, 5))


# ---------------------------------------------------------------- the emulator

def _on_emulator(call, inputs):
    low = tc.trace(call).lower(*inputs)
    arrays = [np.asarray(a) for a in inputs]
    return CudaProgram(low.program, EmulatedContext()).on_host(arrays), low.compiled(arrays)


def _emulated_case(s):
    try:
        tc.trace(s.call, backend="interp")(*s.inputs)
    except tc.TracecompError:
        pytest.skip("an error case")
    got, want = _on_emulator(s.call, s.inputs)
    assert_outputs_match(got, want)


@pytest.mark.parametrize("s", FIRST, ids=[s.id for s in FIRST])
def test_emulated_kernels_match_the_cpu_backend(s):
    _emulated_case(s)


OTHERS = [s for s in CASES if all(s is not f for f in FIRST)]


@pytest.mark.slow
@pytest.mark.parametrize("s", OTHERS, ids=[s.id for s in OTHERS])
def test_emulated_kernels_match_the_cpu_backend_for_every_other_sample(s):
    _emulated_case(s)


def test_emulated_mlp_training_step_matches_the_cpu_backend():
    step = tc.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3))
    got, want = _on_emulator(step, _mlp_inputs(batch=8, d_in=20, hidden=24, classes=5))
    assert_outputs_match(got, want)


@pytest.mark.parametrize("shape", [(37, 70), (5, 1100), (3, 4, 9)])
def test_emulated_column_reductions(shape):
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    got, want = _on_emulator(lambda x: (x.amax(0), x.sum(0), x.mean(0, keepdim=True), (x > 0).any(0)), [x])
    assert_outputs_match(got, want)


def test_emulated_long_rows_split_over_blocks():
    x = np.random.default_rng(1).standard_normal(1 << 17).astype(np.float32)
    got, want = _on_emulator(lambda x: (x.sum(), x.amax()), [x])
    assert_outputs_match(got, want)


# ---------------------------------------------------------------- on a GPU

def _on_gpu(call, inputs):
    arrays = [np.asarray(a) for a in inputs]
    return _as_list(tc.trace(call, device="cuda")(*arrays)), _as_list(tc.trace(call)(*arrays))


@needs_gpu
@pytest.mark.parametrize("s", CASES, ids=[s.id for s in CASES])
def test_gpu_matches_the_cpu_backend(s):
    try:
        tc.trace(s.call, backend="interp")(*s.inputs)
    except tc.TracecompError:
        pytest.skip("an error case")
    assert_outputs_match(*_on_gpu(s.call, s.inputs))


@needs_gpu
def test_gpu_mlp_training_step_matches_the_cpu_backend():
    step = tc.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3))
    assert_outputs_match(*_on_gpu(step, _mlp_inputs(batch=256, d_in=784, hidden=512, classes=10)))


def test_emulated_block_searches_keep_the_first_extreme_and_nan():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 3000)).astype(np.float32)
    x[3, 100] = x[3, 2000] = np.nan
    x[5, 7] = x[5, 2900] = 50
    got, want = _on_emulator(lambda x: (x.argmax(dim=1), x.max(dim=1), x.argmin(dim=1)), [x])
    assert_outputs_match(got, want)
    y = rng.integers(-5, 5, size=1 << 17).astype(np.int32)       # many ties, rows split over blocks
    got, want = _on_emulator(lambda y: (y.argmax(), y.argmin(), y.max()), [y])
    assert_outputs_match(got, want)
    got, want = _on_emulator(lambda z: z.argmax(), [np.full(300, -np.inf, np.float32)])
    assert_outputs_match(got, want)


@pytest.mark.parametrize("shapes", [((70, 33), (33, 130)), ((2, 3, 20, 9), (3, 9, 70)), ((65, 1), (1, 64))],
                         ids=["edges", "batched", "k=1"])
def test_emulated_matmul_tiles_cover_every_edge(shapes):
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    got, want = _on_emulator(lambda a, b, c: tc.relu(a @ b + c), [a, b, np.ones(shapes[1][-1], np.float32)])
    assert_outputs_match(got, want)
    got, want = _on_emulator(lambda a, b: (a.mT @ a, (b.mT.to(tc.float64) @ b.mT.mT.to(tc.float64))), [a, b])
    assert_outputs_match(got, want)


def test_every_stage_of_a_cuda_function_prints_without_a_gpu():
    low = tc.trace(lambda x: (x * 2).exp().sum(dim=1), device="cuda").lower(np.ones((4, 8), np.float32))
    assert 'target triple = "nvptx64-nvidia-cuda"' in low.as_text("llvm")
    assert ".target sm_80" in low.as_text("asm") and low.as_text("asm") == low.as_text("ptx")
    for stage in ("graph", "optimized", "loops"):
        assert low.as_text(stage)
