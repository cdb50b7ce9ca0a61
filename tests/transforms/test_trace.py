"""tc.trace: signature caching, retracing (and its explanation), inputs, outputs, errors."""
import logging
import warnings

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.ir.mlir_tool import check_with_mlir_opt, find_mlir_opt
from tracecomp.ir.parser import parse_graph
from tracecomp.ir.printer import print_graph

rng = np.random.default_rng(0)


def _f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_trace_caches_per_signature_and_retraces_on_change():
    calls = []

    def fn(x, y):
        calls.append(1)
        return x * y + 1

    f = tc.trace(fn)
    a, b = _f32(3, 4), _f32(4)
    np.testing.assert_allclose(np.asarray(f(a, b)), a * b + 1, rtol=1e-6)
    f(_f32(3, 4), _f32(4))
    assert len(calls) == 1                     # same signature: reused
    f(_f32(5, 4), _f32(4))
    assert len(calls) == 2                     # new shape: retraced
    f(a.astype(np.float64), b)
    assert len(calls) == 3                     # new dtype: retraced


def test_retrace_is_logged_with_what_changed(caplog):
    f = tc.trace(lambda x, k: x * k, dynamic=False)       # (dynamic dims: test_trace_dynamic.py)
    with caplog.at_level(logging.INFO, logger="tracecomp.transforms.trace"):
        f(_f32(2, 3), 2)
        f(_f32(2, 5), 2)
        f(_f32(2, 5), 3)
    text = caplog.text
    assert "args[0] changed from tensor<2x3xf32> to tensor<2x5xf32>" in text
    assert "args[1] changed from 2 to 3" in text


def test_many_retraces_warn_once_with_history():
    f = tc.trace(lambda x: x + 1, max_retraces=3, dynamic=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 7):
            f(np.ones(n, np.float32))
    msgs = [str(w.message) for w in caught if "traced" in str(w.message)]
    assert len(msgs) == 1
    assert "traced 4 times" in msgs[0] and "tensor<1xf32>" in msgs[0]


def test_pytree_inputs_and_outputs():
    def fn(params, x, scale=1.0):
        h = x @ params["w"] + params["b"]
        return {"out": h * scale, "parts": (h.sum(), [h.mean()])}

    f = tc.trace(fn)
    p = {"w": _f32(4, 3), "b": _f32(3)}
    x = _f32(2, 4)
    out = f(p, x, scale=2.0)
    ref = (x @ p["w"] + p["b"]) * 2.0
    np.testing.assert_allclose(np.asarray(out["out"]), ref, rtol=1e-5)
    assert isinstance(out["parts"], tuple) and isinstance(out["parts"][1], list)
    assert isinstance(out["out"], tc.Tensor)


def test_inputs_may_be_tensors_scalars_or_array_protocol_objects():
    class ArrayLike:
        def __array__(self, dtype=None, copy=None):
            return np.arange(4, dtype=np.float32)

    f = tc.trace(lambda x, y: x + y)
    assert np.asarray(f(tc.ones(4), ArrayLike())).tolist() == [1, 2, 3, 4]
    assert np.asarray(f(np.zeros(4, np.float32), 3)).tolist() == [3, 3, 3, 3]


def test_dlpack_inputs_from_torch_if_installed():
    torch = pytest.importorskip("torch", reason="torch not installed (optional peer)")
    f = tc.trace(lambda x: x * 2)
    out = f(torch.arange(3, dtype=torch.float32))
    assert np.asarray(out).tolist() == [0, 2, 4]


@pytest.mark.parametrize("body, what", [
    (lambda x: 1 if x.sum() > 0 else 0, "bool(tensor)"),
    (lambda x: float(x.sum()), "float(tensor)"),
    (lambda x: x.numpy(), "Tensor.numpy()"),
    (lambda x: x.sum().item(), "Tensor.item()"),
    (lambda x: np.asarray(x), "np.asarray(tensor)"),
])
def test_python_control_flow_on_traced_values_names_the_line(body, what):
    with pytest.raises(tc.TraceError) as info:
        tc.trace(body)(np.ones(3, np.float32))
    msg = str(info.value)
    assert what in msg and "symbolic" in msg and "test_trace.py" in msg


def test_escaped_tracer_is_an_error():
    leaked = []

    def fn(x):
        leaked.append(x)
        return x + 1

    tc.trace(fn)(np.ones(2, np.float32))
    with pytest.raises(tc.TraceError):
        leaked[0] + 1


def test_closed_over_tensors_are_hidden_inputs_and_tensors_made_inside_are_constants():
    w = tc.tensor([1.0, 2.0, 3.0])
    f = tc.trace(lambda x: x * w + tc.tensor([4.0, 5.0, 6.0]) + np.float32(1))
    assert np.asarray(f(np.ones(3, np.float32))).tolist() == [6, 8, 10]
    text = f.lower(np.ones(3, np.float32)).as_text("graph")
    assert "%arg1: tensor<3xf32>" in text and "dense<[1.0, 2.0, 3.0]>" not in text    # read per call
    assert '"tc.constant"()' in text and "dense<[4.0, 5.0, 6.0]>" in text
    baked = f.lower_baked(np.ones(3, np.float32)).as_text("graph")      # what tc.export writes
    assert "%arg1" not in baked and "dense<[1.0, 2.0, 3.0]>" in baked


def test_a_signature_keeps_its_results_apart_from_the_in_place_changes_it_writes_back():
    stats = tc.tensor(np.zeros(3, np.float32))

    def f(x, y):
        y[0] = 5.0                   # an argument changed in place
        stats.add_(x)                # a closed-over tensor changed in place
        return x * 2, x.sum()

    x, y = np.ones(3, np.float32), np.zeros(2, np.float32)
    doubled, total = tc.trace(f)(x, y)
    assert doubled.numpy().tolist() == [2, 2, 2] and total.item() == 3
    assert y.tolist() == [5, 0] and stats.numpy().tolist() == [1, 1, 1]
    lowered = tc.trace(f).lower(x, y)
    assert (lowered.mutated_inputs, lowered.mutated_hidden) == ((1,), (0,))
    assert [v.type.shape for v in lowered.result_outputs] == [(3,), ()]
    assert [v.type.shape for v in lowered.write_backs] == [(2,), (3,)]
    results, inputs, hidden = lowered.split(["a", "b", "y", "stats"])
    assert (results, inputs, hidden) == (["a", "b"], ["y"], ["stats"])


def test_random_ops_draw_fresh_values_each_call():
    f = tc.trace(lambda x: x + tc.rand(3))
    x = np.zeros(3, np.float32)
    a, b = np.asarray(f(x)), np.asarray(f(x))
    assert not np.array_equal(a, b)
    tc.manual_seed(7)
    c = np.asarray(f(x))
    tc.manual_seed(7)
    assert np.array_equal(c, np.asarray(f(x)))


def _mlp(x, w1, b1, w2, b2, target):
    h = tc.relu(tc.linear(x, w1, b1))
    logits = tc.linear(h, w2, b2)
    return tc.cross_entropy(logits, target), tc.layer_norm(h, [h.shape[-1]])


def _mlp_inputs():
    return (_f32(8, 6), _f32(5, 6), _f32(5), _f32(3, 5), _f32(3),
            rng.integers(0, 3, size=8).astype(np.int64))


def test_lower_gives_graph_and_optimized_text_that_round_trip_and_verify():
    from tracecomp.ir.verifier import verify
    lowered = tc.trace(_mlp).lower(*_mlp_inputs())
    for stage, graph in (("graph", lowered.graph), ("optimized", lowered.optimized)):
        text = lowered.as_text(stage)
        assert text == print_graph(graph)
        assert parse_graph(text) == graph
        verify(graph)
    assert "tc.cross_entropy" in lowered.as_text("graph")
    assert "\"tc.cross_entropy\"(" not in lowered.as_text("optimized")      # only as an origin
    assert "test_trace.py" in lowered.as_text("graph")     # user locations on every op
    with pytest.raises(tc.ArgumentError, match="unknown stage"):
        lowered.as_text("bogus")


@pytest.mark.skipif(find_mlir_opt() is None, reason="mlir-opt not installed (Debian mlir-22-tools)")
def test_mlir_opt_accepts_traced_graphs():
    lowered = tc.trace(_mlp).lower(*_mlp_inputs())
    check_with_mlir_opt(lowered.as_text("graph"))
    check_with_mlir_opt(lowered.as_text("optimized"))


def test_traced_mlp_matches_eager():
    inputs = _mlp_inputs()
    eager = _mlp(*[tc.tensor(a) for a in inputs])
    traced = tc.trace(_mlp)(*inputs)
    for e, t in zip(eager, traced):
        np.testing.assert_allclose(np.asarray(t), np.asarray(e), rtol=1e-5, atol=1e-6)


def test_unknown_backend_is_an_error():
    with pytest.raises(tc.ArgumentError, match="unknown backend"):
        tc.trace(lambda x: x, backend="tpu")
