"""State handed to tracecomp by a careless or hostile user (issue 33, item 9): state dicts
that do not fit the module, optimizer state dicts with hyper-parameters of the wrong type,
tensors with autograd history pickled and copied, and safetensors headers that are nested
too deeply or hold dtypes tracecomp lacks.  Every error names the cause, in PyTorch's
words where PyTorch has them (its messages are taken from torch itself, run here)."""
from __future__ import annotations

import copy
import json
import pickle
import struct

import numpy as np
import pytest

import tracecomp as tc

torch = pytest.importorskip("torch")


def message(fn) -> tuple[type, str]:
    """(the exception type, its message) that fn() raises."""
    with pytest.raises(Exception) as info:
        fn()
    return info.type, str(info.value)


def torch_shapes(text: str) -> str:
    """PyTorch's message with its shapes printed as tracecomp prints them (tuples)."""
    import re
    return re.sub(r"torch\.Size\(\[([^\]]*)\]\)",
                  lambda m: f"({m.group(1)},)" if m.group(1).count(",") == 0 and m.group(1) else f"({m.group(1)})",
                  text)


# ---------------------------------------------------------------- Module.load_state_dict

def both_linears():
    ours, theirs = tc.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    return ours, theirs


STATES = {
    "missing": lambda T: {"weight": T(np.zeros((2, 3)))},
    "unexpected": lambda T: {"weight": T(np.zeros((2, 3))), "bias": T(np.zeros(2)), "extra": T(np.zeros(1))},
    "wrong shape": lambda T: {"weight": T(np.zeros((3, 3))), "bias": T(np.zeros(2))},
    "all three": lambda T: {"weight": T(np.zeros((3, 3))), "extra": T(np.zeros(1)), "more": T(np.zeros(1))},
    "a vector for a scalar": lambda T: {"weight": T(np.zeros((2, 3))), "bias": T(np.zeros(3))},
}


@pytest.mark.parametrize("case", list(STATES))
def test_load_state_dict_errors_are_pytorchs(case):
    ours, theirs = both_linears()
    their_type, their_text = message(lambda: theirs.load_state_dict(
        STATES[case](lambda a: torch.tensor(np.asarray(a, np.float32)))))
    before = ours.weight.numpy().copy()
    our_type, our_text = message(lambda: ours.load_state_dict(
        STATES[case](lambda a: tc.tensor(np.asarray(a, np.float32)))))
    assert their_type is RuntimeError and issubclass(our_type, RuntimeError)
    assert issubclass(our_type, tc.CheckpointError)
    assert our_text == torch_shapes(their_text)
    np.testing.assert_array_equal(ours.weight.numpy(), before)       # nothing copied


def test_load_state_dict_not_strict_returns_the_keys_as_pytorch_does():
    ours, theirs = both_linears()
    state = {"weight": np.zeros((2, 3), np.float32), "extra": np.zeros(1, np.float32)}
    theirs_keys = theirs.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=False)
    our_keys = ours.load_state_dict(state, strict=False)
    assert (our_keys.missing_keys, our_keys.unexpected_keys) == (theirs_keys.missing_keys,
                                                                  theirs_keys.unexpected_keys)
    np.testing.assert_array_equal(ours.weight.numpy(), 0)
    # a wrong shape is an error with strict=False too, in PyTorch as here
    bad = {"weight": np.zeros((3, 3), np.float32)}
    _, their_text = message(lambda: theirs.load_state_dict({"weight": torch.zeros(3, 3)}, strict=False))
    _, our_text = message(lambda: ours.load_state_dict(bad, strict=False))
    assert our_text == torch_shapes(their_text)


def test_load_state_dict_names_a_value_that_is_not_a_tensor_and_a_state_that_is_not_a_dict():
    ours, _ = both_linears()
    kind, text = message(lambda: ours.load_state_dict({"weight": "hello", "bias": np.zeros(2, np.float32)}))
    assert issubclass(kind, RuntimeError)
    assert text.startswith("Error(s) in loading state_dict for Linear:\n\t"
                           'While copying the parameter named "weight", expected tc.Tensor')
    assert "<class 'str'>" in text
    kind, text = message(lambda: ours.load_state_dict([("weight", np.zeros((2, 3)))]))
    assert kind is TypeError and text == "Expected state_dict to be dict-like, got <class 'list'>."


def test_load_state_dict_names_a_dtype_it_will_not_cast_and_the_file():
    ours, _ = both_linears()
    state = tc.tensors.checkpoint.LoadedState(weight=np.zeros((2, 3), np.float64), bias=np.zeros(2, np.float32))
    state.source = "model.safetensors"
    _, text = message(lambda: ours.load_state_dict(state))
    assert text.startswith("Error(s) in loading state_dict for Linear from model.safetensors:\n\t"
                           "dtype mismatch for weight: copying a param with dtype float64 from "
                           "checkpoint, the dtype in current model is float32")


# ---------------------------------------------------------------- optimizer state dicts

@pytest.mark.parametrize("make, key, value, kind", [
    (lambda p: tc.optim.SGD([p], lr=0.1, momentum=0.9), "lr", "0.1", "str"),
    (lambda p: tc.optim.Adam([p], lr=0.1), "lr", None, "NoneType"),
    (lambda p: tc.optim.Adam([p], lr=0.1), "eps", [1e-8], "list"),
    (lambda p: tc.optim.SGD([p], lr=0.1), "nesterov", "yes", "str"),
    (lambda p: tc.optim.Adam([p], lr=0.1), "betas", (0.9, "0.999"), "str"),
])
def test_an_optimizer_state_dict_with_a_hyper_parameter_of_the_wrong_type(make, key, value, kind):
    p = tc.nn.Parameter(tc.ones(3))
    opt = make(p)
    state = opt.state_dict()
    state["param_groups"][0][key] = value
    with pytest.raises(tc.ArgumentError) as info:
        opt.load_state_dict(state)
    text = str(info.value)
    assert f"{type(opt).__name__}.load_state_dict: param_groups[0]" in text
    assert key in text or "beta parameter" in text
    assert f"({kind})" in text
    assert opt.param_groups[0][key] != value            # nothing was taken
    p.grad = tc.ones(3)
    opt.step()                                          # and the optimizer still steps


def test_an_optimizer_state_dict_with_a_group_that_is_not_a_dict():
    opt = tc.optim.SGD([tc.nn.Parameter(tc.ones(3))], lr=0.1)
    with pytest.raises(tc.ArgumentError, match=r"param_groups\[0\] must be a dict with a 'params' list"):
        opt.load_state_dict({"state": {}, "param_groups": [[0]]})


# ---------------------------------------------------------------- tensors with history

def test_a_tensor_with_a_grad_fn_pickles_as_a_leaf_as_in_pytorch():
    theirs = pickle.loads(pickle.dumps(torch.ones(3, requires_grad=True) * 2))
    x = tc.ones(3, requires_grad=True)
    y = x * 2
    ours = pickle.loads(pickle.dumps(y))
    assert (ours.requires_grad, ours.is_leaf, ours.grad_fn) == (theirs.requires_grad, theirs.is_leaf, None)
    np.testing.assert_array_equal(ours.numpy(), 2.0)
    ours.sum().backward()                               # a leaf of its own now
    np.testing.assert_array_equal(ours.grad.numpy(), 1.0)


def test_a_parameter_with_a_grad_pickles_without_it_as_in_pytorch():
    p = tc.nn.Parameter(tc.ones(2))
    (p * 3).sum().backward()
    copy_ = pickle.loads(pickle.dumps(p))
    assert type(copy_) is tc.nn.Parameter and copy_.requires_grad and copy_.grad is None


def test_deepcopy_of_a_tensor_with_history_is_refused_as_in_pytorch():
    y = tc.ones(3, requires_grad=True) * 2
    with pytest.raises(RuntimeError, match="Only Tensors created explicitly by the user .graph leaves. "
                                           "support the deepcopy protocol.*MulBackward0"):
        copy.deepcopy(y)
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(torch.ones(3, requires_grad=True) * 2)
    leaf = tc.ones(3, requires_grad=True)
    (leaf * 2).sum().backward()
    twin = copy.deepcopy(leaf)
    assert twin is not leaf and twin.requires_grad and twin.grad is not leaf.grad
    np.testing.assert_array_equal(twin.grad.numpy(), 2.0)


def test_pickling_a_traced_tensor_says_why():
    with pytest.raises(tc.TraceError, match="pickling a tensor needs the tensor's value"):
        tc.trace(lambda a: pickle.dumps(a))(np.ones(2, np.float32))


# ---------------------------------------------------------------- safetensors headers

def write(path, header, data=b""):
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


@pytest.mark.parametrize("header", [
    b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"__metadata__": ' + b'{"x": ' * 50_000 + b"1" + b"}" * 50_000 + b"}",
], ids=["arrays", "objects"])
def test_a_deeply_nested_header_is_a_checkpoint_error(tmp_path, header):
    path = write(tmp_path / "deep.safetensors", header)
    with pytest.raises(tc.CheckpointError, match=f"{path}: not a safetensors file: its header nests"):
        tc.load_state(path)
    with pytest.raises(tc.CheckpointError, match="nests JSON arrays or objects too deeply"):
        tc.tensors.checkpoint.load_metadata(path)


@pytest.mark.parametrize("dtype, size", [("F8_E4M3", 2), ("F8_E5M2", 2), ("F8_E8M0", 2), ("F4", 1),
                                         ("F6_E2M3", 2), ("Q4", 1)])
def test_a_float8_or_unknown_dtype_names_the_file_key_and_dtype(tmp_path, dtype, size):
    path = write(tmp_path / "f8.safetensors",
                 {"w": {"dtype": dtype, "shape": [2], "data_offsets": [0, size]}}, b"\0" * size)
    with pytest.raises(tc.core.errors.DTypeError,
                       match=f"{path}: tensor 'w' has dtype {dtype}, which tracecomp cannot hold"):
        tc.load_state(path)


@pytest.mark.parametrize("entry, what", [
    ([1, 2], "its header entry is a list"),
    ({"shape": [2], "data_offsets": [0, 8]}, "malformed dtype null"),
    ({"dtype": 7, "shape": [2], "data_offsets": [0, 8]}, "malformed dtype 7"),
    ({"dtype": "F32", "shape": "x", "data_offsets": [0, 8]}, 'malformed shape "x"'),
    ({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}, "malformed shape"),
    ({"dtype": "F32", "shape": [2], "data_offsets": ["a", 8]}, "malformed data_offsets"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [0]}, "malformed data_offsets"),
])
def test_a_malformed_header_entry_names_the_key_and_field(tmp_path, entry, what):
    path = write(tmp_path / "bad.safetensors", {"w": entry}, b"\0" * 8)
    with pytest.raises(tc.CheckpointError, match=f"{path}: tensor 'w': {what}"):
        tc.load_state(path)


def test_metadata_that_is_not_names_to_strings_is_a_checkpoint_error(tmp_path):
    path = write(tmp_path / "meta.safetensors", {"__metadata__": [1]})
    with pytest.raises(tc.CheckpointError, match="its __metadata__ must map names to strings"):
        tc.tensors.checkpoint.load_metadata(path)
