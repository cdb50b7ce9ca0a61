"""A short tour of tracecomp's API; the README quotes it and the tests run it."""
import numpy as np

import tracecomp as tc

# Eager tensors with PyTorch's names and semantics.
x = tc.tensor(np.ones((4, 8), np.float32), requires_grad=True)
y = (x * 2 + 1).tanh().sum(dim=1, keepdim=True)
print(y.shape, y.dtype)                       # (4, 1) tracecomp.float32
print(tc.arange(6).reshape(2, 3).T)           # int64, like torch.arange

# Python scalars are weak: they do not widen a tensor's dtype.
print((tc.ones(3, dtype=tc.int32) + 2.5).dtype)   # tracecomp.float32


# Trace a function into an SSA graph (compiled per input signature).
def mlp(x, w1, b1, w2):
    h = tc.relu(x @ w1 + b1)
    return tc.softmax(h @ w2, dim=1)


f = tc.trace(mlp)
rng = np.random.default_rng(0)
args = [rng.standard_normal(s).astype(np.float32) for s in [(2, 4), (4, 8), (8,), (8, 3)]]
out = f(*args)
print(np.asarray(out).sum(axis=1))            # each row sums to 1

lowered = f.lower(*args)
print(lowered.as_text("graph"))               # as traced, MLIR generic syntax in a `tc` dialect
print(lowered.as_text("optimized"))           # composites decomposed, graph simplified
