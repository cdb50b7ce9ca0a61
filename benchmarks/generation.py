"""W16 (issue 36): greedy generation with a growing sequence, compiles included.

A GPT-style language model (tracecomp/demo/gpt.py's GPT: token and position embeddings,
pre-norm nn.TransformerEncoderLayer blocks with a causal mask, a final LayerNorm and a
linear head) generates `--tokens` tokens greedily from an 8-token prompt.  Every step runs
the model on the whole sequence so far, as a new user writes it: lengths 8, 9, ...  Each
implementation runs in a process of its own, from nothing compiled (no on-disk caches):

- tracecomp: `tc.trace(model)` with its default dynamic dims (torch.compile's rule);
- torch: eager, under no_grad;
- torch.compile: `torch.compile(model)` with its default (dynamic after a second shape);
- jax.jit: the same forward in jax.numpy, compiled once for the longest sequence, each
  step padded to it (the causal mask keeps the padding from the positions read).

Reported per implementation: the compiles, the total time of the generation (compiles
included), and the time per token once compiled (every length run again, mean).  The
weights are the same everywhere (tracecomp's, copied), so the tokens must agree.

    python benchmarks/generation.py --config demo --impl tracecomp     # one child's run
    python benchmarks/bench.py --workloads W16                          # all, side by side
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np

CONFIGS = {     # vocab, context, dim, heads, layers
    "demo": (64, 256, 64, 4, 2),        # the GPT demo's model (tracecomp demo gpt)
    "lm": (1024, 256, 256, 8, 2),       # a wider two-layer language model
}
PROMPT = 8
# no on-disk compile caches: every compile is a real one, in every implementation
COLD_ENV = {"TRACECOMP_CACHE": "0", "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}


def weights(config: str) -> dict[str, np.ndarray]:
    """The model's weights (tracecomp's initialization, seed 0), by PyTorch's names."""
    import tracecomp as tc
    from tracecomp.demo.gpt import GPT
    tc.manual_seed(0)
    return {k: v.numpy() for k, v in GPT(*CONFIGS[config]).state_dict().items()}


def prompt(config: str) -> np.ndarray:
    return np.random.default_rng(1).integers(0, CONFIGS[config][0], (1, PROMPT)).astype(np.int64)


def tracecomp_forward(config: str, state: dict):
    import tracecomp as tc
    from tracecomp.demo.gpt import GPT
    model = GPT(*CONFIGS[config])
    model.load_state_dict({k: tc.tensor(v) for k, v in state.items()})
    model.eval()
    forward = tc.trace(lambda ids: model(ids), max_retraces=10 ** 6)
    return lambda ids: forward(ids).numpy(), lambda: len(forward.signatures)


def torch_model(config: str, state: dict):
    import torch
    vocab, context, dim, heads, layers = CONFIGS[config]

    class GPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.token = torch.nn.Embedding(vocab, dim)
            self.position = torch.nn.Embedding(context, dim)
            self.blocks = torch.nn.ModuleList([
                torch.nn.TransformerEncoderLayer(dim, heads, 4 * dim, 0.0, "gelu", batch_first=True,
                                                 norm_first=True) for _ in range(layers)])
            self.norm = torch.nn.LayerNorm(dim)
            self.head = torch.nn.Linear(dim, vocab)

        def forward(self, ids):
            n = ids.shape[1]
            x = self.token(ids) + self.position(torch.arange(n))
            mask = torch.nn.Transformer.generate_square_subsequent_mask(n)
            for block in self.blocks:
                x = block(x, src_mask=mask, is_causal=True)
            return self.head(self.norm(x))

    model = GPT()
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()})
    return model.eval()


def torch_forward(config: str, state: dict, compiled: bool):
    import torch
    model = torch_model(config, state)
    fn = torch.compile(model) if compiled else model

    def forward(ids):
        with torch.no_grad():
            return fn(torch.from_numpy(ids)).numpy()

    def compiles():
        from torch._dynamo.utils import counters
        return counters["stats"]["unique_graphs"] if compiled else 0
    return forward, compiles


def jax_forward(config: str, state: dict, length: int):
    """The forward in jax.numpy, jitted once for `length` positions; a shorter sequence is
    padded at the end and its logits are the first positions'."""
    import jax
    import jax.numpy as jnp
    vocab, context, dim, heads, layers = CONFIGS[config]
    p = {k: jnp.asarray(v) for k, v in state.items()}

    def norm(x, w, b):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-5) * w + b

    def block(x, i):
        q = f"blocks.{i}."
        h = norm(x, p[q + "norm1.weight"], p[q + "norm1.bias"])
        qkv = h @ p[q + "self_attn.in_proj_weight"].T + p[q + "self_attn.in_proj_bias"]
        n = x.shape[1]
        split = lambda t: t.reshape(1, n, heads, dim // heads).transpose(0, 2, 1, 3)    # noqa: E731
        qh, kh, vh = (split(t) for t in jnp.split(qkv, 3, axis=-1))
        scores = qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(dim // heads)
        scores = jnp.where(jnp.tril(jnp.ones((n, n), bool)), scores, -jnp.inf)
        att = (jax.nn.softmax(scores, axis=-1) @ vh).transpose(0, 2, 1, 3).reshape(1, n, dim)
        x = x + att @ p[q + "self_attn.out_proj.weight"].T + p[q + "self_attn.out_proj.bias"]
        h = norm(x, p[q + "norm2.weight"], p[q + "norm2.bias"])
        h = jax.nn.gelu(h @ p[q + "linear1.weight"].T + p[q + "linear1.bias"], approximate=False)
        return x + h @ p[q + "linear2.weight"].T + p[q + "linear2.bias"]

    @jax.jit
    def model(ids):
        x = p["token.weight"][ids] + p["position.weight"][jnp.arange(ids.shape[1])]
        for i in range(layers):
            x = block(x, i)
        return norm(x, p["norm.weight"], p["norm.bias"]) @ p["head.weight"].T + p["head.bias"]

    def forward(ids):
        padded = np.zeros((1, length), np.int64)
        padded[:, :ids.shape[1]] = ids
        return np.asarray(model(padded))[:, :ids.shape[1]]
    return forward, lambda: model._cache_size()


def generate(forward, ids: np.ndarray, tokens: int) -> tuple[np.ndarray, float, np.ndarray]:
    """(all ids, seconds, the last step's logits) of `tokens` greedy steps."""
    start = time.perf_counter()
    for _ in range(tokens):
        logits = forward(ids)
        ids = np.concatenate([ids, [[int(np.argmax(logits[0, -1]))]]], axis=1)
    return ids, time.perf_counter() - start, logits[0, -1]


def run(impl: str, config: str, tokens: int) -> dict:
    state = weights(config)
    ids = prompt(config)
    if impl == "tracecomp":
        forward, compiles = tracecomp_forward(config, state)
    elif impl in ("torch", "torch.compile"):
        forward, compiles = torch_forward(config, state, impl == "torch.compile")
    elif impl == "jax.jit":
        forward, compiles = jax_forward(config, state, PROMPT + tokens)
    else:
        raise SystemExit(f"unknown implementation {impl!r}")
    out, total, last = generate(forward, ids, tokens)
    warm = []               # every length again, all compiled: the cost per token
    for n in range(PROMPT, PROMPT + tokens):
        ids = np.ascontiguousarray(out[:, :n])        # (as generate passes them: a view's strides differ)
        t0 = time.perf_counter()
        forward(ids)
        warm.append(time.perf_counter() - t0)
    return {"impl": impl, "config": config, "tokens": tokens, "total_s": total, "compiles": compiles(),
            "per_token_s": float(np.mean(warm)), "per_token_last8_s": float(np.median(warm[-8:])),
            "ids": out[0].tolist(), "last_logits": last.astype(float).tolist()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", default="tracecomp")
    ap.add_argument("--config", choices=tuple(CONFIGS), default="demo")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--json", action="store_true", help="print one JSON line (bench.py reads it)")
    args = ap.parse_args()
    missing = {k: v for k, v in COLD_ENV.items() if os.environ.get(k) != v}
    if missing:             # the caches must be off before any of them is imported: re-exec
        os.execve(os.sys.executable, [os.sys.executable] + os.sys.argv, dict(os.environ, **missing))
    threads = int(os.environ.get("BENCH_THREADS") or 0)       # bench.py --threads N: N CPUs only
    if threads and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])
    result = run(args.impl, args.config, args.tokens)
    if args.json:
        print("W16RESULT " + json.dumps(result))
    else:
        print(f"{args.impl} {args.config}: {result['compiles']} compiles, {args.tokens} tokens in "
              f"{result['total_s']:.2f} s (compiles included); once compiled "
              f"{result['per_token_s'] * 1e3:.3f} ms per token")


if __name__ == "__main__":
    main()
