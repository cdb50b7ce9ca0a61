"""Checkpoints in safetensors files: round trips, PyTorch interop, damaged files, and the
messages of the state check."""
import json
import os
import struct

import numpy as np
import pytest

pytest.importorskip("safetensors")

import tracecomp as tc  # noqa: E402
import tracecomp.tensors.checkpoint as ckpt  # noqa: E402
from tracecomp.tensors.checkpoint import CheckpointError, CheckpointNotFoundError  # noqa: E402


def sample(dtype: str, shape) -> np.ndarray:
    values = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) * 1.25 - 3
    if dtype == "bool":
        return values.astype(np.int64) % 2 == 0
    return values.astype(dtype)


DTYPES = ["float32", "float64", "int32", "int64", "bool"]
SHAPES = [(), (0,), (2, 0, 3), (5,), (2, 3)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_keeps_values_shape_and_dtype(tmp_path, dtype, shape):
    array = sample(dtype, shape)
    path = tmp_path / "state.safetensors"
    ckpt.save({"as_tensor": tc.tensor(array), "as_array": array}, path)
    loaded = ckpt.load_state(path)
    assert set(loaded) == {"as_tensor", "as_array"}
    for value in loaded.values():
        assert isinstance(value, tc.Tensor)
        assert value.dtype is getattr(tc, dtype)
        assert value.shape == shape
        np.testing.assert_array_equal(value.numpy(), array)


def test_save_copies_strided_views_in_order(tmp_path):
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    views = {"transposed": base.T, "every_other": base[:, ::2], "reversed": base[::-1]}
    ckpt.save(views, tmp_path / "v.safetensors")
    loaded = ckpt.load_state(tmp_path / "v.safetensors")
    for key, view in views.items():
        np.testing.assert_array_equal(loaded[key].numpy(), view)


def test_save_converts_other_arrays_as_tc_tensor_does(tmp_path):
    ckpt.save({"half": np.array([0.5, 2], np.float16), "small": np.array([200], np.uint8),
               "number": 3.5}, tmp_path / "c.safetensors")
    loaded = ckpt.load_state(tmp_path / "c.safetensors")
    assert (loaded["half"].dtype, loaded["small"].dtype, loaded["number"].dtype) == (tc.float16, tc.int32, tc.float32)
    assert loaded["half"].tolist() == [0.5, 2.0] and loaded["small"].tolist() == [200]


def test_metadata_round_trip(tmp_path):
    path = tmp_path / "m.safetensors"
    ckpt.save({"w": np.ones(2, np.float32)}, path, metadata={"epoch": "3", "format": "pt"})
    assert ckpt.load_metadata(path) == {"epoch": "3", "format": "pt"}
    ckpt.save({"w": np.ones(2, np.float32)}, path)
    assert ckpt.load_metadata(path) == {}


def test_loaded_order_is_the_file_order(tmp_path):
    path = tmp_path / "o.safetensors"
    ckpt.save({name: np.zeros(3, np.float32) for name in ["c", "a", "b"]}, path)
    header_length = struct.unpack("<Q", path.read_bytes()[:8])[0]
    header = json.loads(path.read_bytes()[8:8 + header_length])
    in_file = sorted((entry["data_offsets"][0], key) for key, entry in header.items() if key != "__metadata__")
    assert list(ckpt.load_state(path)) == [key for _, key in in_file]


def test_loaded_tensors_do_not_change_when_the_file_does(tmp_path):
    path = tmp_path / "f.safetensors"
    ckpt.save({"w": np.ones(3, np.float32)}, path)
    loaded = ckpt.load_state(path)
    ckpt.save({"w": np.zeros(3, np.float32)}, path)
    assert loaded["w"].tolist() == [1.0, 1.0, 1.0]


# ---------------------------------------------------------------- bad arguments to save
def test_save_refuses_non_str_keys(tmp_path):
    with pytest.raises(tc.ArgumentError, match=r"keys of a state dict must be str, got int 3"):
        ckpt.save({3: np.ones(1)}, tmp_path / "k.safetensors")


def test_save_refuses_bad_metadata_and_values(tmp_path):
    path = tmp_path / "bad.safetensors"
    with pytest.raises(tc.ArgumentError, match="metadata must map str to str"):
        ckpt.save({"w": np.ones(1)}, path, metadata={"epoch": 3})
    with pytest.raises(tc.ArgumentError, match=r"state_dict\['w'\] is a str, not a tensor or array"):
        ckpt.save({"w": "weights"}, path)
    with pytest.raises(tc.ArgumentError, match="must be a mapping"):
        ckpt.save([np.ones(1)], path)
    assert not path.exists() and os.listdir(tmp_path) == []


def test_save_of_a_traced_tensor_says_it_has_no_value(tmp_path):
    path = tmp_path / "t.safetensors"

    def step(x):
        ckpt.save({"x": x}, path)
        return x

    with pytest.raises(tc.TraceError, match=r"tc.save of state_dict\['x'\] to .*t.safetensors needs the "
                                            r"tensor's value, but inside tc.trace tensors are symbolic"):
        tc.trace(step)(np.ones(2, np.float32))
    assert not path.exists()


def test_save_into_a_missing_folder_names_the_file(tmp_path):
    path = tmp_path / "no" / "such" / "w.safetensors"
    with pytest.raises(CheckpointError, match=f"^tc.save: cannot write {path}: the folder "
                                              f"{path.parent} does not exist$"):
        ckpt.save({"w": np.ones(1)}, path)


def test_save_onto_a_directory_names_the_file(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(CheckpointError, match=f"^tc.save: cannot write {tmp_path / 'taken'}: "):
        ckpt.save({"w": np.ones(1)}, tmp_path / "taken")
    assert os.listdir(tmp_path) == ["taken"]


# ---------------------------------------------------------------- PyTorch interop
def test_a_file_pytorch_saved_loads(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file
    state = {"linear.weight": torch.randn(4, 3), "linear.bias": torch.randn(4, dtype=torch.float64),
             "steps": torch.tensor(7), "index": torch.arange(5, dtype=torch.int32),
             "mask": torch.tensor([True, False]), "empty": torch.zeros(0, 2)}
    path = tmp_path / "torch.safetensors"
    save_file(state, str(path), metadata={"framework": "pt"})
    loaded = ckpt.load_state(path)
    assert set(loaded) == set(state)
    for key, value in state.items():
        assert loaded[key].dtype.label == str(value.dtype).removeprefix("torch.").replace("long", "int64")
        np.testing.assert_array_equal(loaded[key].numpy(), value.numpy())
    assert ckpt.load_metadata(path) == {"framework": "pt"}


def test_a_file_saved_here_loads_in_pytorch(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file
    state = {name: sample(name, (2, 3)) for name in DTYPES} | {"scalar": np.float64(2.5)}
    path = tmp_path / "ours.safetensors"
    ckpt.save({key: tc.tensor(value) for key, value in state.items()}, path)
    loaded = load_file(str(path))
    assert set(loaded) == set(state)
    for key, value in state.items():
        assert loaded[key].dtype == getattr(torch, str(np.asarray(value).dtype))
        np.testing.assert_array_equal(loaded[key].numpy(), value)


def test_torch_tensors_save_through_dlpack(tmp_path):
    torch = pytest.importorskip("torch")
    weight = torch.arange(6.0).reshape(2, 3).T       # a strided view
    ckpt.save({"w": weight}, tmp_path / "d.safetensors")
    np.testing.assert_array_equal(ckpt.load_state(tmp_path / "d.safetensors")["w"].numpy(), weight.numpy())


def test_half_precision_round_trips_with_pytorch(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file
    values = torch.tensor([1.5, -2.0, 3.140625, 65504.0, float("inf"), float("nan"), 1e-7])
    state = {"half": values.half(), "brain": values.bfloat16()}
    save_file(state, str(tmp_path / "h.safetensors"))
    loaded = ckpt.load_state(tmp_path / "h.safetensors")
    assert (loaded["half"].dtype, loaded["brain"].dtype) == (tc.float16, tc.bfloat16)
    for key, value in state.items():     # the bits, NaN included
        np.testing.assert_array_equal(loaded[key].numpy().view(np.uint16), value.view(torch.int16).numpy().view(np.uint16))
    ckpt.save(loaded, tmp_path / "back.safetensors")
    back = load_file(str(tmp_path / "back.safetensors"))
    for key, value in state.items():
        assert back[key].dtype == value.dtype and torch.equal(back[key].view(torch.int16), value.view(torch.int16))


@pytest.mark.parametrize("dtype, label", [(np.uint64, "U64"), (np.complex64, "C64")])
def test_a_dtype_tracecomp_lacks_names_file_key_and_dtype(tmp_path, dtype, label):
    from safetensors.numpy import save_file
    path = tmp_path / "u.safetensors"
    save_file({"ok": np.ones(2, np.float32), "odd": np.ones(2, dtype)}, str(path))
    with pytest.raises(tc.DTypeError, match=f"^{path}: tensor 'odd' has dtype {label}, which tracecomp "
                                            "cannot hold"):
        ckpt.load_state(path)


# ---------------------------------------------------------------- damaged files
@pytest.fixture
def good_file(tmp_path):
    path = tmp_path / "good.safetensors"
    ckpt.save({"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(3)}, path)
    return path


def header_length(path) -> int:
    return struct.unpack("<Q", path.read_bytes()[:8])[0]


def test_missing_file(tmp_path):
    path = tmp_path / "absent.safetensors"
    with pytest.raises(CheckpointNotFoundError, match=f"^checkpoint file not found: {path}$") as caught:
        ckpt.load_state(path)
    assert isinstance(caught.value, FileNotFoundError) and isinstance(caught.value, tc.TracecompError)


def test_a_directory(tmp_path):
    with pytest.raises(CheckpointError, match=f"^{tmp_path} is a directory"):
        ckpt.load_state(tmp_path)


@pytest.mark.parametrize("cut", [1, 4, 20])
def test_truncated_tensor_data(tmp_path, good_file, cut):
    data = good_file.read_bytes()
    path = tmp_path / "cut.safetensors"
    path.write_bytes(data[:-cut])
    size = len(data) - 8 - header_length(good_file)
    with pytest.raises(CheckpointError, match=f"^{path}: truncated: the header describes {size} bytes of "
                                              f"tensor data, the file holds {size - cut}$"):
        ckpt.load_state(path)


def test_truncated_inside_the_header(tmp_path, good_file):
    path = tmp_path / "cut.safetensors"
    path.write_bytes(good_file.read_bytes()[:30])
    with pytest.raises(CheckpointError, match=f"^{path}: truncated or corrupt: the header should be "
                                              f"{header_length(good_file)} bytes, but the file has only 22 "):
        ckpt.load_state(path)


@pytest.mark.parametrize("size", [0, 5])
def test_too_short_for_a_header_length(tmp_path, size):
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\x07" * size)
    with pytest.raises(CheckpointError, match=f"^{path}: not a safetensors file: {size} bytes, too short"):
        ckpt.load_state(path)


def test_garbage_bytes(tmp_path):
    path = tmp_path / "garbage.safetensors"
    path.write_bytes(b"this is a text file, not tensors\n" * 3)
    with pytest.raises(CheckpointError, match=f"^{path}: not a safetensors file: its first 8 bytes give a "
                                              "header of \\d+ bytes, more than the 100 MiB limit$"):
        ckpt.load_state(path)


def test_random_bytes_with_a_small_header_length(tmp_path):
    path = tmp_path / "noise.safetensors"
    path.write_bytes(struct.pack("<Q", 16) + bytes(range(200, 256)))
    with pytest.raises(CheckpointError, match=f"^{path}: not a safetensors file: its header is not JSON"):
        ckpt.load_state(path)


def test_a_header_that_claims_more_bytes_than_the_file_has(tmp_path, good_file):
    data = good_file.read_bytes()
    path = tmp_path / "lies.safetensors"
    path.write_bytes(struct.pack("<Q", header_length(good_file) + 1000) + data[8:])
    with pytest.raises(CheckpointError, match=f"^{path}: truncated or corrupt: the header should be"):
        ckpt.load_state(path)


def test_a_header_that_claims_fewer_bytes_than_it_has(tmp_path, good_file):
    data = good_file.read_bytes()
    path = tmp_path / "lies.safetensors"
    path.write_bytes(struct.pack("<Q", header_length(good_file) - 10) + data[8:])
    with pytest.raises(CheckpointError, match=f"^{path}: not a safetensors file: its header is not JSON"):
        ckpt.load_state(path)


def test_offsets_that_do_not_fit_the_shape(tmp_path, good_file):
    """A well-formed header whose offsets disagree with a shape: safetensors' own check,
    re-raised as ours with the file name."""
    data, length = good_file.read_bytes(), header_length(good_file)
    header = json.loads(data[8:8 + length])
    header["w"]["shape"] = [3, 3]
    text = json.dumps(header, separators=(",", ":")).encode().ljust(length)
    assert len(text) == length
    path = tmp_path / "shape.safetensors"
    path.write_bytes(data[:8] + text + data[8 + length:])
    with pytest.raises(CheckpointError, match=f"^{path}: not a valid safetensors file \\(.+\\)$"):
        ckpt.load_state(path)


# ---------------------------------------------------------------- checking a loaded state
EXPECTED = {"fc.weight": ((4, 3), tc.float32), "fc.bias": ((4,), tc.float32),
            "steps": ((), tc.int64), "head.weight": ((2, 4), tc.float32)}


def loaded_state():
    return {"fc.weight": tc.zeros(3, 4), "fc.bias": tc.zeros(4, dtype=tc.float64),
            "steps": tc.tensor(0), "extra": tc.zeros(1), "older": np.zeros(2, np.int32)}


def test_check_state_lists_every_problem():
    with pytest.raises(CheckpointError) as caught:
        ckpt.check_state(EXPECTED, loaded_state(), "model.safetensors")
    assert str(caught.value) == (
        "cannot load the state from model.safetensors:\n"
        "  missing keys (expected, not in the file): 'head.weight'\n"
        "  unexpected keys (in the file, not expected): 'extra', 'older'\n"
        "  'fc.weight': the file has shape (3, 4) float32, expected shape (4, 3) float32\n"
        "  'fc.bias': the file has shape (4,) float64, expected shape (4,) float32")


def test_check_state_not_strict_returns_the_keys_but_still_refuses_bad_shapes():
    with pytest.raises(CheckpointError) as caught:
        ckpt.check_state(EXPECTED, loaded_state(), strict=False)
    assert str(caught.value) == (
        "cannot load the state (no file named):\n"
        "  'fc.weight': the file has shape (3, 4) float32, expected shape (4, 3) float32\n"
        "  'fc.bias': the file has shape (4,) float64, expected shape (4,) float32")
    state = loaded_state()
    state["fc.weight"], state["fc.bias"] = tc.zeros(4, 3), tc.zeros(4)
    assert ckpt.check_state(EXPECTED, state, strict=False) == (["head.weight"], ["extra", "older"])


def test_check_state_accepts_a_matching_state_and_numpy_arrays():
    expected = {"w": ((2, 2), tc.float32), "n": ((), "int64")}
    result = ckpt.check_state(expected, {"n": np.int64(3), "w": np.zeros((2, 2), np.float32)})
    assert result.missing_keys == [] and result.unexpected_keys == []


def test_check_state_after_a_round_trip(tmp_path):
    path = tmp_path / "model.safetensors"
    ckpt.save({"w": np.zeros((2, 5), np.float32)}, path)
    with pytest.raises(CheckpointError, match=f"^cannot load the state from {path}:\n  'w': the file has "
                                              r"shape \(2, 5\) float32, expected shape \(5, 2\) float32$"):
        ckpt.check_state({"w": ((5, 2), tc.float32)}, ckpt.load_state(path), path)
