"""tc.trace(fn, fastmath=...): LLVM fast-math flags on the CPU code only when asked for."""
import re

import numpy as np
import pytest

import tracecomp as tc

W1 = lambda x: x * tc.sigmoid(1.702 * x) + 0.5 * tc.sin(x) * tc.exp(-x * x)   # noqa: E731


def _float_instructions(llvm_text: str) -> list[str]:
    return re.findall(r"= (?:fadd|fsub|fmul|fdiv|fneg|fcmp)\b[^\n]*", llvm_text)


def _unoptimized_llvm(f, *args) -> str:
    return str(f.lower(*args).compiled.module)


def test_default_code_has_no_fast_math_except_reassociable_sums():
    x = np.linspace(-3, 3, 4096, dtype=np.float32)
    text = _unoptimized_llvm(tc.trace(lambda x: W1(x).sum()), x)
    ops = _float_instructions(text)
    assert ops and not any(" fast " in op or "nnan" in op or "contract" in op for op in ops)
    assert any("reassoc" in op for op in ops)          # the sum's accumulation only


def test_fastmath_true_flags_every_float_instruction_and_stays_close():
    x = np.linspace(-3, 3, 4096, dtype=np.float32)
    f = tc.trace(W1, fastmath=True)
    ops = _float_instructions(_unoptimized_llvm(f, x))
    assert ops and all(" fast " in op for op in ops)
    np.testing.assert_allclose(np.asarray(f(x)), np.asarray(tc.trace(W1)(x)), rtol=1e-5, atol=1e-6)


def test_a_set_of_flags_applies_just_those():
    x = np.ones(64, np.float32)
    f = tc.trace(lambda x: x * 2 + 1, fastmath={"contract", "nsz"})
    ops = _float_instructions(_unoptimized_llvm(f, x))
    assert ops and all("nsz contract" in op and " fast " not in op for op in ops)
    assert (np.asarray(f(x)) == 3).all()


def test_fastmath_is_part_of_the_compile_cache_key():
    from tracecomp.runtime.cache import key_parts
    x = np.ones(64, np.float32)
    kernels = tc.trace(lambda x: x + 1).lower(x).program.kernels
    plain = key_parts(kernels, "m", align=None).digest()
    fast = key_parts(kernels, "m", align=None, fastmath=("fast",)).digest()
    assert plain != fast


@pytest.mark.parametrize("bad", ["fast", {"fast"}, {"nnan", "speed"}, [1]])
def test_bad_fastmath_options_are_refused_by_name(bad):
    with pytest.raises(tc.TracecompError, match="fastmath"):
        tc.trace(lambda x: x, fastmath=bad)
