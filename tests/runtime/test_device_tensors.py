"""Tensors in GPU memory (runtime/cuda/memory.py, runtime/devices.py, transforms/eager_cuda.py):
moved with .to/.cuda/.cpu, computed on eagerly and by tc.trace(device="cuda") without host
copies, pooled, donated, shared with PyTorch through DLPack.  On a machine with a GPU they
run on it; elsewhere on the host emulator (TRACECOMP_CUDA_EMULATOR=1), so small sizes."""
import gc

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.runtime.cuda import dlpack, driver, memory

HAVE_GPU = driver.available()


@pytest.fixture(autouse=True)
def device(monkeypatch):
    if not HAVE_GPU:
        monkeypatch.setenv(memory.EMULATOR_ENV, "1")
    return memory.context()


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_moving_between_devices_keeps_values_and_says_where():
    a = rand(2, 3)
    x = tc.tensor(a, device="cuda")
    assert x.device == "cuda" and x.device == tc.device("cuda:0") and str(x.device) == "cuda:0"
    assert x.is_cuda and not tc.tensor(a).is_cuda and tc.tensor(a).device == "cpu"
    assert x.cuda() is x and x.to("cuda") is x                  # already there: itself, as PyTorch
    np.testing.assert_array_equal(x.cpu().numpy(), a)
    np.testing.assert_array_equal(tc.tensor(a).to("cuda:0").cpu().numpy(), a)
    y = tc.tensor(a).to("cuda", tc.float64)
    assert y.dtype == tc.float64 and y.device == "cuda"
    assert "device='cuda:0'" in repr(x) and x[1, 2].item() == pytest.approx(a[1, 2])
    assert tc.zeros(2, device="cuda").device == "cuda" and tc.tensor(x).device == "cuda"
    with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu()"):
        x.numpy()
    with pytest.raises(TypeError, match="Tensor.cpu()"):
        np.asarray(x)
    with pytest.raises(tc.ArgumentError, match="unknown device 'tpu'"):
        tc.tensor(a).to("tpu")


def test_eager_ops_on_the_device_match_the_cpu():
    a, b = rand(4, 5), rand(5, 3, seed=1)
    x, w = tc.tensor(a, device="cuda"), tc.tensor(b, device="cuda")
    cases = [lambda x, w: (x @ w).relu() + 1, lambda x, w: tc.softmax(x, dim=-1),
             lambda x, w: x.tril(), lambda x, w: x.sum(dim=0, keepdim=True) * 2.0,
             lambda x, w: tc.where(x > 0, x, tc.zeros_like(x)), lambda x, w: x.T.reshape(-1)[3:9]]
    for f in cases:
        got = f(x, w)
        assert got.device == "cuda"
        np.testing.assert_allclose(got.cpu().numpy(), f(tc.tensor(a), tc.tensor(b)).numpy(), rtol=1e-5, atol=1e-6)
    # a 0-d CPU tensor meets a GPU tensor (PyTorch allows it); a larger one is refused
    np.testing.assert_allclose((x * tc.tensor(3.0)).cpu().numpy(), a * 3, rtol=1e-6)
    with pytest.raises(tc.ArgumentError, match=r"add: expected all tensors to be on the same device, but "
                                               r"argument 'other' is a float32\[4, 5\] tensor on the cpu"):
        x + tc.tensor(a)


def test_gradients_flow_through_moves_and_device_ops():
    a = rand(3, 4)
    w = tc.tensor(a, requires_grad=True)            # a CPU leaf, used on the GPU
    loss = (w.cuda() * w.cuda()).sum()
    assert loss.device == "cuda" and type(w.cuda().grad_fn).__name__ == "ToCopyBackward0"
    loss.backward()
    assert w.grad.device == "cpu"
    np.testing.assert_allclose(w.grad.numpy(), 2 * a, rtol=1e-6)
    v = tc.tensor(a, device="cuda").requires_grad_()       # a GPU leaf: its grad stays there
    (v.exp() * 3).mean().backward()
    assert v.grad.device == "cuda"
    np.testing.assert_allclose(v.grad.cpu().numpy(), 3 * np.exp(a) / a.size, rtol=1e-5)


class _Counting:
    """Counts the host<->device copies, allocations and waits of a context."""

    def __init__(self, ctx, monkeypatch):
        self.calls = {"to_device": 0, "to_host": 0, "alloc": 0, "synchronize": 0}
        for name in self.calls:
            original = getattr(ctx, name)

            def counted(*args, _name=name, _original=original, **kwargs):
                self.calls[_name] += 1
                return _original(*args, **kwargs)
            monkeypatch.setattr(ctx, name, counted)


def test_a_traced_function_keeps_device_tensors_on_the_device(device, monkeypatch):
    f = tc.trace(lambda x, w: ((x @ w).tanh() * 2, x.sum()), device="cuda")
    a, b = rand(8, 16), rand(16, 4, seed=1)
    x, w = tc.tensor(a, device="cuda"), tc.tensor(b, device="cuda")
    y, s = f(x, w)                                    # compiles; the pool warms up
    del y, s
    gc.collect()
    count = _Counting(device, monkeypatch)
    for _ in range(3):
        y, s = f(x, w)
        del y, s
        gc.collect()
    # no input or output crossed to the host, no block was allocated (the pool served
    # them), and nothing waited for the device
    assert count.calls == {"to_device": 0, "to_host": 0, "alloc": 0, "synchronize": 0}
    y, s = f(x, w)
    assert y.device == "cuda" and s.device == "cuda"
    np.testing.assert_allclose(y.cpu().numpy(), np.tanh(a @ b) * 2, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(s.item(), a.sum(), rtol=1e-4)
    # host arrays are still taken (copied in once per call); the results stay on the device
    z, _ = f(a, b)
    assert z.device == "cuda"
    np.testing.assert_allclose(z.cpu().numpy(), np.tanh(a @ b) * 2, rtol=1e-4, atol=1e-5)


def test_device_mismatches_name_the_tensor():
    x = tc.tensor(rand(3), device="cuda")
    with pytest.raises(tc.ArgumentError, match=r"runs on the cpu, but it was given a float32\[3\] tensor on cuda:0"):
        tc.trace(lambda t: t * 2)(x)
    held = tc.tensor(rand(3), device="cuda")
    with pytest.raises(tc.ArgumentError, match="a closed-over tensor is in GPU memory"):
        tc.trace(lambda t: t * held)(rand(3))


def test_donated_device_tensors_hold_the_outputs():
    step = tc.trace(lambda w, g: w - 0.1 * g, device="cuda", donate_argnums=0)
    a, g = rand(64), rand(64, seed=1)
    w = tc.tensor(a, device="cuda")
    ptr = w._data.ptr
    w2 = step(w, tc.tensor(g, device="cuda"))
    assert w2._data.ptr == ptr                     # written into the donated memory
    np.testing.assert_allclose(w2.cpu().numpy(), a - 0.1 * g, rtol=1e-6)
    # not donated: a fresh block
    plain = tc.trace(lambda w, g: w - 0.1 * g, device="cuda")
    w3 = plain(w2, tc.tensor(g, device="cuda"))
    assert w3._data.ptr != w2._data.ptr


def test_the_pool_reuses_freed_blocks():
    pool = memory.pool()
    x = tc.tensor(rand(1000), device="cuda")
    ptr = x._data.ptr
    del x
    gc.collect()
    y = tc.tensor(rand(1000, seed=1), device="cuda")
    assert y._data.ptr == ptr and pool.held >= 4000
    assert tc.cuda.memory_allocated() == pool.held
    tc.cuda.synchronize()
    assert tc.cuda.is_available() and tc.cuda.device_count() == 1


def test_a_model_and_its_optimizer_train_on_the_device_as_on_the_cpu():
    def make():
        tc.manual_seed(3)
        return tc.nn.Sequential(tc.nn.Linear(6, 8), tc.nn.Tanh(), tc.nn.Linear(8, 3))
    opt = tc.optim.AdamW(lr=1e-2)

    def step(model, state, x, y):
        loss, grads = tc.value_and_grad(lambda m: tc.nn.functional.cross_entropy(m(x), y))(model)
        model, state = opt.update(grads, state, model)
        return model, state, loss

    x, y = rand(5, 6), np.array([0, 2, 1, 1, 0])
    cpu_model, gpu_model = make(), make().cuda()
    params = list(gpu_model.parameters())
    assert all(p.device == "cuda" for p in params)
    cpu_state, gpu_state = opt.init(cpu_model), opt.init(gpu_model)
    cpu_step, gpu_step = tc.trace(step), tc.trace(step, device="cuda", donate_argnums=(0, 1))
    for _ in range(3):
        cpu_model, cpu_state, cpu_loss = cpu_step(cpu_model, cpu_state, x, y)
        gpu_model, gpu_state, gpu_loss = gpu_step(gpu_model, gpu_state, x, y)
        assert gpu_loss.device == "cuda"
        np.testing.assert_allclose(gpu_loss.item(), cpu_loss.item(), rtol=1e-5)
    for p, q in zip(gpu_model.parameters(), cpu_model.parameters()):
        assert p.device == "cuda"
        np.testing.assert_allclose(p.cpu().numpy(), q.numpy(), rtol=1e-4, atol=1e-6)
    back = gpu_model.cpu()
    assert all(p.device == "cpu" for p in back.parameters())


def test_module_to_moves_in_place():
    model = tc.nn.Linear(3, 2)
    params = list(model.parameters())
    assert model.to("cuda") is model and list(model.parameters()) == params
    assert all(p.device == "cuda" and p.requires_grad for p in params)
    model.to(tc.float64)
    assert all(p.dtype == tc.float64 and p.device == "cuda" for p in params)
    model.to("cpu", tc.float32)
    assert all(p.dtype == tc.float32 and p.device == "cpu" for p in params)


class _Producer:
    """A DLPack producer of a device array of our own (what a torch CUDA tensor looks like)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return (2, 0)


def test_dlpack_shares_device_memory_both_ways():
    x = tc.tensor(rand(2, 3), device="cuda")
    assert x.__dlpack_device__() == (2, 0)
    imported = dlpack.from_capsule(x.__dlpack__())
    assert (imported.ptr, imported.shape, imported.device) == (x._data.ptr, (2, 3), (2, 0))
    imported.release()
    y = tc.from_dlpack(_Producer(x._data))           # zero copy: the same memory
    assert y.device == "cuda" and y._data.ptr == x._data.ptr
    np.testing.assert_array_equal(y.cpu().numpy(), x.cpu().numpy())


@pytest.mark.skipif(not HAVE_GPU, reason="no CUDA GPU and driver on this machine")
def test_torch_cuda_tensors_in_and_out_without_copies():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA")
    t = torch.randn(4, 5, device="cuda")
    x = tc.from_dlpack(t)
    assert x.device == "cuda" and x._data.ptr == t.data_ptr()
    y = tc.trace(lambda a: a * 2 + 1, device="cuda")(x)
    back = torch.from_dlpack(y)
    assert back.is_cuda and back.data_ptr() == y._data.ptr
    torch.testing.assert_close(back, t * 2 + 1)
    tt = torch.randn(5, 4, device="cuda").T          # a transposed view: made contiguous once
    np.testing.assert_allclose(tc.from_dlpack(tt).cpu().numpy(), tt.cpu().numpy())


def test_checkpoints_copy_and_eager_optimizers_work_on_the_device(tmp_path):
    model = tc.nn.Linear(3, 2).cuda()
    tc.save(model.state_dict(), str(tmp_path / "m.safetensors"))         # saved from GPU memory
    other = tc.nn.Linear(3, 2).cuda()
    other.load_state_dict(tc.load_state(str(tmp_path / "m.safetensors")))  # copy_ across devices
    assert other.weight.device == "cuda"
    np.testing.assert_array_equal(other.weight.cpu().numpy(), model.weight.cpu().numpy())
    before = model.weight.cpu().numpy()
    opt = tc.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(tc.ones(4, 3, device="cuda")).sum().backward()
    opt.step()
    assert model.weight.device == "cuda" and model.weight.grad.device == "cuda"
    np.testing.assert_allclose(model.weight.cpu().numpy(), before - 0.1 * 4, rtol=1e-6)
