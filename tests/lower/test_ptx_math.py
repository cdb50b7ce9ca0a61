"""The GPU's float32 sin and cos (lower/llvm/math/trig.py): a float32 reduction for |x| <
2^16, the double one beyond, checked on the emulator (the kernel's own LLVM IR) against
float64 NumPy on the floats that are hardest to reduce: those nearest to multiples of pi/2."""
import numpy as np

import tracecomp as tc
from tracecomp.runtime.cuda.emulator import EmulatedContext
from tracecomp.runtime.cuda.runner import CudaProgram


def _hard_floats() -> np.ndarray:
    rng = np.random.default_rng(0)
    near = (np.pi / 2 * np.arange(1, 41721, dtype=np.float64)).astype(np.float32)   # all n pi/2 < 2^16
    x = np.concatenate([rng.uniform(-70000, 70000, 1 << 16), rng.uniform(-4, 4, 1 << 14), near, -near,
                        [0.0, -0.0, 1e-30, -1e-40, 65535.99, 65536.0, 65536.01, 1e10, 3e38]]).astype(np.float32)
    return np.concatenate([x, np.nextafter(near, np.float32(np.inf)), np.nextafter(near, np.float32(0))])


def test_gpu_sin_and_cos_stay_within_two_ulp():
    x = _hard_floats()
    low = tc.trace(lambda x: (tc.sin(x), tc.cos(x)), device="cuda").lower(x)
    assert "fma.rn.f32" in low.as_text("ptx") and "@%p" in low.as_text("ptx")      # the branch
    s, c = CudaProgram(low.program, EmulatedContext()).on_host([x])
    x64 = x.astype(np.float64)
    for got, want in ((s, np.sin(x64)), (c, np.cos(x64))):
        ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
        assert np.max(np.abs(got.astype(np.float64) - want) / ulp) <= 2.0


def test_gpu_trig_of_inf_and_nan_is_nan():
    x = np.array([np.inf, -np.inf, np.nan, 1.0], np.float32)
    s, c = CudaProgram(tc.trace(lambda x: (tc.sin(x), tc.cos(x)), device="cuda").lower(x).program,
                       EmulatedContext()).on_host([x])
    assert np.isnan(s[:3]).all() and np.isnan(c[:3]).all()
    np.testing.assert_allclose([s[3], c[3]], [np.sin(1.0), np.cos(1.0)], rtol=1e-6)
