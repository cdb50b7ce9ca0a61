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

# Autodiff: eager (PyTorch) and functional (JAX); both work under tc.trace.
w = tc.tensor(rng.standard_normal((4, 3)).astype(np.float32), requires_grad=True)
xb = tc.tensor(rng.standard_normal((2, 4)).astype(np.float32))


def loss(w, x):
    return (tc.tanh(x @ w) ** 2).mean()


loss(w, xb).backward()
print(w.grad.shape, type(loss(w, xb).grad_fn).__name__)      # (4, 3) MeanBackward0
step = tc.trace(tc.value_and_grad(loss))                      # forward + backward, compiled
value, grad = step(w.detach(), xb)
print(np.allclose(np.asarray(grad), w.grad.numpy(), atol=1e-6))   # True
print(step.lower(w.detach(), xb).as_text("backward"))         # the backward ops alone

# Per-example gradients: tc.vmap maps over the rows of xb, the parameters stay whole.
per_example = tc.trace(tc.vmap(tc.grad(lambda w, x: loss(w, x[None])), in_axes=(None, 0)))
grads = per_example(w.detach(), xb)
print(grads.shape)                                            # (2, 4, 3): one gradient per row
print(np.allclose(np.asarray(grads).mean(0), w.grad.numpy(), atol=1e-6))   # True: their mean

# Loops and branches: traced once into one op, whatever the trip count; a native loop compiled.
W = tc.tensor(rng.standard_normal((3, 3)).astype(np.float32) * 0.5)


def rnn(h, xs):
    h, hs = tc.scan(lambda h, x: (tc.tanh(h @ W + x), h.sum()), h, xs)   # hs: one sum per step
    return tc.cond(h.sum() > 0, lambda h: h, lambda h: -h, h), hs


h, hs = tc.trace(rnn)(np.zeros(3, np.float32), rng.standard_normal((1000, 3)).astype(np.float32))
print(hs.shape)                                               # (1000,)
print(tc.while_loop(lambda n: n < 10, lambda n: n * 2, tc.tensor(1)))   # tensor(16)
lstm = tc.nn.LSTM(3, 8, batch_first=True)                     # PyTorch's API, one tc.scan inside
out, (h_n, c_n) = tc.trace(lambda m, x: m(x))(lstm, rng.standard_normal((2, 50, 3)).astype(np.float32))
print(out.shape, h_n.shape)                                   # (2, 50, 8) (1, 2, 8)
