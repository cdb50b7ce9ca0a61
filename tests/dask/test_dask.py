"""tracecomp on a Dask cluster (issue 16): compiled functions over Dask arrays on a
LocalCluster of worker processes, and synchronous data-parallel training that matches one
process stepping on the whole batches, through a worker's death."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.runtime import compile_worker

da = pytest.importorskip("dask.array", reason="Dask is an optional extra: pip install 'tracecomp[dask]'")
distributed = pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")
tcd = pytest.importorskip("tracecomp.dask")

# The workers cannot import this test module: its functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def start_cluster(workers: int):
    cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                       dashboard_address=":0", silence_logs=logging.ERROR)
    return cluster, distributed.Client(cluster)


@pytest.fixture(scope="module")
def cluster_client():
    cluster, client = start_cluster(2)
    yield client
    client.close()
    cluster.close()


@pytest.fixture
def client(cluster_client):
    cluster_client.wait_for_workers(2, timeout=60)      # a worker killed by a test is back
    return cluster_client


def on_workers(client, fn):
    return list(client.run(fn).values())


def worker_compiles():
    from tracecomp.runtime import compile_worker
    return compile_worker.compiled_modules()


# ------------------------------------------------------------------ arrays
def features(rows=1000, cols=16, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)


def test_map_blocks_of_a_traced_function_works_as_written_on_every_worker(client):
    x = features(rows=4000)
    y = da.map_blocks(tc.trace(lambda b: tc.sin(b) * 2 + 1), da.from_array(x, chunks=(250, 16)))
    with distributed.get_task_stream(client) as stream:
        np.testing.assert_allclose(y.compute(), np.sin(x) * 2 + 1, rtol=1e-6, atol=1e-6)
    assert len({task["worker"] for task in stream.data}) == 2


def test_map_blocks_takes_chunks_and_dtype_from_the_shape_rules(client):
    x = features()
    before = compile_worker.compiled_modules()
    y = tcd.map_blocks(lambda b: (tc.exp(-b * b) > 0.5).to(tc.float64), da.from_array(x, chunks=(300, 5)))
    assert compile_worker.compiled_modules() == before          # traced here, compiled on the workers
    assert y.dtype == np.float64 and y.chunks == ((300, 300, 300, 100), (5, 5, 5, 1))
    expected = (np.exp(-x.astype(np.float64) ** 2) > 0.5).astype(np.float64)
    np.testing.assert_array_equal(y.compute(), expected)
    assert y.sum().compute() == expected.sum()                  # NumPy chunks: Dask's own ops work
    np.testing.assert_allclose(np.exp(y).mean(axis=0).compute(), np.exp(expected).mean(axis=0))


def test_map_blocks_with_a_constant_argument_and_a_shape_changing_block(client):
    x = features(rows=100, cols=8)
    w = np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32)
    y = tcd.map_blocks(lambda b, w: b[:, :4] @ w[:4, :4], da.from_array(x, chunks=(30, 8)), w)
    assert y.chunks == ((30, 30, 30, 10), (4,))
    np.testing.assert_allclose(y.compute(), x[:, :4] @ w[:4, :4], rtol=1e-5, atol=1e-5)


SHIFT = 1.0


def shifted(b):
    return b + SHIFT


@pytest.mark.parametrize("where", ["registered by value", "not importable"])
def test_a_global_changed_between_computes_reaches_every_worker(client, where):
    """Dask sends the function with every task, by value where its module cannot be imported
    (`__main__`) or is registered with cloudpickle (this one); a worker that kept the first
    copy to arrive computed with the old global (issue 33, item 5), and Dask's plain pickle
    named a registered module's function by reference (the worker's own import's global)."""
    scope = globals() if where == "registered by value" else {"__name__": "not_importable"}
    if where == "not importable":
        exec(compile("def shifted(b):\n    return b + SHIFT\n", "<client>", "exec"), scope)
    x = features(rows=1000)
    traced, blocks = tc.trace(scope["shifted"]), da.from_array(x, chunks=(250, 16))
    try:
        for shift in (1.0, 5.0, -2.0):
            scope["SHIFT"] = shift
            with distributed.get_task_stream(client) as stream:
                np.testing.assert_allclose(da.map_blocks(traced, blocks).compute(), x + shift, rtol=1e-6)
            assert len({task["worker"] for task in stream.data}) == 2
    finally:
        scope["SHIFT"] = 1.0


def test_map_blocks_errors_name_the_function_and_shapes(client):
    a = da.from_array(features(rows=100, cols=8), chunks=(30, 8))
    with pytest.raises(tc.ShapeError, match=r"map_blocks\(<lambda>\).*keep its rank"):
        tcd.map_blocks(lambda b: b.sum(dim=1), a)
    with pytest.raises(tc.ShapeError, match=r"array 1 has shape \[100, 4\]"):
        tcd.map_blocks(lambda b, c: b, a, da.ones((100, 4), chunks=10))
    with pytest.raises(tc.ArgumentError, match="returns tuple"):
        tcd.map_blocks(lambda b: (b, b), a)
    with pytest.raises(tc.ArgumentError, match="no Dask array"):
        tcd.map_blocks(lambda b: b, np.ones(3))


def mlp(x, w1, w2):
    return tc.softmax(tc.relu(x @ w1) @ w2, dim=-1)


def test_map_rows_is_batch_inference_over_chunks_of_rows(client):
    rng = np.random.default_rng(2)
    x, w1, w2 = features(rows=1000, cols=16), rng.standard_normal((16, 32)).astype(np.float32), \
        rng.standard_normal((32, 10)).astype(np.float32)
    dx = da.from_array(x, chunks=(128, 8))          # split features: brought into one chunk
    probs = tcd.map_rows(lambda b: mlp(b, tc.tensor(w1), tc.tensor(w2)), dx)
    assert probs.shape == (1000, 10) and probs.chunks[0] == dx.chunks[0]
    expected = np.asarray(tc.trace(mlp)(x, w1, w2))
    np.testing.assert_allclose(probs.compute(), expected, rtol=1e-5, atol=1e-6)
    # arrays of different ranks line up by rows; a function of one row is vectorized
    labels = da.from_array(np.arange(1000) % 10, chunks=250)
    picked = tcd.map_rows(lambda row, label: row[label], da.from_array(expected, chunks=200), labels,
                          per_row=True)
    np.testing.assert_allclose(picked.compute(), expected[np.arange(1000), np.arange(1000) % 10], rtol=1e-6)


def test_map_rows_refuses_a_function_that_does_not_keep_its_rows(client):
    with pytest.raises(tc.ShapeError, match=r"a chunk of 30 rows gives an output of shape \[16\]"):
        tcd.map_rows(lambda b: b.sum(dim=0), da.from_array(features(rows=90), chunks=30))


def test_reduce_rows_sums_and_means_in_a_tree_of_partial_sums(client):
    x = features(rows=1000, cols=6)
    y = np.arange(1000) % 3
    dx, dy = da.from_array(x, chunks=(110, 6)), da.from_array(y, chunks=100)

    def stats(rows, labels):
        return {"square": rows * rows, "ones": (labels == 1).to(tc.int64)}
    total = tcd.reduce_rows(stats, dx, dy, how="sum", split_every=2).compute()
    assert total["ones"].dtype == np.int64 and int(total["ones"]) == int((y == 1).sum())
    assert total["square"].dtype == np.float32
    np.testing.assert_allclose(total["square"], (x.astype(np.float64) ** 2).sum(axis=0), rtol=1e-6)
    mean = tcd.reduce_rows(stats, dx, dy, how="mean").compute()
    np.testing.assert_allclose(mean["square"], (x.astype(np.float64) ** 2).mean(axis=0), rtol=1e-6)
    assert mean["ones"].dtype == np.float64 and mean["ones"] == (y == 1).mean()
    with pytest.raises(tc.ArgumentError, match="how must be 'sum' or 'mean'"):
        tcd.reduce_rows(stats, dx, dy, how="max")


def test_from_npy_streams_a_file_the_workers_never_hold_whole(client, tmp_path):
    rows, cols = 3 << 16, 256                          # 192 MiB of float32
    path = tmp_path / "big.npy"
    mapped = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, cols))
    expected = np.zeros(cols)
    for start in range(0, rows, 1 << 14):
        block = np.random.default_rng(start).standard_normal((1 << 14, cols)).astype(np.float32)
        mapped[start:start + (1 << 14)] = block
        expected += np.tanh(block.astype(np.float64)).sum(axis=0)
    mapped.flush()
    del mapped

    def peak_kib():
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    before = on_workers(client, peak_kib)
    x = tcd.from_npy(path, rows=1 << 13)               # 8 MiB chunks
    assert x.shape == (rows, cols) and x.numblocks == (24, 1)
    mean = tcd.reduce_rows(tc.tanh, x, how="mean").compute()
    np.testing.assert_allclose(mean, expected / rows, rtol=1e-4, atol=1e-6)
    grown = max(after - b for after, b in zip(on_workers(client, peak_kib), before))
    assert grown * 1024 < os.path.getsize(path) / 2, f"a worker's peak memory grew by {grown} KiB"
    with pytest.raises(tc.ArgumentError, match="rows must be a positive int"):
        tcd.from_npy(path, rows=0)


def test_a_pickled_function_runs_in_a_fresh_worker_from_the_shared_cache_without_llvm(tmp_path):
    """A client compiles into the shared folder; a worker started afterwards on that folder
    links the stored object code: its LLVM compile counter stays at zero.  The client is a
    fresh process that tunes in its own folder first and then moves to the shared one, as a
    user's would; this test process may have run its first program with the cache off, and
    then has no tuning choices to leave in the folder (the worker would measure)."""
    folder, made = tmp_path / "shared", tmp_path / "traced.pkl"
    client_code = f"""
import cloudpickle, numpy as np
import tracecomp as tc
x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
tc.trace(lambda a: a + 1)(x)                  # the first program, in the default folder
tc.compile_cache.directory = {str(folder)!r}
traced = tc.trace(lambda x: tc.tanh(x) @ x.T + 1)
open({str(made)!r}, "wb").write(cloudpickle.dumps((traced, x, traced(x).numpy())))
"""
    run = subprocess.run([sys.executable, "-c", client_code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    traced, x, expected = cloudpickle.loads(made.read_bytes())
    cluster, client = start_cluster(1)
    try:
        tcd.share_cache(client, folder)
        client.restart()                                # fresh worker processes, the plugin applied
        assert on_workers(client, worker_compiles) == [0]
        np.testing.assert_array_equal(np.asarray(client.submit(traced, x).result()), expected)
        assert on_workers(client, worker_compiles) == [0]
        hits = on_workers(client, lambda: __import__("tracecomp").compile_cache.stats.hits)
        assert hits[0] >= 1
    finally:
        client.close()
        cluster.close()


def test_dask_stays_optional():
    code = ("import sys; import tracecomp; assert 'dask' not in sys.modules, 'tracecomp imported dask'\n"
            "sys.modules['distributed'] = None\n"
            "try:\n    import tracecomp.dask\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert 'pip install "tracecomp[dask]"' in out.stdout


# ------------------------------------------------------------------ data-parallel training
def regression_loss(params, x, y):
    hidden = tc.tanh(x @ params["w1"] + params["b1"])
    return ((hidden @ params["w2"] - y) ** 2).mean()


def regression_problem(rows=640):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, 8)).astype(np.float32)
    y = rng.standard_normal((rows, 2)).astype(np.float32)
    params = {"w1": (rng.standard_normal((8, 16)) * 0.3).astype(np.float32), "b1": np.zeros(16, np.float32),
              "w2": (rng.standard_normal((16, 2)) * 0.3).astype(np.float32)}
    return x, y, params


def one_process(loss_fn, params, opt, batches, lrs=None):
    """The reference: one process stepping on the whole batches."""
    state = opt.init(params)
    step = tc.trace(lambda p, s, lr, *b: opt.update(tc.grad(loss_fn)(p, *b), s, p, lr=lr))
    for k, batch in enumerate(batches):
        lr = np.float64(lrs[k] if lrs else opt.defaults["lr"])
        params, state = step(params, state, lr, *batch)
    return params


def assert_params_close(got, expected):
    got, expected = _leaves(got), _leaves(expected)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)


def _leaves(tree):
    from tracecomp.tensors import pytree
    return pytree.flatten(tree, lambda v: isinstance(v, (tc.Tensor, np.ndarray)))[0]


def test_two_workers_train_as_one_process_on_the_concatenated_batches(client):
    x, y, params = regression_problem()
    opt = tc.optim.AdamW(lr=1e-2)
    dp = tcd.DataParallel(regression_loss, params, opt, client, checkpoint_every=7)
    losses = dp.fit(da.from_array(x, chunks=160), da.from_array(y, chunks=160), batch_size=32, steps=20)
    assert len(losses) == 20 and losses[-1] < losses[0]
    batches = [(x[k * 32:(k + 1) * 32], y[k * 32:(k + 1) * 32]) for k in range(20)]
    assert_params_close(dp.state()[0], one_process(regression_loss, params, opt, batches))
    digests = dp.replica_digests()
    assert len(digests) == 2 and digests[0] == digests[1]      # the replicas are bit for bit the same
    expected_first = float(tc.trace(regression_loss)(params, x[:32], y[:32]))
    assert abs(losses[0] - expected_first) < 1e-5 * abs(expected_first)
    dp.close()


class Classifier(tc.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = tc.nn.Sequential(tc.nn.Linear(8, 32), tc.nn.GELU(), tc.nn.LayerNorm(32), tc.nn.Linear(32, 4))

    def forward(self, x):
        return self.body(x)


def classifier_loss(model, x, labels):
    return tc.cross_entropy(model(x), labels)


def test_modules_numpy_batches_lr_schedules_and_resuming_from_a_checkpoint_file(client, tmp_path):
    tc.manual_seed(0)
    model = Classifier()
    rng = np.random.default_rng(3)
    batches = [(rng.standard_normal((30, 8)).astype(np.float32), rng.integers(0, 4, 30)) for _ in range(12)]
    lrs = [1e-2 * (1 - k / 12) for k in range(12)]
    opt = tc.optim.Adam(lr=1e-2)
    path = tmp_path / "dp.safetensors"
    dp = tcd.DataParallel(classifier_loss, model, opt, client, checkpoint=str(path), checkpoint_every=6)
    for k in range(6):
        dp.step(*batches[k], lr=lrs[k])
    assert path.exists() and tc.tensors.checkpoint.load_metadata(path)["step"] == "6"
    saved = tc.load_state(path)            # state-dict names: the params load into a model
    assert "params.body.0.weight" in saved and "optimizer.exp_avg.body.0.weight" in saved
    fresh = Classifier()
    fresh.load_state_dict({k[len("params."):]: v for k, v in saved.items() if k.startswith("params.")})
    dp.close()
    resumed = tcd.DataParallel(classifier_loss, model, opt, client, resume=str(path))
    assert resumed.steps == 6
    for k in range(6, 12):
        resumed.step(*batches[k], lr=lrs[k])
    expected = one_process(classifier_loss, model, opt, batches, lrs)
    got = resumed.state()[0]
    assert isinstance(got, Classifier)
    assert_params_close(got, expected)
    resumed.close()


def test_a_killed_worker_is_replaced_and_training_resumes_from_the_checkpoint(client, caplog):
    x, y, params = regression_problem()
    opt = tc.optim.SGD(lr=5e-2, momentum=0.9)
    dp = tcd.DataParallel(regression_loss, params, opt, client, checkpoint_every=5)
    batches = [(x[k * 40:(k + 1) * 40], y[k * 40:(k + 1) * 40]) for k in range(16)]
    for batch in batches[:8]:
        dp.step(*batch)
    dp.losses([8])
    victim = dp.workers[1]
    os.kill(client.run(os.getpid)[victim], signal.SIGKILL)
    with caplog.at_level(logging.WARNING, logger="tracecomp.dask"):
        for batch in batches[8:]:
            dp.step(*batch)
        losses = dp.losses(range(1, 17))
    assert dp.recoveries >= 1 and victim not in dp.workers
    assert any("lost worker" in r.getMessage() and "checkpoint of step" in r.getMessage() for r in caplog.records)
    assert len(losses) == 16
    assert_params_close(dp.state()[0], one_process(regression_loss, params, opt, batches))
    digests = dp.replica_digests()
    assert digests[0] == digests[1]
    dp.close()


def test_four_workers_sum_in_a_tree_and_relay_the_total_down_one(monkeypatch):
    """Past FANOUT_MAX workers the total goes down a relay tree; forced here with 4."""
    monkeypatch.setattr(tcd.training, "FANOUT_MAX", 2)
    x, y, params = regression_problem(rows=240)
    opt = tc.optim.Adam(lr=1e-2)
    cluster, client = start_cluster(4)
    try:
        dp = tcd.DataParallel(regression_loss, params, opt, client)
        assert dp.size == 4
        batches = [(x[k * 40:(k + 1) * 40], y[k * 40:(k + 1) * 40]) for k in range(6)]
        for batch in batches:
            dp.step(*batch)
        assert len(set(dp.replica_digests())) == 1
        assert_params_close(dp.state()[0], one_process(regression_loss, params, opt, batches))
    finally:
        client.close()
        cluster.close()


def mismatched_loss(params, x, y):
    return ((x @ params["w"] - y) ** 2).mean()


def test_an_error_in_the_loss_on_a_worker_names_the_users_line(client):
    dp = tcd.DataParallel(mismatched_loss, {"w": np.ones((5, 2), np.float32)}, tc.optim.SGD(lr=0.1), client)
    with pytest.raises(tc.ShapeError, match=r"inner dims do not match.*\n  at .*test_dask\.py:\d+"):
        dp.step(np.ones((8, 4), np.float32), np.ones((8, 2), np.float32))
        dp.losses([1])
    with pytest.raises(tc.ShapeError, match="a batch of 1 rows cannot be split across 2 workers"):
        dp.step(np.ones((1, 4), np.float32), np.ones((1, 2), np.float32))


def test_no_replacement_worker_raises_instead_of_hanging(client):
    x, y, params = regression_problem(rows=64)
    dp = tcd.DataParallel(regression_loss, params, tc.optim.SGD(lr=0.1), client, recover_timeout=1.0)
    dp.step(x, y)
    dp.losses([1])
    cluster = client.cluster
    try:
        client.retire_workers([dp.workers[1]], close_workers=True, remove=True)
        cluster.scale(1)
        with pytest.raises(tcd.WorkerLostError, match=r"only 1 of 2 workers after 1 s"):
            dp.step(x, y)
            dp.losses([2])
    finally:
        cluster.scale(2)
        client.wait_for_workers(2, timeout=60)
