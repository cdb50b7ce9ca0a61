#!/usr/bin/env python
"""W6's and W15's call overhead in-process, as CPU time (robust on a shared machine):

    taskset -c 1 python benchmarks/call_overhead.py

a compiled `x + 1` on 8 float32 called with a NumPy array and with a Tensor (W6), and a traced
function taking a tc.nn model of 1 and of 30 tensors of 8 float32 (W15); best of 7 rounds of
timeit with time.process_time.  bench.py's W6/W15 rows time the same calls in wall time."""
import time
import timeit

import numpy as np

import tracecomp as tc


class Model(tc.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        for i in range(n):
            setattr(self, f"p{i}", tc.nn.Parameter(tc.tensor(np.ones(8, np.float32))))


def add_all(model, x):
    out = x
    for p in model.parameters():
        out = out + p
    return out


def per_call_us(call, number: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=7, timer=time.process_time)) / number * 1e6


def main() -> None:
    f, g = tc.trace(lambda x: x + 1), tc.trace(add_all)
    x = np.ones(8, np.float32)
    t = tc.tensor(x.copy())
    m1, m30 = Model(1), Model(30)
    for _ in range(3):
        f(x), f(t), g(m1, t), g(m30, t)
    w6_array, w6_tensor = per_call_us(lambda: f(x), 100_000), per_call_us(lambda: f(t), 100_000)
    w15_1, w15_30 = per_call_us(lambda: g(m1, t), 50_000), per_call_us(lambda: g(m30, t), 50_000)
    print(f"W6 ndarray {w6_array:.2f} us  tensor {w6_tensor:.2f} us  "
          f"W15-1 {w15_1:.2f} us  W15-30 {w15_30:.2f} us  (+{w15_30 - w15_1:.2f})")


if __name__ == "__main__":
    main()
