"""tc.utils.data: TensorDataset and DataLoader, against torch.utils.data where PyTorch is here."""
import numpy as np
import pytest

import tracecomp as tc
import tracecomp.utils.data as data
from tracecomp.utils.data import DataError, DataLoader, TensorDataset


def features_and_labels(n: int):
    return np.arange(n * 3, dtype=np.float32).reshape(n, 3), np.arange(n, dtype=np.int64) % 4


def labels_of(loader) -> list[list[int]]:
    return [batch[1].tolist() for batch in loader]


# ---------------------------------------------------------------- TensorDataset
def test_tensor_dataset_items_and_len():
    x, y = features_and_labels(5)
    dataset = TensorDataset(tc.tensor(x), y)
    assert len(dataset) == 5
    item_x, item_y = dataset[2]
    assert isinstance(item_x, tc.Tensor) and item_x.shape == (3,) and item_y.shape == ()
    assert item_x.tolist() == x[2].tolist() and item_y.item() == y[2]
    batch_x, batch_y = dataset[np.array([4, 0])]
    assert batch_x.tolist() == x[[4, 0]].tolist() and batch_y.tolist() == y[[4, 0]].tolist()


def test_tensor_dataset_refuses_different_first_dims():
    with pytest.raises(tc.ShapeError) as caught:
        TensorDataset(np.zeros((4, 3)), np.zeros(5))
    assert str(caught.value) == ("TensorDataset: the tensors' first dims differ (tensor 0 (4, 3), tensor 1 "
                                 "(5,)); every tensor needs one row per item")


def test_tensor_dataset_refuses_no_tensors_and_0d_tensors():
    with pytest.raises(tc.ArgumentError, match="needs at least one tensor"):
        TensorDataset()
    with pytest.raises(tc.ShapeError, match="tensor 1 is 0-d"):
        TensorDataset(np.zeros(3), np.float32(1))


# ---------------------------------------------------------------- batching
@pytest.mark.parametrize("n", [0, 1, 7, 12])
@pytest.mark.parametrize("batch_size", [1, 3, 4, 20])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_match_pytorch(n, batch_size, drop_last):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader as TorchLoader, TensorDataset as TorchDataset
    x, y = features_and_labels(n)
    ours = DataLoader(TensorDataset(x, y), batch_size=batch_size, drop_last=drop_last)
    theirs = TorchLoader(TorchDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=batch_size,
                         drop_last=drop_last)
    assert len(ours) == len(theirs)
    batches = list(ours)
    assert len(batches) == len(theirs)
    for (our_x, our_y), (their_x, their_y) in zip(batches, theirs):
        assert isinstance(our_x, tc.Tensor) and our_x.dtype is tc.float32 and our_y.dtype is tc.int64
        np.testing.assert_array_equal(our_x.numpy(), their_x.numpy())
        np.testing.assert_array_equal(our_y.numpy(), their_y.numpy())


def test_len_without_pytorch():
    dataset = TensorDataset(np.zeros(10))
    assert [len(DataLoader(dataset, batch_size=b)) for b in (1, 3, 4, 10, 11)] == [10, 4, 3, 1, 1]
    assert [len(DataLoader(dataset, batch_size=b, drop_last=True)) for b in (1, 3, 4, 10, 11)] == [10, 3, 2, 1, 0]
    assert [len(batch[0]) for batch in DataLoader(dataset, batch_size=4)] == [4, 4, 2]
    assert [len(batch[0]) for batch in DataLoader(dataset, batch_size=4, drop_last=True)] == [4, 4]


# ---------------------------------------------------------------- shuffling
def epoch_order(loader) -> list[int]:
    return [int(i) for batch in loader for i in batch[0].tolist()]


@pytest.mark.parametrize("drop_last", [False, True])
def test_shuffled_epochs_cover_every_item_once(drop_last):
    n, batch_size = 23, 5
    loader = DataLoader(TensorDataset(np.arange(n)), batch_size=batch_size, shuffle=True, seed=1,
                        drop_last=drop_last)
    orders = [epoch_order(loader) for _ in range(4)]
    for order in orders:
        if drop_last:
            assert len(order) == 20 and len(set(order)) == 20 and set(order) <= set(range(n))
        else:
            assert sorted(order) == list(range(n))
    assert len({tuple(order) for order in orders}) == 4, "each epoch draws a new order"
    assert orders[0] != sorted(orders[0])


def test_a_seed_repeats_the_epochs():
    dataset = TensorDataset(np.arange(50))
    first = DataLoader(dataset, batch_size=8, shuffle=True, seed=7)
    second = DataLoader(dataset, batch_size=8, shuffle=True, seed=7)
    assert [epoch_order(first) for _ in range(3)] == [epoch_order(second) for _ in range(3)]
    other = DataLoader(dataset, batch_size=8, shuffle=True, seed=8)
    assert epoch_order(other) != epoch_order(DataLoader(dataset, batch_size=8, shuffle=True, seed=7))


def test_manual_seed_repeats_the_epochs_without_a_seed():
    loader = DataLoader(TensorDataset(np.arange(50)), batch_size=8, shuffle=True)
    tc.manual_seed(3)
    first = [epoch_order(loader) for _ in range(2)]
    tc.manual_seed(3)
    assert [epoch_order(loader) for _ in range(2)] == first
    assert first[0] != first[1]


def test_the_order_is_drawn_when_the_epoch_starts():
    loader = DataLoader(TensorDataset(np.arange(30)), batch_size=30, shuffle=True)
    tc.manual_seed(5)
    expected = epoch_order(loader)
    tc.manual_seed(5)
    epoch = iter(loader)
    tc.rand(3)                       # a draw after iter() and before the first batch
    assert list(next(epoch)[0].tolist()) == expected


def test_an_explicit_generator():
    dataset = TensorDataset(np.arange(40))
    first = epoch_order(DataLoader(dataset, batch_size=6, shuffle=True, generator=np.random.default_rng(11)))
    assert first == epoch_order(DataLoader(dataset, batch_size=6, shuffle=True,
                                           generator=np.random.default_rng(11)))
    assert sorted(first) == list(range(40))


# ---------------------------------------------------------------- other datasets
def test_a_sequence_of_tuples_is_stacked():
    items = [(np.full(2, i, np.float32), i, float(i) / 2) for i in range(5)]
    batches = list(DataLoader(items, batch_size=2))
    assert len(batches) == 3
    x, label, half = batches[1]
    assert x.shape == (2, 2) and x.tolist() == [[2, 2], [3, 3]]
    assert label.dtype is tc.int64 and label.tolist() == [2, 3]
    assert half.dtype is tc.float32 and half.tolist() == [1.0, 1.5]


def test_a_sequence_of_single_arrays_and_of_dicts():
    arrays = [tc.tensor([i, i + 1]) for i in range(4)]
    assert [batch.tolist() for batch in DataLoader(arrays, batch_size=3)] == [[[0, 1], [1, 2], [2, 3]], [[3, 4]]]
    records = [{"x": np.ones(3) * i, "y": i} for i in range(3)]
    batch = next(iter(DataLoader(records, batch_size=3)))
    assert set(batch) == {"x", "y"} and batch["x"].shape == (3, 3) and batch["y"].tolist() == [0, 1, 2]


def test_an_array_is_a_dataset_of_its_rows():
    rows = np.arange(12).reshape(6, 2)
    order = [batch.tolist() for batch in DataLoader(rows, batch_size=4, shuffle=True, seed=0)]
    assert sorted(sum(order, [])) == rows.tolist() and [len(b) for b in order] == [4, 2]


def test_items_of_different_shapes_name_both_items():
    items = [np.zeros(3), np.zeros(3), np.zeros(4)]
    with pytest.raises(tc.ShapeError) as caught:
        list(DataLoader(items, batch_size=3))
    assert str(caught.value) == ("DataLoader: cannot stack the items into a batch: item 0 has shape (3,), "
                                 "item 2 has (4,)")
    pairs = [(np.zeros(2), 0), (np.zeros(5), 1)]
    with pytest.raises(tc.ShapeError, match=r"cannot stack field 0 of the items into a batch: item 0 has "
                                            r"shape \(2,\), item 1 has \(5,\)"):
        list(DataLoader(pairs, batch_size=2))


def test_items_of_different_structure_and_non_arrays():
    with pytest.raises(DataError, match=r"item 0 is a tuple of 2 fields, but item 1 is tuple \(1, 2, 3\)"):
        list(DataLoader([(1, 2), (1, 2, 3)], batch_size=2))
    with pytest.raises(DataError, match=r"item 1, field 1, is a str, not an array, tensor or number"):
        list(DataLoader([(1, 2), (1, "two")], batch_size=2))
    with pytest.raises(DataError, match=r"^DataLoader: item 2 is a NoneType, not an array, tensor or number"):
        list(DataLoader([1, 2, None], batch_size=3))


def test_collate_on_its_own():
    x, y = data.collate([(np.zeros(2), 1), (np.ones(2), 2)])
    assert x.tolist() == [[0, 0], [1, 1]] and y.tolist() == [1, 2]


# ---------------------------------------------------------------- bad arguments
@pytest.mark.parametrize("batch_size, error, message", [
    (0, DataError, "DataLoader: batch_size must be a positive int, got 0"),
    (-2, DataError, "DataLoader: batch_size must be a positive int, got -2"),
    (2.0, tc.ArgumentError, "DataLoader: batch_size must be a positive int, got float 2.0"),
    (True, tc.ArgumentError, "DataLoader: batch_size must be a positive int, got bool True"),
    (None, tc.ArgumentError, "DataLoader: batch_size must be a positive int, got NoneType None"),
])
def test_bad_batch_size(batch_size, error, message):
    with pytest.raises(error) as caught:
        DataLoader(TensorDataset(np.zeros(4)), batch_size=batch_size)
    assert str(caught.value) == message


def test_bad_loader_arguments():
    dataset = TensorDataset(np.zeros(4))
    with pytest.raises(tc.ArgumentError, match="pass seed= or generator=, not both"):
        DataLoader(dataset, shuffle=True, seed=1, generator=np.random.default_rng())
    with pytest.raises(tc.ArgumentError, match=r"generator must have a .permutation\(n\) method"):
        DataLoader(dataset, shuffle=True, generator=3)
    with pytest.raises(tc.ArgumentError, match="the dataset must support len"):
        DataLoader(iter(range(3)))
    assert len(DataLoader(dataset, batch_size=np.int64(2))) == 2
