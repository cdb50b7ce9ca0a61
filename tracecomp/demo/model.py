"""The demo's data and model: the 8x8 digits, an MLP, and its train step three ways.

The data is the UCI "Optical Recognition of Handwritten Digits" test set (E. Alpaydin and
C. Kaynak, 1998; CC BY 4.0), 1,797 images of 8x8 pixels with values 0..16, shipped as
tracecomp/data/digits.csv.gz (64 pixel columns and the label per line).

The train step (forward, softmax cross-entropy, backward, SGD update of every parameter)
is written once on tensors (`make_step`), which tracecomp runs compiled (`tc.trace`) or
eagerly (tc.Tensors with autograd), and once by hand in NumPy (`numpy_step`), which is
the reference the other two are checked against.
"""
from __future__ import annotations

import gzip
from importlib import resources

import numpy as np

import tracecomp as tc

PIXELS, CLASSES = 64, 10


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """Images as float32 rows scaled to [0, 1], labels as int64."""
    source = resources.files("tracecomp").joinpath("data", "digits.csv.gz")
    with source.open("rb") as raw, gzip.open(raw, "rt") as text:
        table = np.loadtxt(text, delimiter=",", dtype=np.int64)
    if table.shape[1] != PIXELS + 1:
        raise ValueError(f"{source}: expected {PIXELS + 1} columns, got {table.shape[1]}")
    return (table[:, :PIXELS] / 16.0).astype(np.float32), table[:, PIXELS]


def split(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int):
    """A seeded shuffle into (x_train, y_train, x_test, y_test)."""
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def init_params(hidden: int, seed: int) -> list[np.ndarray]:
    """He-initialized weights for ReLU, zero biases: [w1, b1, w2, b2]."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((PIXELS, hidden)) * np.sqrt(2.0 / PIXELS)
    w2 = rng.standard_normal((hidden, CLASSES)) * np.sqrt(2.0 / hidden)
    return [w1.astype(np.float32), np.zeros(hidden, np.float32),
            w2.astype(np.float32), np.zeros(CLASSES, np.float32)]


def logits(w1, b1, w2, b2, x):
    return tc.relu(x @ w1 + b1) @ w2 + b2


def loss_fn(w1, b1, w2, b2, x, y):
    return tc.cross_entropy(logits(w1, b1, w2, b2, x), y)


def predict(w1, b1, w2, b2, x):
    return logits(w1, b1, w2, b2, x).argmax(dim=1)


def make_step(lr: float):
    """The train step on tensors: (loss, *updated params) from (*params, x, y)."""
    value_and_grad = tc.value_and_grad(loss_fn, argnums=(0, 1, 2, 3))

    def train_step(w1, b1, w2, b2, x, y):
        params = (w1, b1, w2, b2)
        loss, grads = value_and_grad(*params, x, y)
        return [loss] + [p - lr * g for p, g in zip(params, grads)]
    return train_step


def numpy_step(w1, b1, w2, b2, x, y, lr: float) -> list[np.ndarray]:
    """The same step written out by hand: forward, backward, SGD."""
    pre = x @ w1 + b1
    h = np.maximum(pre, 0)
    z = h @ w2 + b2
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    total = e.sum(axis=1, keepdims=True)
    rows = np.arange(len(y))
    loss = np.log(total[:, 0]).mean() - z[rows, y].mean()
    dz = e / total
    dz[rows, y] -= 1
    dz /= len(y)
    dh = (dz @ w2.T) * (pre > 0)
    lr = x.dtype.type(lr)
    return [np.asarray(loss, x.dtype),
            w1 - lr * (x.T @ dh), b1 - lr * dh.sum(axis=0),
            w2 - lr * (h.T @ dz), b2 - lr * dz.sum(axis=0)]
