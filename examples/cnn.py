"""A small CNN on the 8x8 digits, trained with one compiled step (`tracecomp demo cnn`, short).

The step (forward, backward, AdamW) is traced once: the model and optimizer state are
pytrees of tensors, passed in, returned new and donated; the lr is data."""
import math

import numpy as np

import tracecomp as tc
from tracecomp import nn
from tracecomp.demo.model import load_digits, split

x, y = load_digits()
x_train, y_train, x_test, y_test = split(x.reshape(-1, 1, 8, 8), y, 0.2, seed=0)   # 1438 / 359
tc.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                      nn.MaxPool2d(2), nn.Flatten(), nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 10))
opt = tc.optim.AdamW(lr=3e-3, weight_decay=0.01)
state = opt.init(model)


def train_step(model, state, x, y, lr):
    loss, grads = tc.value_and_grad(lambda m: tc.cross_entropy(m(x), y))(model)
    model, state = opt.update(grads, state, model, lr=lr)
    return model, state, loss


step = tc.trace(train_step, donate_argnums=(0, 1))
rng, batch, epochs = np.random.default_rng(1), 32, 15
total, done = epochs * (len(x_train) // batch), 0
for epoch in range(epochs):
    order = rng.permutation(len(x_train))
    for start in range(0, len(x_train) - batch + 1, batch):
        take = order[start:start + batch]
        lr = np.float64(1.5e-3 * (1 + math.cos(math.pi * done / total)))     # cosine from 3e-3 to 0
        model, state, loss = step(model, state, x_train[take], y_train[take], lr)
        done += 1
    print(f"epoch {epoch + 1:2d}: loss {float(loss):.4f}")
model.eval()
predicted = np.asarray(tc.trace(lambda m, x: m(x).argmax(dim=1))(model, x_test))
print(f"test accuracy: {100 * np.mean(predicted == y_test):.1f}%")
