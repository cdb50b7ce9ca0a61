"""tc.optim: PyTorch's optimizers and lr schedulers, usable eagerly and inside one
compiled train step.

Two interfaces drive the same update rule (each optimizer's `_rule`, one parameter at a
time, written with tensor ops), so they give the same numbers:

- Eager, as torch.optim: `opt = tc.optim.Adam(model_params, lr=1e-3)`, then
  `opt.zero_grad(); loss.backward(); opt.step()` updates the tensors in place;
  `opt.param_groups`, `opt.state_dict()` / `load_state_dict()` in PyTorch's layout.
- Functional, as optax, for `tc.trace`:

      opt = tc.optim.Adam(lr=1e-3)                  # params are optional here
      state = opt.init(params)                      # any pytree of tensors/arrays
      @functools.partial(tc.trace, donate_argnums=(0, 1))
      def train_step(params, state, x, y, lr):
          loss, grads = tc.value_and_grad(loss_fn)(params, x, y)
          params, state = opt.update(grads, state, params, lr=lr)
          return params, state, loss
      params, state, loss = train_step(params, state, x, y, np.float64(sched.get_last_lr()[0]))

Why pure functions and not a traced `step()` mutating tensors: a compiled step must take
everything that changes between calls as inputs and return it as outputs.  The state is
a plain dict of tensors, {"step", "lr", one pytree per buffer (exp_avg, ...)}, so it is
an argument like the params: it can be donated, pickled or checkpointed, and the graph
holds no hidden Python state.  Values that change every step are data, not constants
baked into the graph: the step count (Adam's bias corrections) is a 0-d float32 tensor
in the state, and the lr is a 0-d float64 tensor in the state or the `lr` argument (a
NumPy scalar: data under tc.trace), so 1000 steps with a scheduler compile once.  The
other hyper-parameters (betas, momentum, eps, weight_decay) are the constructor's values
and constants of the compiled step; the functional path uses `opt.defaults`, not the
param groups.  Scalar arithmetic (bias corrections, lr / (1 - beta1**t)) runs in float64
and is cast to the parameter's dtype, as PyTorch computes it in Python floats.
"""
from . import lr_scheduler
from .adagrad import Adagrad
from .adam import Adam, AdamW
from .optimizer import Optimizer
from .rmsprop import RMSprop
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "lr_scheduler"]
