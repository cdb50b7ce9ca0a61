"""`tracecomp demo cnn`: a small convolutional network, written with tc.nn, on the 8x8 digits.

The whole train step (forward, cross-entropy, backward, AdamW update of every parameter)
is one compiled function: `tc.trace(train_step, donate_argnums=(0, 1))`, where
`train_step(model, opt_state, x, y, lr)` calls `tc.value_and_grad` on the model (a
module is a pytree: its gradient is module-shaped) and the optimizer's pure
`opt.update`, and returns the new model and optimizer state.  Both are donated: the new
values may be written into their memory.  The lr follows a cosine schedule; it is a
NumPy scalar, data to the compiled step, so the step compiles once.

The demo checks the compiled step against the same step run eagerly, trains with a
progress bar on stderr, times the compiled and the eager step, reports the held-out
accuracy (the MLP demo's 1438/359 split) and writes loss.svg into the output folder.
"""
from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass, field

import numpy as np

import tracecomp as tc
from tracecomp import nn
from .model import load_digits, split
from .plots import Series, line_chart_svg, write_svg
from .progress import ProgressBar

TEST_FRACTION = 0.2          # as the MLP demo: the same 1438/359 split for a seed
WEIGHT_DECAY = 0.01
EAGER_SECONDS = 1.0          # how long the eager step is timed for the comparison


@dataclass
class Options:
    epochs: int = 15
    batch_size: int = 32
    lr: float = 3e-3
    out: str = "tracecomp_demo_cnn"
    seed: int = 0


@dataclass
class Result:
    compile_seconds: float
    max_diff_vs_eager: float
    steps: int
    train_seconds: float
    steps_per_second: float
    eager_steps_per_second: float
    accuracy: float
    losses: list[float] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = Options()
    p.add_argument("--epochs", type=int, default=d.epochs, help=f"passes over the training set (default {d.epochs})")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=f"images per step (default {d.batch_size})")
    p.add_argument("--lr", type=float, default=d.lr,
                   help=f"AdamW's peak learning rate, cosine-annealed to 0 (default {d.lr})")
    p.add_argument("--out", default=d.out, metavar="FOLDER", help=f"where loss.svg goes (default ./{d.out})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"seed of the split, init and shuffles (default {d.seed})")


def options_from(args: argparse.Namespace) -> Options:
    o = Options(args.epochs, args.batch_size, args.lr, args.out, args.seed)
    for name in ("epochs", "batch_size"):
        if getattr(o, name) < 1:
            raise tc.ArgumentError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(o, name)}")
    if not o.lr > 0:
        raise tc.ArgumentError(f"--lr must be positive, got {o.lr}")
    return o


# ------------------------------------------------------------------ data, model, step
def load_images(seed: int):
    """The digits as 1x8x8 images, split as the MLP demo splits them."""
    x, y = load_digits()
    x_train, y_train, x_test, y_test = split(x, y, TEST_FRACTION, seed)
    return x_train.reshape(-1, 1, 8, 8), y_train, x_test.reshape(-1, 1, 8, 8), y_test


def build_model(seed: int) -> nn.Sequential:
    tc.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),                              # 32 x 4 x 4
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 64), nn.ReLU(),
        nn.Linear(64, 10))


def make_optimizer(o: Options) -> tc.optim.AdamW:
    return tc.optim.AdamW(lr=o.lr, weight_decay=WEIGHT_DECAY)


def make_train_step(opt):
    """(model, opt_state, x, y, lr) -> (model, opt_state, loss): run eagerly as it is,
    or compiled by tc.trace."""
    def loss_fn(model, x, y):
        return tc.cross_entropy(model(x), y)

    def train_step(model, opt_state, x, y, lr):
        loss, grads = tc.value_and_grad(loss_fn)(model, x, y)
        model, opt_state = opt.update(grads, opt_state, model, lr=lr)
        return model, opt_state, loss
    return train_step


def predict(model, x):
    return model(x).argmax(dim=1)


def cosine_lr(peak: float, step: int, total: int) -> np.float64:
    """CosineAnnealingLR's closed form (eta_min 0), as data for the compiled step."""
    return np.float64(0.5 * peak * (1 + math.cos(math.pi * step / total)))


def copy_tree(tree):
    """Fresh tensors with the same values: a donated original may hold the step's output."""
    return tc.tree_map(lambda t: tc.tensor(np.array(t)), tree)


def as_float64(tree):
    """A float64 copy (integer leaves, if any, keep their type)."""
    return tc.tree_map(lambda t: tc.tensor(np.array(t, np.float64 if np.asarray(t).dtype.kind == "f" else None)), tree)


def max_difference(tree, other) -> float:
    """The largest |a - b| over the leaves of two pytrees of one structure."""
    diffs = []
    tc.tree_map(lambda a, b: diffs.append(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))),
                tree, other)
    return max(diffs)


def batches(x, y, size: int, rng: np.random.Generator):
    """One epoch of shuffled full batches (the last partial one is dropped: one shape)."""
    order = rng.permutation(len(x))
    for start in range(0, len(x) - size + 1, size):
        take = order[start:start + size]
        yield x[take], y[take]


def summary(model: nn.Sequential, image_shape=(1, 8, 8)) -> list[str]:
    """One line per layer: its output shape and parameter count (shapes from an eager pass)."""
    lines, x = [], tc.zeros((1, *image_shape))
    for layer in model:
        x = layer(x)
        count = sum(p.numel() for p in layer.parameters())
        lines.append(f"  {layer_name(layer):<26} -> {str(tuple(x.shape[1:])):<12} {count:>7,} params")
    return lines


def layer_name(layer) -> str:
    """Short names for the summary (the repr spells out every default)."""
    kind = type(layer).__name__
    if isinstance(layer, nn.Conv2d):
        k, pad = layer.kernel_size, layer.padding
        return f"{kind}({layer.in_channels}->{layer.out_channels}, {k[0]}x{k[1]}, pad {pad[0]})"
    if isinstance(layer, nn.Linear):
        return f"{kind}({layer.in_features}->{layer.out_features})"
    if isinstance(layer, nn.MaxPool2d):
        return f"{kind}({layer.kernel_size})"
    return kind


# ------------------------------------------------------------------ the demo
def run(o: Options, say=print) -> Result:
    os.makedirs(o.out, exist_ok=True)          # a bad --out fails now, not after training
    x_train, y_train, x_test, y_test = load_images(o.seed)
    if o.batch_size > len(x_train):
        raise tc.ArgumentError(f"--batch-size {o.batch_size} is larger than the training set ({len(x_train)})")
    say(f"data: {len(x_train) + len(x_test)} images of 1x8x8 pixels (UCI optical digits), "
        f"{len(x_train)} to train on, {len(x_test)} held out")
    model = build_model(o.seed)
    n_params = sum(p.numel() for p in model.parameters())
    say(f"model: a CNN, {n_params:,} parameters; AdamW lr {o.lr} (cosine to 0), weight decay "
        f"{WEIGHT_DECAY}, batch {o.batch_size}")
    for line in summary(model):
        say(line)
    opt = make_optimizer(o)
    train_step = make_train_step(opt)
    step = tc.trace(train_step, donate_argnums=(0, 1))
    rng = np.random.default_rng(o.seed + 1)
    steps_per_epoch = len(x_train) // o.batch_size
    total = o.epochs * steps_per_epoch

    model, state, loss, compile_seconds, diff = compile_and_check(
        step, train_step, model, opt.init(model), *next(batches(x_train, y_train, o.batch_size, rng)),
        cosine_lr(o.lr, 0, total), say)
    losses = [loss]
    model, state, losses, train_seconds = train(o, step, model, state, x_train, y_train, rng, losses, total)
    rate = (len(losses) - 1) / train_seconds
    say(f"trained {len(losses)} steps in {train_seconds:.2f} s: {rate:.0f} steps/s, "
        f"{rate * o.batch_size:,.0f} images/s; mean loss of the last epoch "
        f"{np.mean(losses[-steps_per_epoch:]):.4f}")
    eager_rate = eager_speed(train_step, model, state, x_train, y_train, o)
    say(f"eager step (tc.Tensors, autograd): {eager_rate:.0f} steps/s; compiled is {rate / eager_rate:.0f}x this")
    model.eval()
    right = np.asarray(tc.trace(predict)(model, x_test)) == y_test
    accuracy = float(np.mean(right))
    say(f"test accuracy: {100 * accuracy:.1f}% ({int(np.sum(right))}/{len(y_test)} held-out images)")
    files = [write_loss_chart(o, losses, steps_per_epoch, accuracy)]
    say(f"wrote {', '.join(files)}")
    return Result(compile_seconds, diff, len(losses), train_seconds, rate, eager_rate, accuracy, losses, files)


def compile_and_check(step, train_step, model, state, xb, yb, lr, say):
    """The first compiled call, timed; then the step compiled and run eagerly, compared.

    The comparison runs in float64: Adam divides each gradient by its own magnitude, so
    where a gradient is near eps (1e-8) float32 rounding moves the update by a good part
    of the lr, and a float32 comparison would measure that, not the compiler."""
    model64, state64 = as_float64(model), as_float64(state)      # before the call may overwrite them
    before = tc.compile_cache.stats.copy()
    t0 = time.perf_counter()
    model, state, loss = step(model, state, xb, yb, lr)
    seconds = time.perf_counter() - t0
    cached = " (machine code from the compile cache)" if tc.compile_cache.stats.only_hits_since(before) else ""
    say(f"compiled train step (forward, backward, AdamW): first call {seconds:.2f} s{cached}")
    x64 = xb.astype(np.float64)
    eager = train_step(as_float64(model64), as_float64(state64), x64, yb, lr)
    compiled = tc.trace(train_step)(model64, state64, x64, yb, lr)
    diff = max_difference(compiled, eager)
    say(f"check: the step compiled vs run eagerly (float64), max |difference| over the new "
        f"parameters, optimizer state and loss {diff:.1e}")
    return model, state, float(loss), seconds, diff


def train(o: Options, step, model, state, x_train, y_train, rng, losses, total):
    """The remaining steps of `o.epochs` epochs (the first was the compile call)."""
    bar = ProgressBar(total, label="training ")
    t0 = time.perf_counter()
    for epoch in range(o.epochs):
        for xb, yb in batches(x_train, y_train, o.batch_size, rng):
            if len(losses) == total:
                break
            model, state, loss = step(model, state, xb, yb, cosine_lr(o.lr, len(losses), total))
            losses.append(float(loss))
            bar.update(len(losses), f"epoch {epoch + 1}/{o.epochs} loss {losses[-1]:.3f}")
    return model, state, losses, time.perf_counter() - t0


def eager_speed(train_step, model, state, x_train, y_train, o: Options) -> float:
    """Steps per second of the same step run eagerly, on copies, for EAGER_SECONDS."""
    model, state = copy_tree(model), copy_tree(state)
    xb, yb = x_train[:o.batch_size], y_train[:o.batch_size]
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < EAGER_SECONDS:
        model, state, _ = train_step(model, state, xb, yb, np.float64(o.lr))
        n += 1
    return n / (time.perf_counter() - t0)


def write_loss_chart(o: Options, losses, steps_per_epoch, accuracy) -> str:
    steps = list(range(1, len(losses) + 1))
    epochs = len(losses) // steps_per_epoch
    epoch_x = [steps_per_epoch * (e + 1) for e in range(epochs)]
    epoch_y = [float(np.mean(losses[e * steps_per_epoch:(e + 1) * steps_per_epoch])) for e in range(epochs)]
    svg = line_chart_svg(
        [Series("loss per step", steps, losses, "#1f77b4", 1.0, 0.45),
         Series("mean loss per epoch", epoch_x, epoch_y, "#d62728", 2.0)],
        title=f"tracecomp demo cnn: 8x8 digits (test accuracy {100 * accuracy:.1f}%)",
        xlabel="training step", ylabel="cross-entropy loss")
    return write_svg(o.out, "loss.svg", svg)


def main(args: argparse.Namespace) -> int:
    o = options_from(args)
    print("tracecomp demo cnn: a convolutional network (tc.nn) for handwritten digits, "
          "trained with one compiled step")
    t0 = time.perf_counter()
    run(o, say=lambda line: print(line, flush=True))
    print(f"total time {time.perf_counter() - t0:.1f} s")
    return 0
