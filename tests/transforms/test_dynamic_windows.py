"""Convolution and pooling over a dynamic height and width (issue 36): a small CNN written
with tc.nn, traced with every dim dynamic, compiles once for every image and batch size, and
its loss, gradients and batch-norm statistics match eager tracecomp's."""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc
from tracecomp import nn
from tracecomp.nn import functional as F

SHAPES = [(2, 16, 16), (5, 20, 24), (2, 32, 32), (5, 16, 16)]     # (batch, H, W): 3 sizes, 2 batches


def _cnn() -> nn.Module:
    tc.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 6, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 4))


def _step(model, x, y):
    return tc.value_and_grad(lambda m: F.cross_entropy(m(x), y))(model)


def _tensors(module) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in module.state_dict().items() if np.asarray(v).dtype.kind == "f"}


def _close(got: dict, want: dict, what: str):
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=2e-4, atol=2e-5, err_msg=f"{what} {k}")


@pytest.mark.parametrize("dynamic", [True, pytest.param(None, marks=pytest.mark.slow)])
def test_a_cnn_train_step_compiles_once_for_every_image_and_batch_size(dynamic):
    compiled, eager = _cnn(), _cnn()
    f = tc.trace(_step, dynamic=dynamic)
    rng = np.random.default_rng(0)
    # the first dynamic compile must see H != W: equal sizes share a name (duck sizing, as
    # PyTorch's), and a compile for H = W would not serve 20x24
    for n, h, w in (SHAPES[1:] + SHAPES[:1] if dynamic else SHAPES):
        x = rng.standard_normal((n, 3, h, w)).astype(np.float32)
        y = rng.integers(0, 4, n)
        loss, grads = f(compiled, x, y)
        want_loss, want_grads = _step(eager, tc.tensor(x), tc.tensor(y))
        np.testing.assert_allclose(loss.item(), want_loss.item(), rtol=1e-5, err_msg=f"loss at {(n, h, w)}")
        _close(_tensors(grads), _tensors(want_grads), f"gradient at {(n, h, w)}:")
        _close(_tensors(compiled), _tensors(eager), f"batch-norm statistics at {(n, h, w)}:")
    # True: dynamic from the first call; None (torch.compile's default): the first shape, then dynamic
    assert len(f.signatures) == (1 if dynamic else 2), f.signatures


@pytest.mark.parametrize("op", ["conv2d", "max_pool2d"])
def test_the_gradient_of_a_window_op_with_dynamic_height_and_width(op):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3, 3, 3))

    def loss(x):
        y = tc.conv2d(x, tc.tensor(w), stride=2, padding=1) if op == "conv2d" else tc.max_pool2d(x, 3, 2, 1)
        return (y * y).sum()
    g = tc.trace(tc.grad(loss), dynamic={"x": {2: "h", 3: "w"}})
    for h, wd in [(7, 9), (8, 8), (11, 6)]:
        x = rng.standard_normal((2, 3, h, wd))
        np.testing.assert_allclose(np.asarray(g(x)), np.asarray(tc.grad(loss)(tc.tensor(x))), rtol=1e-10,
                                   atol=1e-10, err_msg=f"{op} at {h}x{wd}")
        assert tc.gradcheck(loss, (tc.tensor(x[:1, :, :6, :5], requires_grad=True),))
    assert len(g.signatures) == 1, g.signatures


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "linear"])
def test_interpolate_over_a_dynamic_length(mode):
    """By size, and by a dyadic scale_factor (floor(n * 1.5) = (3n) // 2): one compile."""
    rng = np.random.default_rng(2)
    for kwargs in ({"size": 7}, {"scale_factor": 1.5}, {"scale_factor": 0.75}):
        fn = lambda x: tc.interpolate(x, mode=mode, **kwargs)        # noqa: E731
        f = tc.trace(fn, dynamic={"x": {2: "n"}})
        for n in (5, 8, 13):
            x = rng.standard_normal((2, 3, n)).astype(np.float32)
            np.testing.assert_allclose(np.asarray(f(x)), np.asarray(fn(tc.tensor(x))), rtol=1e-6, atol=1e-6,
                                       err_msg=f"{mode} {kwargs} at {n}")
        assert len(f.signatures) == 1, (kwargs, f.signatures)


def test_a_size_an_op_needs_as_a_number_is_a_tracecomp_error_naming_op_size_and_line():
    """interpolate by a scale that is no dyadic fraction: floor(n * 1.4) in double is no size
    expression.  Named dynamic sizes refuse it; dynamic=True compiles that size specialized."""
    fn = lambda x: tc.interpolate(x, scale_factor=1.4)        # noqa: E731
    with pytest.raises(tc.TracecompError, match=r"interpolate: scale_factor=1.4 .* needs the dynamic size n "
                                                r"as a number(.|\n)*test_dynamic_windows.py"):
        tc.trace(fn, dynamic={"x": {2: "n"}})(np.ones((1, 2, 5), np.float32))
    f = tc.trace(fn, dynamic=True)
    for n in (5, 6):
        x = np.arange(2 * n, dtype=np.float32).reshape(1, 2, n)
        np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(fn(tc.tensor(x))))


def test_an_exported_conv_takes_its_height_and_width_at_run_time(tmp_path):
    """The window counts floor((h + 1)/2) are computed by the library's entry point from the
    sizes, and by tc.load for the output's shape."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)

    def fn(x):
        y = tc.relu(tc.conv2d(x, tc.tensor(w), stride=2, padding=1))       # (n, 4, floor((h + 1)/2), ...)
        return y, tc.adaptive_avg_pool2d(y, (2, 3))
    path = str(tmp_path / "libconv.so")
    example = rng.standard_normal((2, 3, 17, 13)).astype(np.float32)
    tc.export(fn, [example], path, dynamic={"x": {0: "n", 2: "h", 3: "w"}})
    header = open(path[:-3] + ".h").read()
    assert all(f"int64_t {size}" in header for size in "nhw")
    lib = tc.load(path)
    for shape in [(1, 3, 9, 9), (3, 3, 20, 31), (2, 3, 64, 5)]:
        x = rng.standard_normal(shape).astype(np.float32)
        for got, want in zip(lib(x), fn(tc.tensor(x))):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5, err_msg=str(shape))


def test_a_window_that_may_not_fit_every_exported_size_is_refused_naming_op_size_and_line(tmp_path):
    """Exported, h may be 1: a 2x2 max-pool of a conv's floor((h + 1)/2) rows may not fit."""
    def fn(x):
        return tc.max_pool2d(tc.conv2d(x, tc.ones(4, 3, 3, 3), stride=2, padding=1), 2)
    with pytest.raises(tc.TracecompError, match=r"max_pool2d(.|\n)*cannot decide whether floor\(\(h \+ 1\)/2\) - 2 < 0"
                                                r"(.|\n)*test_dynamic_windows.py"):
        tc.export(fn, [np.ones((1, 3, 16, 16), np.float32)], str(tmp_path / "libbad.so"), dynamic={"x": {2: "h"}})


def test_conv_transpose2d_with_every_dim_dynamic_kernel_included_compiles_once():
    """A dynamic kernel size sums the taps as a gather (library/windows.py: summed_windows).
    (With groups, C // groups of a dynamic C is a floor division that the reshapes cannot
    take: each channel count compiles specialized.)"""
    rng = np.random.default_rng(4)
    fn = lambda x, w: tc.conv_transpose2d(x, w, None, (2, 3), (1, 0), (1, 2), 1, (1, 2))    # noqa: E731
    f = tc.trace(fn, dynamic=True)
    for (h, wd), (kh, kw) in [((9, 11), (5, 7)), ((10, 13), (6, 8)), ((12, 8), (3, 5))]:
        x, w = rng.standard_normal((2, 4, h, wd)), rng.standard_normal((4, 3, kh, kw))
        np.testing.assert_allclose(np.asarray(f(x, w)), np.asarray(fn(tc.tensor(x), tc.tensor(w))), rtol=1e-12,
                                   atol=1e-12, err_msg=f"{(h, wd)} kernel {(kh, kw)}")
    assert len(f.signatures) == 1, f.signatures


def test_summed_windows_adds_each_column_into_its_window_as_col2im(monkeypatch):
    """The gather form, forced with static sizes, against col2im (strides, dilations, padding)."""
    from tracecomp.library import windows
    rng = np.random.default_rng(5)
    for size, k, d, p, s in [((7, 9), (3, 2), (1, 2), (1, 0), (2, 3)), ((8, 6), (2, 3), (2, 1), (1, 1), (2, 2))]:
        counts = [(n + 2 * pp - dd * (kk - 1) - 1) // ss + 1 for n, kk, dd, pp, ss in zip(size, k, d, p, s)]
        cols = tc.tensor(rng.standard_normal((2, 3 * k[0] * k[1], counts[0] * counts[1])))
        want = np.asarray(tc.col2im(cols, list(size), list(k), list(d), list(p), list(s)))
        with monkeypatch.context() as m:
            m.setattr(windows, "is_dynamic", lambda _: True)
            got = np.asarray(windows.summed_windows(cols, list(size), list(k), list(d), list(p), list(s)))
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=f"{size} {k}")
