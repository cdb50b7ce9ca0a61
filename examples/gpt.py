"""A character-level GPT on Hamlet (`tracecomp demo gpt`, short): 30 s of training, a sample."""
import math
import time

import numpy as np

import tracecomp as tc
from tracecomp import nn
from tracecomp.demo.gpt import load_text

text = load_text()
chars = sorted(set(text))
ids = np.array([chars.index(c) for c in text])
V, T, D, B, SECONDS = len(chars), 64, 64, 32, 30.0


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.token, self.position = nn.Embedding(V, D), nn.Embedding(T, D)
        self.blocks = nn.ModuleList([nn.TransformerEncoderLayer(D, 4, 4 * D, dropout=0.0, activation="gelu",
                                                                batch_first=True, norm_first=True) for _ in range(3)])
        self.norm, self.head = nn.LayerNorm(D), nn.Linear(D, V)

    def forward(self, x):
        x = self.token(x) + self.position(tc.arange(x.shape[1]))
        for block in self.blocks:
            x = block(x, is_causal=True)
        return self.head(self.norm(x))


def loss_fn(model, x, y):
    return tc.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))


def train_step(model, state, x, y, lr):
    loss, grads = tc.value_and_grad(loss_fn)(model, x, y)
    model, state = opt.update(grads, state, model, lr=lr)
    return model, state, loss


tc.manual_seed(0)
model, opt, rng = GPT(), tc.optim.AdamW(lr=3e-3, weight_decay=0.1), np.random.default_rng(0)
state, step = opt.init(model), tc.trace(train_step, donate_argnums=(0, 1))
t0 = time.perf_counter()
while (progress := (time.perf_counter() - t0) / SECONDS) < 1:       # cosine lr over the time budget
    take = rng.integers(0, len(ids) - T, B)[:, None] + np.arange(T)
    lr = np.float64(1.5e-3 * (1 + math.cos(math.pi * progress)))
    model, state, loss = step(model, state, ids[take], ids[take + 1], lr)
print(f"training loss {float(loss):.3f} (predicting by character frequency: about 3.3)")
forward, out = tc.trace(lambda m, x: m(x)), [chars.index(c) for c in "HAMLET:\n"]
for _ in range(200):                          # a full window each time (one compiled shape); the causal
    window = np.zeros((1, T), np.int64)       # mask keeps the padding after the text from mattering
    window[0, :len(out[-T:])] = out[-T:]
    logits = np.asarray(forward(model, window), np.float64)[0, len(out[-T:]) - 1] / 0.8   # temperature 0.8
    p = np.exp(logits - logits.max())
    out.append(int(rng.choice(V, p=p / p.sum())))
print("".join(chars[i] for i in out))
