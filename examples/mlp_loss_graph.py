"""Write the forward+backward graph of an MLP loss (graph.mlir, backward.mlir, optimized.mlir)
to the current folder; `mlir-opt --allow-unregistered-dialect graph.mlir` accepts each."""
import numpy as np
import tracecomp as tc


def loss(w1, b1, w2, b2, x, target):
    h = tc.relu(x @ w1 + b1)
    return tc.cross_entropy(h @ w2 + b2, target)


rng = np.random.default_rng(0)
args = (rng.standard_normal((6, 5), dtype=np.float32), np.zeros(5, np.float32),
        rng.standard_normal((5, 3), dtype=np.float32), np.zeros(3, np.float32),
        rng.standard_normal((4, 6), dtype=np.float32), np.array([0, 2, 1, 0]))
step = tc.trace(tc.value_and_grad(loss, argnums=(0, 1, 2, 3)))
lowered = step.lower(*args)
open("graph.mlir", "w").write(lowered.as_text("graph"))
open("backward.mlir", "w").write(lowered.as_text("backward"))
open("optimized.mlir", "w").write(lowered.as_text("optimized"))
value, grads = step(*args)
print("loss", float(value), "grad shapes", [tuple(g.shape) for g in grads])
