"""`tracecomp demo`: train an MLP on the 8x8 handwritten digits with a compiled train step.

The step (forward, softmax cross-entropy, backward from derivatives.yaml, SGD update) is
`tc.trace(step)` where `step` calls `tc.value_and_grad(loss, argnums=(0, 1, 2, 3))`
(model.py).  The demo prints the first call's time (trace, autodiff, optimize,
compile), checks the compiled step against a hand-written NumPy step, trains with a
progress bar on stderr, compares steps per second with tracecomp's eager mode and NumPy
(interleaved rounds, median), reports the held-out test accuracy, and writes a loss
curve (loss.svg) and the compiled step's graph (train_step.dot, and .svg with Graphviz)
into the output folder.
"""
from __future__ import annotations

import argparse
import functools
import linecache
import os
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

import tracecomp as tc
from . import pictures
from ..core import timings
from .plots import Series, line_chart_svg
from .progress import ProgressBar

MODEL_FILE = "<tracecomp demo>/model.py"   # the file name graph locations show
TEST_FRACTION = 0.2
SPEED_ROUNDS = 5           # interleaved timing rounds per implementation (median reported)
SPEED_ROUND_SECONDS = 0.15


@dataclass
class Options:
    epochs: int = 30
    hidden: int = 64
    batch_size: int = 32
    lr: float = 0.1
    out: str = "tracecomp_demo"
    seed: int = 0


@dataclass
class Result:
    compile_seconds: float
    train_seconds: float
    steps: int
    max_diff_vs_numpy: float
    steps_per_second: dict[str, float]
    accuracy: float
    losses: list[float] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


@functools.cache
def model():
    """model.py loaded as a module whose code is named MODEL_FILE.  The tracer records
    the innermost source line outside tracecomp's own files; loaded this way, the model's
    lines count as the user's code, so the graph picture points into model.py."""
    from importlib import resources
    import types
    source = resources.files("tracecomp").joinpath("demo", "model.py").read_text()
    linecache.cache[MODEL_FILE] = (len(source), None, source.splitlines(True), MODEL_FILE)
    module = types.ModuleType("tracecomp_demo_model")
    module.__file__ = MODEL_FILE
    exec(compile(source, MODEL_FILE, "exec"), module.__dict__)
    return module


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = Options()
    p.add_argument("--epochs", type=int, default=d.epochs, help=f"passes over the training set (default {d.epochs})")
    p.add_argument("--hidden", type=int, default=d.hidden, help=f"hidden layer width (default {d.hidden})")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=f"images per step (default {d.batch_size})")
    p.add_argument("--lr", type=float, default=d.lr, help=f"SGD learning rate (default {d.lr})")
    p.add_argument("--out", default=d.out, metavar="FOLDER",
                   help=f"where the pictures go (default ./{d.out})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"seed of the split, init and shuffles (default {d.seed})")


def options_from(args: argparse.Namespace) -> Options:
    o = Options(args.epochs, args.hidden, args.batch_size, args.lr, args.out, args.seed)
    for name in ("epochs", "hidden", "batch_size"):
        if getattr(o, name) < 1:
            raise tc.ArgumentError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(o, name)}")
    if not o.lr > 0:
        raise tc.ArgumentError(f"--lr must be positive, got {o.lr}")
    return o


def _batches(x: np.ndarray, y: np.ndarray, size: int, rng: np.random.Generator):
    """One epoch of shuffled full batches (the last partial batch is dropped: one shape,
    one compiled signature)."""
    order = rng.permutation(len(x))
    for start in range(0, len(x) - size + 1, size):
        take = order[start:start + size]
        yield x[take], y[take]


def run(o: Options, say=print) -> Result:
    M = model()
    os.makedirs(o.out, exist_ok=True)          # a bad --out fails now, not after training
    x, y = M.load_digits()
    x_train, y_train, x_test, y_test = M.split(x, y, TEST_FRACTION, o.seed)
    if o.batch_size > len(x_train):
        raise tc.ArgumentError(f"--batch-size {o.batch_size} is larger than the training set ({len(x_train)})")
    say(f"data: {len(x)} images of 8x8 pixels (UCI optical digits), {len(x_train)} to train on, "
        f"{len(x_test)} held out")
    say(f"model: 64-{o.hidden}-10 MLP, ReLU, softmax cross-entropy, SGD lr {o.lr}, batch {o.batch_size}")
    params = M.init_params(o.hidden, o.seed)
    rng = np.random.default_rng(o.seed + 1)
    step = tc.trace(M.make_step(o.lr))
    first_batch = next(_batches(x_train, y_train, o.batch_size, rng))
    lowered, compile_seconds, diff = compile_and_check(o, step, params, *first_batch, say)
    trained, losses, train_seconds = train(o, step, params, x_train, y_train, rng)
    steps_per_epoch = len(x_train) // o.batch_size
    say(f"trained {len(losses)} steps in {train_seconds:.2f} s; mean loss of the last epoch "
        f"{np.mean(losses[-steps_per_epoch:]):.4f}")
    rates = compare_speed(o, params, x_train, y_train)
    say(f"train step speed (batch {o.batch_size}, median of {SPEED_ROUNDS} interleaved rounds):")
    compiled = rates["tracecomp compiled"]
    for name, rate in rates.items():
        ratio = "" if name == "tracecomp compiled" else f"   compiled is {compiled / rate:.1f}x this"
        say(f"  {name:<20} {rate:10.0f} steps/s{ratio}")
    right = np.asarray(tc.trace(M.predict)(*trained, x_test)) == y_test
    accuracy = float(np.mean(right))
    say(f"test accuracy: {100 * accuracy:.1f}% ({int(np.sum(right))}/{len(y_test)} held-out images)")
    files = write_pictures(o, lowered, losses, steps_per_epoch, accuracy, say)
    return Result(compile_seconds, train_seconds, len(losses), diff, rates, accuracy, losses, files)


def compile_and_check(o: Options, step, params, xb, yb, say):
    """The first call (trace, autodiff, optimize, compile, run), timed, and its results
    compared with the NumPy step in float64."""
    before = tc.compile_cache.stats.copy()
    t0 = time.perf_counter()
    first = step(*params, xb, yb)
    seconds = time.perf_counter() - t0
    cached = "; machine code from the compile cache" if tc.compile_cache.stats.only_hits_since(before) else ""
    lowered = step.lower(*params, xb, yb)
    stages = timings.summary(lowered.timings)
    kernels, backward = len(lowered.program.kernels), pictures.optimized_backward_ops(lowered)
    say(f"compiled train step: first call {seconds:.2f} s, {len(lowered.optimized.ops)} ops "
        f"({len(backward)} backward) in {kernels} kernels")
    say(f"  compile stages: {stages}{cached}")
    reference = model().numpy_step(*[p.astype(np.float64) for p in params], xb.astype(np.float64), yb, o.lr)
    diff = max(float(np.max(np.abs(np.asarray(a, np.float64) - r))) for a, r in zip(first, reference))
    say(f"check: compiled step vs NumPy float64 step, max |difference| {diff:.1e}")
    return lowered, seconds, diff


def train(o: Options, step, params, x_train, y_train, rng):
    """SGD over `o.epochs` shuffled epochs: (trained params, loss per step, seconds)."""
    bar = ProgressBar(o.epochs * (len(x_train) // o.batch_size), label="training ")
    losses, current = [], list(params)
    t0 = time.perf_counter()
    for epoch in range(o.epochs):
        for xb, yb in _batches(x_train, y_train, o.batch_size, rng):
            loss, *current = step(*current, xb, yb)
            losses.append(float(loss))
            bar.update(len(losses), f"epoch {epoch + 1}/{o.epochs} loss {losses[-1]:.3f}")
    return current, losses, time.perf_counter() - t0


def compare_speed(o: Options, params, x_train, y_train) -> dict[str, float]:
    """Steps per second of the compiled step, the same step run eagerly on tc.Tensors
    with autograd, and the NumPy step; rounds alternate so machine noise hits all three."""
    M, rng = model(), np.random.default_rng(o.seed + 2)
    batches = list(_batches(x_train, y_train, o.batch_size, rng))
    compiled = tc.trace(M.make_step(o.lr))
    compiled(*params, *batches[0])                 # compile outside the timing
    eager_step = M.make_step(o.lr)
    eager_batches = [(tc.tensor(a), tc.tensor(b)) for a, b in batches]
    runners = {
        "tracecomp compiled": (lambda p, b: compiled(*p, *b)[1:], list(params), batches),
        "tracecomp eager": (lambda p, b: eager_step(*p, *b)[1:], [tc.tensor(a) for a in params], eager_batches),
        "NumPy by hand": (lambda p, b: M.numpy_step(*p, *b, o.lr)[1:], list(params), batches),
    }
    rates: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(SPEED_ROUNDS):
        for name, (fn, p, bs) in runners.items():
            n, t0 = 0, time.perf_counter()
            while True:
                p = fn(p, bs[n % len(bs)])
                n += 1
                elapsed = time.perf_counter() - t0
                if elapsed >= SPEED_ROUND_SECONDS:
                    break
            rates[name].append(n / elapsed)
    return {name: statistics.median(r) for name, r in rates.items()}


def write_pictures(o: Options, lowered, losses, steps_per_epoch, accuracy, say) -> list[str]:
    steps = list(range(1, len(losses) + 1))
    epoch_x = [steps_per_epoch * (e + 1) for e in range(len(losses) // steps_per_epoch)]
    epoch_y = [float(np.mean(losses[e * steps_per_epoch:(e + 1) * steps_per_epoch])) for e in range(len(epoch_x))]
    svg = line_chart_svg(
        [Series("loss per step", steps, losses, "#1f77b4", 1.0, 0.45),
         Series("mean loss per epoch", epoch_x, epoch_y, "#d62728", 2.0)],
        title=f"tracecomp demo: MLP 64-{o.hidden}-10 on 8x8 digits (test accuracy {100 * accuracy:.1f}%)",
        xlabel="training step", ylabel="cross-entropy loss")
    files = [_write(os.path.join(o.out, "loss.svg"), svg.encode())]
    dot = pictures.stage_dot(lowered, "optimized")
    files.append(_write(os.path.join(o.out, "train_step.dot"), dot.encode()))
    if pictures.have_graphviz():
        files.append(_write(os.path.join(o.out, "train_step.svg"), pictures.render(dot, "svg")))
        say(f"wrote {', '.join(files)}")
    else:
        say(f"wrote {', '.join(files)}; to draw train_step.dot install Graphviz "
            f"({pictures.INSTALL_GRAPHVIZ}) and run: dot -Tsvg {files[-1]} -o train_step.svg")
    return files


def _write(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return path


def main(args: argparse.Namespace) -> int:
    o = options_from(args)
    print("tracecomp demo: an MLP classifier for handwritten digits, trained with a compiled step")
    t0 = time.perf_counter()
    run(o, say=lambda line: print(line, flush=True))
    print(f"total time {time.perf_counter() - t0:.1f} s")
    return 0
