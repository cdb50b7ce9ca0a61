"""Checkpoints: state dicts (name -> tensor) in safetensors files, and the check that a
loaded state fits what a model expects.

Files are written and read with the `safetensors` package's NumPy API: no pickle, so
loading a file never runs code from it.  A file written here loads in PyTorch with
`safetensors.torch.load_file`, and one PyTorch wrote with `save_file` loads here.
"""
from __future__ import annotations

import contextlib
import json
import os
import struct
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from ..core import dtypes as dt
from ..core.errors import ArgumentError, DTypeError, TracecompError
from .tensor import Tensor, as_tensor


class CheckpointError(TracecompError, ValueError):
    """A checkpoint file cannot be read or written, or its state does not fit (names the file)."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The checkpoint file does not exist."""


# ------------------------------------------------------------------ saving
def save(state_dict: Mapping[str, Any], path, metadata: Mapping[str, str] | None = None) -> None:
    """Write `state_dict` (name -> tc.Tensor, NumPy array, or any DLPack/array-like value)
    to `path` as a safetensors file, with `metadata` (str -> str) in its header.

    Values are converted as `tc.tensor` converts them, so the file holds tracecomp's
    dtypes (float32, float64, int32, int64, bool, bfloat16 as BF16, float16 as F16).
    Traced tensors have no values yet and are refused.  The file is written next to its
    final name and renamed into place, so a failed save leaves an older file intact."""
    path = os.fspath(path)
    if not isinstance(state_dict, Mapping):
        raise ArgumentError(f"tc.save: state_dict must be a mapping from names to tensors, got "
                            f"{type(state_dict).__name__} (saving to {path})")
    arrays = {key: _concrete_array(key, value, path) for key, value in state_dict.items()}
    header_metadata = _checked_metadata(metadata, path)
    from safetensors import SafetensorError
    from safetensors.numpy import save_file

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CheckpointError(f"tc.save: cannot write {path}: the folder {folder} does not exist")
    partial = f"{path}.{os.getpid()}.partial"
    try:
        save_file(arrays, partial, metadata=header_metadata)
        os.replace(partial, path)
    except (OSError, SafetensorError) as e:
        raise CheckpointError(f"tc.save: cannot write {path}: {getattr(e, 'strerror', None) or e}") from None
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _concrete_array(key, value, path: str) -> np.ndarray:
    if not isinstance(key, str):
        raise ArgumentError(f"tc.save: the keys of a state dict must be str, got {type(key).__name__} "
                            f"{key!r} (saving to {path})")
    if key == "__metadata__":       # the safetensors header keeps this name for the metadata
        raise ArgumentError(f"tc.save: '__metadata__' cannot name a tensor in a safetensors file "
                            f"(saving to {path}); pass metadata= for text")
    try:
        tensor = as_tensor(value)
    except (TypeError, ValueError) as e:
        raise ArgumentError(f"tc.save: state_dict['{key}'] is a {type(value).__name__}, not a "
                            f"tensor or array ({e}) (saving to {path})") from None
    array = tensor._concrete(f"tc.save of state_dict['{key}'] to {path}")
    # safetensors copies nbytes from the data pointer: a strided view would be saved scrambled
    return array if array.flags.c_contiguous else array.copy(order="C")


def _checked_metadata(metadata, path: str) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ArgumentError(f"tc.save: metadata must map str to str (safetensors stores text only), "
                            f"got {metadata!r} (saving to {path})")
    return dict(metadata)


# ------------------------------------------------------------------ loading
_HEADER_LIMIT = 100 * 1024 * 1024    # safetensors' own limit on the JSON header


class LoadedState(dict):
    """load_state's result: a dict that remembers its file, so that a model's
    load_state_dict names the file in its errors."""
    source: str = ""


def load_state(path) -> dict[str, Tensor]:
    """Read a safetensors file into a dict name -> tc.Tensor, in the order the tensors'
    data lies in the file (safetensors does not keep the order they were saved in).

    BF16 and F16 load as tc.bfloat16 and tc.float16.  Integer dtypes tracecomp lacks are
    widened when every value survives, by the rule of `tc.tensor` (dtypes.from_numpy):
    int8, int16, uint8, uint16 become int32;
    uint32 becomes int64.  uint64, float8, complex and other dtypes raise a DTypeError
    naming the file, the key and the dtype.  A missing file raises
    CheckpointNotFoundError; a truncated or corrupt one, or one that is not a regular file
    (a FIFO, a device: refused without waiting on it), CheckpointError, both naming it.
    The file is opened once and every read goes through that descriptor, so the file
    checked is the file read even if the name is replaced meanwhile."""
    path = os.fspath(path)
    from safetensors import SafetensorError, safe_open

    from ..core.safe_files import descriptor_path

    with contextlib.ExitStack() as stack:
        fd, size = _open(stack, path)
        header, data_start = _read_header(path, fd, size)
        try:
            with safe_open(descriptor_path(fd, path), framework="np") as f:
                state = LoadedState((key, _to_tensor(f, key, header[key], fd, data_start, path))
                                    for key in _file_order(header))
        except SafetensorError as e:         # header checks passed, but the rest did not
            raise CheckpointError(f"{path}: not a valid safetensors file ({e})") from None
    state.source = path
    return state


def load_metadata(path) -> dict[str, str]:
    """The text metadata in a safetensors file's header ({} when it has none)."""
    path = os.fspath(path)
    with contextlib.ExitStack() as stack:
        header, _ = _read_header(path, *_open(stack, path))
    return dict(header.get("__metadata__") or {})


def _open(stack: contextlib.ExitStack, path: str) -> tuple[int, int]:
    """(descriptor, size) of the checkpoint at `path`, closed with `stack`: a regular file
    (symlinks followed: model hubs keep checkpoints as links to blobs), through the one
    reader of user files (runtime/safe_files.py)."""
    from ..core.safe_files import opened_regular
    if os.path.isdir(path):
        raise CheckpointError(f"{path} is a directory, not a safetensors file")
    try:
        fd, st = stack.enter_context(opened_regular(path, follow_links=True))
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"checkpoint file not found: {path}") from None
    except OSError as e:                   # safe_files.UnsafeFile among them
        raise CheckpointError(f"cannot read {path}: {e.strerror or e}") from None
    return fd, st.st_size


def _read_header(path: str, fd: int, size: int) -> tuple[dict, int]:
    """The file's JSON header and where its tensor data starts, after checks that say
    plainly what is wrong with a file safetensors would refuse (its own words are terser)."""
    from ..core.safe_files import read_all
    try:
        prefix = read_all(fd, 8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path}: not a safetensors file: {size} bytes, too short for "
                                  "the 8-byte header length it starts with")
        (header_length,) = struct.unpack("<Q", prefix)
        if header_length > _HEADER_LIMIT:
            raise CheckpointError(f"{path}: not a safetensors file: its first 8 bytes give a header "
                                  f"of {header_length} bytes, more than the 100 MiB limit")
        if 8 + header_length > size:
            raise CheckpointError(f"{path}: truncated or corrupt: the header should be {header_length} "
                                  f"bytes, but the file has only {size - 8} after the length")
        text = read_all(fd, header_length, 8)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a safetensors file: its header is not JSON ({e})") from None
    except RecursionError:             # Python's parser recurses per level: refuse, do not crash
        raise CheckpointError(f"{path}: not a safetensors file: its header nests JSON arrays or "
                              "objects too deeply to parse (a safetensors header is three levels deep)") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a safetensors file: its header is not a JSON object")
    _check_entries(header, path)
    _check_data_size(header, path, size - 8 - header_length)
    return header, 8 + header_length


# safetensors dtypes that tracecomp holds, as they are or widened (load_state's docstring);
# U64 and C64 reach NumPy and are refused there with a reason of their own.
_READABLE_DTYPES = {"BOOL", "U8", "I8", "U16", "I16", "F16", "BF16", "U32", "I32", "F32", "I64", "F64",
                    "U64", "C64"}


def _check_entries(header: dict, path: str) -> None:
    """Every entry has the form safetensors gives it, and a dtype tracecomp can read: a
    DTypeError names the key and a dtype NumPy lacks (float8, float4, ...), a
    CheckpointError the key and field that is malformed, before safetensors or NumPy
    sees them (their own errors were an AttributeError or a terse parse error)."""
    metadata = header.get("__metadata__", {})
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise CheckpointError(f"{path}: not a valid safetensors file: its __metadata__ must map "
                              f"names to strings, got {json.dumps(metadata)[:80]}")
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise CheckpointError(f"{path}: tensor '{key}': its header entry is a "
                                  f"{type(entry).__name__}, not an object with dtype, shape and data_offsets")
        for field, ok in (("dtype", isinstance(entry.get("dtype"), str)),
                          ("shape", _ints(entry.get("shape"))),
                          ("data_offsets", _ints(entry.get("data_offsets")) and len(entry["data_offsets"]) == 2)):
            if not ok:
                raise CheckpointError(f"{path}: tensor '{key}': malformed {field} "
                                      f"{json.dumps(entry.get(field))[:80]} in the header")
        if entry["dtype"] not in _READABLE_DTYPES:
            narrow = entry["dtype"].startswith(("F4", "F6_", "F8_"))     # safetensors' sub-byte and 8-bit floats
            raise _unsupported(path, key, entry["dtype"],
                               "NumPy has no such dtype" if narrow else "not a dtype safetensors defines")


def _ints(value: Any) -> bool:
    """A JSON list of non-negative integers."""
    return isinstance(value, list) and all(type(n) is int and n >= 0 for n in value)


def _check_data_size(header: dict, path: str, data_bytes: int) -> None:
    try:
        end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"),
                  default=0)
    except (TypeError, KeyError, IndexError):
        raise CheckpointError(f"{path}: not a valid safetensors file: a header entry has no "
                              "data_offsets") from None
    if isinstance(end, int) and end > data_bytes:
        raise CheckpointError(f"{path}: truncated: the header describes {end} bytes of tensor data, "
                              f"the file holds {data_bytes}")


def _file_order(header: dict) -> list[str]:
    keys = [key for key in header if key != "__metadata__"]
    return sorted(keys, key=lambda key: header[key]["data_offsets"][0])   # stable: ties keep the header's order


def _to_tensor(f, key: str, entry: dict, fd: int, data_start: int, path: str) -> Tensor:
    file_dtype = entry["dtype"]
    if file_dtype == "BF16":             # older safetensors.numpy lacks bfloat16: read its bits
        array = _bfloat16(fd, data_start, entry)
    else:
        try:
            array = f.get_tensor(key)
        except (TypeError, KeyError, ValueError):   # a dtype NumPy or safetensors.numpy lacks
            raise _unsupported(path, key, file_dtype, "NumPy has no such dtype") from None
    try:
        return Tensor.from_numpy(array)
    except DTypeError as e:
        raise _unsupported(path, key, file_dtype, str(e)) from None


def _bfloat16(fd: int, data_start: int, entry: dict) -> np.ndarray:
    """The entry's little-endian bits as ml_dtypes' bfloat16.  (safe_open has checked the
    entry's offsets and shape against the file by now.)"""
    from ..core.safe_files import read_all
    begin, end = entry["data_offsets"]
    bits = np.frombuffer(read_all(fd, end - begin, data_start + begin), dtype="<u2")
    return bits.astype(np.uint16).view(dt.BFLOAT16.np).reshape(entry["shape"])


def _unsupported(path: str, key: str, file_dtype: str, why: str) -> DTypeError:
    return DTypeError(f"{path}: tensor '{key}' has dtype {file_dtype}, which tracecomp cannot hold "
                      f"({why}); tracecomp has {dt.NAMES}")


# ------------------------------------------------------------------ checking a loaded state
class StateKeys(NamedTuple):
    """The keys that did not match, as `torch.nn.Module.load_state_dict` returns them."""
    missing_keys: list[str]
    unexpected_keys: list[str]


def check_state(expected: Mapping[str, tuple], loaded: Mapping[str, Any], path=None,
                strict: bool = True) -> StateKeys:
    """Check `loaded` (name -> tensor or array) against `expected` (name -> (shape, dtype)).

    Raises one CheckpointError listing every problem: the expected keys `loaded` lacks and
    the keys it has that nobody expects (both only when `strict`), then each key whose
    shape or dtype differs, with both.  Mis-shaped keys raise whatever `strict` says, as
    in PyTorch.  Returns the missing and unexpected keys (both empty if it returns when `strict`)."""
    missing = [key for key in expected if key not in loaded]
    unexpected = [key for key in loaded if key not in expected]
    problems = []
    if strict and missing:
        problems.append("missing keys (expected, not in the file): " + _quoted(missing))
    if strict and unexpected:
        problems.append("unexpected keys (in the file, not expected): " + _quoted(unexpected))
    for key, (shape, dtype) in expected.items():
        if key not in loaded:
            continue
        want = (tuple(int(d) for d in shape), dt.to_dtype(dtype).label)
        have = (tuple(int(d) for d in loaded[key].shape), _dtype_label(loaded[key].dtype))
        if have != want:
            problems.append(f"'{key}': the file has shape {have[0]} {have[1]}, expected shape "
                            f"{want[0]} {want[1]}")
    if problems:
        source = f"from {os.fspath(path)}" if path is not None else "(no file named)"
        raise CheckpointError(f"cannot load the state {source}:\n  " + "\n  ".join(problems))
    return StateKeys(missing, unexpected)


def _quoted(keys: list[str]) -> str:
    return ", ".join(f"'{key}'" for key in keys)


def _dtype_label(dtype) -> str:
    return dtype.label if isinstance(dtype, dt.DType) else str(np.dtype(dtype))
