"""Greedy decoding with a growing sequence under tc.trace: how many compiles, how long.

The GPT demo's model (tracecomp/demo/gpt.py: 2 layers, dim 64, 4 heads, vocab 64) decodes
`--tokens` tokens greedily from a one-token prompt; every step calls the traced forward on
the whole sequence so far (lengths 1, 2, ..., tokens), as a new user writes it.  Printed:
the compiles (the traced function's signatures), the total time (compiles included) and
the time per token once compiled (the same lengths again).  `--dynamic false` is tc.trace before dynamic dims (one
compile per length); the default (None) is torch.compile's rule (the second length
compiles a program every later length reuses).

    TRACECOMP_CACHE=0 python benchmarks/decode_growing.py                 # dynamic (default)
    TRACECOMP_CACHE=0 python benchmarks/decode_growing.py --dynamic false # one compile per length

TRACECOMP_CACHE=0 keeps the on-disk compile cache out of it: every compile is a real one.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def decode(model, tokens: int, dynamic):
    import tracecomp as tc
    forward = tc.trace(lambda ids: model(ids), dynamic=dynamic, max_retraces=10 ** 6)
    ids = np.zeros((1, 1), np.int64)
    step_times = []
    start = time.perf_counter()
    for _ in range(tokens):
        t0 = time.perf_counter()
        logits = forward(ids).numpy()
        step_times.append(time.perf_counter() - t0)
        ids = np.concatenate([ids, [[int(np.argmax(logits[0, -1]))]]], axis=1)
    total = time.perf_counter() - start
    warm = []                   # the same lengths again, every one compiled: the per-token cost
    for t in range(1, tokens + 1):
        t0 = time.perf_counter()
        forward(ids[:, :t]).numpy()
        warm.append(time.perf_counter() - t0)
    return ids, total, len(forward.signatures), warm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--dynamic", choices=("none", "true", "false"), default="none")
    args = p.parse_args()
    import tracecomp as tc
    from tracecomp.demo.gpt import GPT
    tc.manual_seed(0)
    model = GPT(64, 64, 64, 4, 2)
    model.eval()
    dynamic = {"none": None, "true": True, "false": False}[args.dynamic]
    ids, total, compiles, warm = decode(model, args.tokens, dynamic)
    print(f"dynamic={args.dynamic}: {args.tokens} tokens, {compiles} compiles, total {total:.2f} s "
          f"(compiles included); once compiled, {np.mean(warm) * 1e3:.3f} ms per token (mean over the "
          f"lengths), {np.median(warm[-8:]) * 1e3:.3f} ms at the last 8 lengths")
    print("tokens:", ids[0].tolist())


if __name__ == "__main__":
    main()
