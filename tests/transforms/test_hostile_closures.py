"""Hostile closures (issue 33, items 2 and 5): tensors a traced function closes over are read
at every call, never frozen into the trace; NumPy arrays stay constants, with a warning for
large ones; a traced function pickled again after a global changed arrives with the new
value."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.runtime import compile_worker

X = np.arange(12, dtype=np.float32).reshape(4, 3) / 10


def linear():
    tc.manual_seed(0)
    return tc.nn.Linear(3, 2)


def eager(model, x=X):
    with tc.no_grad():
        return model(tc.tensor(x)).numpy()


def compiles():
    return compile_worker.compiled_modules()


# ------------------------------------------------------------------ item 2: live tensors
def test_module_parameters_after_an_sgd_step_are_read_without_a_recompile():
    model = linear()
    f = tc.trace(lambda x: model(x))
    np.testing.assert_allclose(f(X).numpy(), eager(model), rtol=1e-6)
    opt = tc.optim.SGD(model.parameters(), lr=0.5)
    before = compiles()
    for _ in range(3):
        opt.zero_grad()
        (model(tc.tensor(X)) ** 2).sum().backward()
        opt.step()
        np.testing.assert_allclose(f(X).numpy(), eager(model), rtol=1e-6)
    assert compiles() == before and len(f.signatures) == 1


def test_an_in_place_write_into_a_closed_over_tensor_is_seen():
    w = tc.tensor(np.ones(3, np.float32))
    f = tc.trace(lambda x: x * w)
    x = np.full(3, 2, np.float32)
    np.testing.assert_array_equal(f(x).numpy(), [2, 2, 2])
    w[0] = 5
    np.testing.assert_array_equal(f(x).numpy(), [10, 2, 2])
    w.mul_(2) if hasattr(w, "mul_") else w.__imul__(2)
    np.testing.assert_array_equal(f(x).numpy(), [20, 4, 4])


def test_rebinding_a_parameter_to_a_new_tensor_of_the_same_type_is_seen_without_a_recompile():
    model = linear()
    f = tc.trace(lambda x: model(x))
    f(X)
    before = compiles()
    model.weight = tc.nn.Parameter(tc.tensor(np.full((2, 3), 2, np.float32)))
    np.testing.assert_allclose(f(X).numpy(), eager(model), rtol=1e-6)
    model.bias = tc.tensor(np.array([1, -1], np.float32))        # a plain tensor, not a Parameter
    np.testing.assert_allclose(f(X).numpy(), eager(model), rtol=1e-6)
    assert compiles() == before


def test_a_submodule_replaced_by_another_of_the_same_class_is_read():
    tc.manual_seed(0)
    model = tc.nn.Sequential(tc.nn.Linear(3, 4), tc.nn.ReLU(), tc.nn.Linear(4, 2))
    f = tc.trace(model)
    f(X)
    setattr(model, "2", tc.nn.Linear(4, 2))
    np.testing.assert_allclose(f(X).numpy(), eager(model), rtol=1e-5)


def test_a_closure_cell_rebound_with_nonlocal_is_read():
    def make():
        w = tc.tensor(np.ones(3, np.float32))

        def f(x):
            return x + w

        def set_w(v):
            nonlocal w
            w = tc.tensor(v)
        return f, set_w
    fn, set_w = make()
    f = tc.trace(fn)
    x = np.zeros(3, np.float32)
    np.testing.assert_array_equal(f(x).numpy(), [1, 1, 1])
    set_w(np.array([3, 4, 5], np.float32))
    np.testing.assert_array_equal(f(x).numpy(), [3, 4, 5])


GLOBAL_W = tc.tensor(np.ones(3, np.float32))
GLOBAL_PARAMS = {"w": tc.tensor(np.ones(3, np.float32)), "list": [tc.tensor(np.ones(3, np.float32))]}


def uses_globals(x):
    return x * GLOBAL_W + GLOBAL_PARAMS["w"] + GLOBAL_PARAMS["list"][0]


def test_globals_and_tensors_in_global_dicts_and_lists_are_read():
    global GLOBAL_W
    f = tc.trace(uses_globals)
    x = np.ones(3, np.float32)
    np.testing.assert_array_equal(f(x).numpy(), [3, 3, 3])
    GLOBAL_W = tc.tensor(np.full(3, 2, np.float32))
    GLOBAL_PARAMS["w"] = tc.tensor(np.full(3, 10, np.float32))
    GLOBAL_PARAMS["list"][0][1] = 100
    np.testing.assert_array_equal(f(x).numpy(), [13, 112, 13])


def test_a_module_attribute_the_code_names_is_read():
    config = types.ModuleType("hostile_config")
    config.scale = tc.tensor(np.ones(2, np.float32))
    fn = types.FunctionType(compile("lambda x: x * config.scale", "<hostile>", "eval").co_consts[0],
                            {"config": config, "__name__": "hostile_config_user"})
    f = tc.trace(fn)
    np.testing.assert_array_equal(f(np.ones(2, np.float32)).numpy(), [1, 1])
    config.scale = tc.tensor(np.array([2, 3], np.float32))
    np.testing.assert_array_equal(f(np.ones(2, np.float32)).numpy(), [2, 3])


def test_a_tensor_of_another_shape_or_dtype_after_rebinding_retraces_and_is_right():
    model = linear()
    f = tc.trace(lambda x: model(x))
    f(X)
    model.weight = tc.nn.Parameter(tc.tensor(np.ones((5, 3), np.float32)))
    model.bias = tc.nn.Parameter(tc.tensor(np.zeros(5, np.float32)))
    out = f(X).numpy()
    assert out.shape == (4, 5)
    np.testing.assert_allclose(out, eager(model), rtol=1e-6)
    w = tc.tensor(np.ones(3, np.float32))
    g = tc.trace(lambda x: x + w)
    g(np.ones(3, np.float32))
    w = tc.tensor(np.ones(3, np.float64))                                  # noqa: F841 - read by g
    g.fn.__closure__[0].cell_contents = tc.tensor(np.ones(3, np.float64))
    assert g(np.ones(3, np.float32)).dtype == tc.float64


def test_a_closed_over_tensor_that_is_gone_makes_the_trace_raise_the_users_error():
    model = linear()
    f = tc.trace(lambda x: model(x))
    f(X)
    del model.weight
    with pytest.raises(AttributeError, match="weight"):
        f(X)


def test_grad_with_respect_to_arguments_treats_closed_over_tensors_as_constants():
    model = linear()
    loss = lambda x: (model(x) ** 2).sum()                                   # noqa: E731
    g = tc.trace(tc.grad(loss))
    np.testing.assert_allclose(g(X).numpy(), tc.grad(loss)(tc.tensor(X)).numpy(), rtol=1e-5)
    assert model.weight.grad is None and model.bias.grad is None
    with tc.no_grad():
        model.weight.mul_(3) if hasattr(model.weight, "mul_") else model.weight.__imul__(3)
    np.testing.assert_allclose(g(X).numpy(), tc.grad(loss)(tc.tensor(X)).numpy(), rtol=1e-5)
    lowered = g.lower(X)
    assert len(lowered.graph.inputs) == 3 and len(lowered.optimized.outputs) == 1    # x, weight, bias


def test_batchnorm_running_statistics_of_a_closed_over_model_update_at_every_call():
    tc.manual_seed(0)
    model = tc.nn.BatchNorm1d(3)
    ref = tc.nn.BatchNorm1d(3)
    f = tc.trace(lambda x: model(x))
    for k in range(3):
        x = (X + k).astype(np.float32)
        np.testing.assert_allclose(f(x).numpy(), eager(ref, x), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(model.running_mean.numpy(), ref.running_mean.numpy(), rtol=1e-6)
        assert model.running_mean._data is not None        # an eager tensor again after the trace


def test_vmap_and_donation_read_closed_over_tensors_too():
    w = tc.tensor(np.ones(3, np.float32))
    batched = tc.vmap(tc.trace(lambda x: x * w))
    xs = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(batched(xs).numpy(), np.ones((2, 3)))
    w[2] = 4
    np.testing.assert_array_equal(batched(xs).numpy(), [[1, 1, 4], [1, 1, 4]])
    step = tc.trace(lambda p: p - w, donate_argnums=(0,))
    p = np.ones(3, np.float32)
    p = step(p).numpy()
    np.testing.assert_array_equal(p, [0, 0, -3])
    np.testing.assert_array_equal(w.numpy(), [1, 1, 4])          # never written into


def test_export_bakes_closed_over_tensors_in_as_constants(tmp_path):
    w = tc.tensor(np.array([1, 2, 3], np.float32))
    f = tc.trace(lambda x: x * w)
    x = np.ones(3, np.float32)
    f(x)
    lib = tc.export(f, [x], str(tmp_path / "libclosed.so"))
    loaded = tc.load(str(tmp_path / "libclosed.so")) if lib is None or not callable(lib) else lib
    w[0] = 7
    np.testing.assert_array_equal(np.asarray(loaded(x)), [1, 2, 3])      # baked at export time
    np.testing.assert_array_equal(f(x).numpy(), [7, 2, 3])               # the traced one reads it


def test_closed_over_numpy_arrays_are_constants_and_large_ones_warn_once():
    small = np.ones(4, np.float32)
    large = np.ones(32, np.float32)
    f = tc.trace(lambda x: (x * large)[:4] + x[:4] * small)
    x = np.ones(32, np.float32)
    with pytest.warns(UserWarning, match=r"NumPy array large .*baked into the trace as a constant") as caught:
        f(x)
    assert not any("small" in str(w.message) for w in caught)
    assert {w.filename for w in caught} == {__file__}                        # names the user's call
    large[:] = 5
    np.testing.assert_array_equal(f(x).numpy(), np.ones(4) * 2)             # still the constant
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f(np.ones(32, np.float64)).numpy()                                   # a retrace: no second warning


def test_a_closed_over_tensor_call_stays_on_the_fast_path():
    w = tc.tensor(np.ones(8, np.float32))
    f = tc.trace(lambda x: x + w)
    x = np.ones(8, np.float32)
    f(x)
    lowered = f.lower(x)
    assert lowered.read_hidden is not None and lowered.mutated_hidden == ()
    assert f._fast and next(iter(f._fast.values()))[0] is lowered


# ------------------------------------------------------------------ item 5: pickles again
RECEIVER = """
import pickle, sys, numpy as np
import tracecomp as tc
x = np.ones(3, np.float32)
out = []
for path in sys.argv[1:]:
    traced = pickle.loads(open(path, 'rb').read())
    out.append(traced(x).numpy().tolist())
print(out)
"""


def test_a_function_pickled_again_after_a_global_changed_arrives_with_the_new_value(tmp_path):
    cloudpickle = pytest.importorskip("cloudpickle")
    code = compile("def scaled(x):\n    return x * SCALE + OFFSET[0] + W\n", "<hostile>", "exec")
    scope = {"__name__": "hostile_by_value", "SCALE": 2.0, "OFFSET": np.zeros(1, np.float32),
             "W": tc.tensor(np.zeros(3, np.float32))}
    exec(code, scope)                                     # a module no receiver can import: by value
    traced = tc.trace(scope["scaled"])
    x = np.ones(3, np.float32)
    np.testing.assert_array_equal(traced(x).numpy(), [2, 2, 2])
    paths = []
    for scale, offset, w0 in ((2.0, 0, 0), (2.0, 0, 0), (3.0, 0, 0), (3.0, 1, 0), (3.0, 1, 5)):
        scope["SCALE"], scope["OFFSET"] = scale, np.full(1, offset, np.float32)
        scope["W"][0] = w0
        paths.append(str(tmp_path / f"f{len(paths)}.pkl"))
        open(paths[-1], "wb").write(cloudpickle.dumps(traced))
    got = subprocess.run([sys.executable, "-c", RECEIVER, *paths], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ))
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == str([[2.0] * 3, [2.0] * 3, [3.0] * 3, [4.0] * 3, [9.0, 4.0, 4.0]])


def test_a_copy_with_the_same_state_is_the_earlier_copy_with_its_compiled_code():
    cloudpickle = pytest.importorskip("cloudpickle")
    w = np.float32(3.0)
    traced = tc.trace(lambda x: x * w)
    first = cloudpickle.loads(cloudpickle.dumps(traced))
    first(np.ones(2, np.float32))
    again = cloudpickle.loads(cloudpickle.dumps(traced))
    assert again is first
    w = np.float32(4.0)                                                        # noqa: F841 - in the closure
    other = cloudpickle.loads(cloudpickle.dumps(traced))
    assert other is not first
    np.testing.assert_array_equal(other(np.ones(2, np.float32)).numpy(), [4, 4])
    assert pickle.loads(pickle.dumps(tc.trace(uses_globals))).fn is uses_globals


class _Hostile:
    """An object whose attribute table raises and whose comparison lies."""

    @property
    def __dict__(self):
        raise RuntimeError("no peeking")

    def __eq__(self, other):
        raise RuntimeError("no comparing")

    __hash__ = object.__hash__


def test_hostile_objects_and_huge_containers_in_the_closure_do_not_break_a_trace():
    hostile, huge = _Hostile(), [np.float32(i) for i in range(100_000)]
    w = tc.tensor(np.ones(2, np.float32))
    f = tc.trace(lambda x: (x + w) if hostile is not None and huge else x)
    np.testing.assert_array_equal(f(np.ones(2, np.float32)).numpy(), [2, 2])
    w[1] = 3
    np.testing.assert_array_equal(f(np.ones(2, np.float32)).numpy(), [2, 4])


def test_a_closed_over_view_whose_base_changed_raises_as_eagerly():
    base = tc.tensor(np.arange(4, dtype=np.float32))
    view = base[1:3]
    f = tc.trace(lambda x: x + view)
    np.testing.assert_array_equal(f(np.zeros(2, np.float32)).numpy(), [1, 2])
    base[1] = 10
    with pytest.raises(tc.ArgumentError, match="changed in place since"):
        view + 1
    with pytest.raises(tc.ArgumentError, match="changed in place since"):
        f(np.zeros(2, np.float32))


def test_tied_weights_untied_by_rebinding_one_side_are_read_as_two_tensors():
    tc.manual_seed(0)
    enc, dec = tc.nn.Linear(3, 3), tc.nn.Linear(3, 3)
    dec.weight = enc.weight                                   # tied: one tensor, two paths
    f = tc.trace(lambda x: dec(enc(x)))

    def expected():
        with tc.no_grad():
            return dec(enc(tc.tensor(X))).numpy()
    np.testing.assert_allclose(f(X).numpy(), expected(), rtol=1e-5)
    assert len(f.lower(X).graph.inputs) == 1 + 3               # x, the tied weight, two biases
    dec.weight = tc.nn.Parameter(tc.tensor(np.eye(3, dtype=np.float32)))
    np.testing.assert_allclose(f(X).numpy(), expected(), rtol=1e-5)
