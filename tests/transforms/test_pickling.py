"""Compiled things travel (issue 16, part 1): tc.trace'd functions, tc.nn modules, optimizer
states and tc.load'ed libraries pickle without their native code, and the copy compiles on
first call, or loads the object code from a compile cache it shares."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.runtime import compile_worker
from tracecomp.transforms.trace import ShapeDtype

cloudpickle = pytest.importorskip("cloudpickle")


def scaled_sine(x, w):
    return tc.sin(x) @ w + 1.0


def inputs():
    rng = np.random.default_rng(0)
    return rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)


@pytest.mark.parametrize("module", [pickle, cloudpickle], ids=["pickle", "cloudpickle"])
def test_a_traced_function_pickles_without_native_code_and_compiles_again(module):
    traced = tc.trace(scaled_sine)
    x, w = inputs()
    expected = traced(x, w).numpy()
    data = module.dumps(traced)
    assert len(data) < 4096                     # the function by reference, options, signatures
    before = compile_worker.compiled_modules()
    copy = module.loads(data)
    assert compile_worker.compiled_modules() == before    # nothing compiles on arrival
    assert copy.signatures == traced.signatures and len(copy.signatures) == 1
    np.testing.assert_array_equal(copy(x, w).numpy(), expected)


def test_a_lambda_travels_by_value_with_cloudpickle():
    scale = np.float32(3.0)
    traced = tc.trace(lambda x: x * scale + 1, donate_argnums=(0,), cache_size=5)
    copy = cloudpickle.loads(cloudpickle.dumps(traced))
    assert copy.donate_argnums == (0,) and copy.cache_size == 5
    np.testing.assert_array_equal(copy(np.ones(3, np.float32)).numpy(), [4, 4, 4])


def test_modules_and_optimizer_state_with_a_traced_step_pickle():
    tc.manual_seed(0)
    model = tc.nn.Sequential(tc.nn.Linear(4, 8), tc.nn.ReLU(), tc.nn.Linear(8, 2))
    opt = tc.optim.AdamW(lr=1e-2)
    state = opt.init(model)

    def step(model, state, x):
        loss, grads = tc.value_and_grad(lambda m: (m(x) ** 2).mean())(model)
        model, state = opt.update(grads, state, model)
        return model, state, loss
    traced = tc.trace(step)
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    model, state, _ = traced(model, state, x)
    copy_traced, copy_model, copy_state = cloudpickle.loads(cloudpickle.dumps((traced, model, state)))
    ours = traced(model, state, x)
    theirs = copy_traced(copy_model, copy_state, x)
    assert float(ours[2]) == float(theirs[2])
    for a, b in zip(ours[0].parameters(), theirs[0].parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_fresh_process_loads_the_code_from_a_shared_cache_without_llvm(tmp_path):
    """What a Dask worker does with a pickled function: the parent's compile filled the cache
    folder, so the child links the stored object code and never runs LLVM.  The parent is a
    fresh process too, which first compiles in its own folder (so it tunes there) and then
    moves to the shared one: the state of this test process (an earlier test may have run
    its first program with the cache off) does not decide the outcome."""
    folder = tmp_path / "shared-cache"
    parent = f"""
import pickle, numpy as np
import tracecomp as tc
import test_pickling as T
x, w = T.inputs()
tc.trace(lambda a: a + 1)(x)                  # the first program, in the default folder
tc.compile_cache.directory = {str(folder)!r}
traced = tc.trace(T.scaled_sine)
expected = traced(x, w).numpy()
open({str(tmp_path / 'fn.pkl')!r}, 'wb').write(pickle.dumps((traced, x, w, expected)))
"""
    child = f"""
import pickle, sys, numpy as np
import tracecomp as tc
from tracecomp.runtime import compile_worker
tc.compile_cache.directory = {str(folder)!r}
traced, x, w, expected = pickle.loads(open({str(tmp_path / 'fn.pkl')!r}, 'rb').read())
np.testing.assert_array_equal(traced(x, w).numpy(), expected)
print(compile_worker.compiled_modules(), tc.compile_cache.stats.hits)
"""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    made = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, env=env, timeout=300)
    assert made.returncode == 0, made.stderr
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    compiled, hits = map(int, out.stdout.split())
    assert compiled == 0 and hits >= 1


def test_a_loaded_library_pickles_as_its_path_and_checks_the_file(tmp_path):
    import shutil
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to link the exported library")
    x, w = inputs()
    path = str(tmp_path / "libsine.so")
    tc.export(scaled_sine, [x, w], path)
    loaded = tc.load(path)
    copy = pickle.loads(pickle.dumps(loaded))
    np.testing.assert_array_equal(np.asarray(copy(x, w)), np.asarray(loaded(x, w)))
    data = pickle.dumps(loaded)
    tc.export(lambda x, w: tc.cos(x) @ w, [x, w], path, name=loaded.name)     # the file changes
    with pytest.raises(tc.core.errors.BackendError, match="changed since the function was pickled"):
        pickle.loads(data)


def test_eval_shape_traces_without_data_or_compiling():
    traced = tc.trace(lambda x, w: {"y": tc.sin(x) @ w, "n": (x > 0).sum(dim=1)})
    before = compile_worker.compiled_modules()
    out = traced.eval_shape(ShapeDtype((100, 7), np.float64), np.zeros((7, 2), np.float64))
    assert out == {"y": ShapeDtype((100, 2), np.dtype(np.float64)), "n": ShapeDtype((100,), np.dtype(np.int64))}
    assert compile_worker.compiled_modules() == before
    with pytest.raises(tc.ShapeError):
        traced.eval_shape(ShapeDtype((100, 7), np.float32), ShapeDtype((6, 2), np.float32))


def test_numpy_takes_tracecomp_dtypes():
    assert np.dtype(tc.float32) == np.float32
    assert np.zeros(2, tc.int64).dtype == np.int64


def test_code_sent_by_value_still_names_its_file_and_line():
    """cloudpickle sends a lambda's code as "<dynamic-code>"; the copy names this file again,
    so an error on a Dask worker points at the user's line."""
    def product(x, w):          # a helper that travels with the lambda
        return x @ w
    line = product.__code__.co_firstlineno + 1
    traced = tc.trace(lambda x, w: tc.relu(product(x, w)))
    copy = cloudpickle.loads(cloudpickle.dumps(traced))
    assert copy.fn.__code__.co_filename == traced.fn.__code__.co_filename
    with pytest.raises(tc.ShapeError, match=rf"at .*test_pickling\.py:{line}\b"):
        copy(np.ones((2, 3), np.float32), np.ones((4, 2), np.float32))
