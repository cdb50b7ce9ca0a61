"""Issue 33, items 4, 6, 7, 8 (first leak) and 9 (foreign metadata, checksum files):
libraries and user files handled as shared, foreign and hostile.

Anything that could crash or hang runs in a child process under a timeout: the export
over a loaded library, the threads racing on one library under two names, data symbols
where functions belong, FIFOs where files belong, the reload leak."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest

import tracecomp as tc

CC = os.environ.get("CC", "cc")
pytestmark = pytest.mark.skipif(shutil.which(CC) is None, reason="tc.export needs a C compiler to link")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_child(script: str, *args, env=None, timeout=120) -> subprocess.CompletedProcess:
    """Run `script` in a fresh interpreter that imports this checkout's tracecomp."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the child hung for {timeout} s; its output so far: {e.stdout!r} {e.stderr!r}")


def finished(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, f"the child died ({r.returncode}): {r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("lib") / "libdbl.so")
    tc.export(lambda x: x * 2.0 + 1.0, [np.arange(4, dtype=np.float32)], path)
    return path


# ------------------------------------------------------------------ 4: export never rewrites in place

OVERWRITE = """
    import sys
    import numpy as np
    import tracecomp as tc
    path = sys.argv[1]
    x = np.arange(4, dtype=np.float32)
    tc.export(lambda x: x * 2.0, [x], path)
    old = tc.load(path)
    before = old(x).numpy().tolist()
    tc.export(lambda x: x * 3.0 + 100.0, [x], path)
    print("old", old(x).numpy().tolist() == before, "new", tc.load(path)(x).numpy().tolist())
"""


def test_export_over_a_loaded_library_on_another_file_system(tmp_path):
    """The temporary folder (TMPDIR) and the library's folder on different file systems:
    the old handle keeps the old code and the process exits cleanly (it used to run the new
    code and die with SIGSEGV at exit)."""
    shm = "/dev/shm"
    if not os.path.isdir(shm) or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm to put the library on another file system")
    folder = tempfile.mkdtemp(prefix="tc_hostile_", dir=shm)
    try:
        if os.stat(folder).st_dev == os.stat(tmp_path).st_dev:
            pytest.skip(f"{folder} and {tmp_path} are on one file system here")
        for lib_folder, temp in ((folder, tmp_path), (tmp_path, folder)):
            out = finished(run_child(OVERWRITE, os.path.join(lib_folder, "libover.so"),
                                     env=dict(os.environ, TMPDIR=str(temp))))
            assert "old True new [100.0, 103.0, 106.0, 109.0]" in out, out
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_export_replaces_the_file_and_leaves_no_temporaries(tmp_path):
    path = str(tmp_path / "libswap.so")
    x = np.arange(4, dtype=np.float32)
    tc.export(lambda x: x * 2.0, [x], path)
    with open(path, "rb") as old:
        old_bytes = open(path, "rb").read()
        inode = os.fstat(old.fileno()).st_ino
        tc.export(lambda x: x - 7.0, [x], path)
        assert old.read() == old_bytes          # the old file itself was not written into
    assert os.stat(path).st_ino != inode
    assert sorted(os.listdir(tmp_path)) == ["libswap.h", "libswap.so", "libswap.so.sha256"]
    np.testing.assert_array_equal(tc.load(path)(x).numpy(), x - 7)


def test_export_onto_a_directory_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "libdir.so").mkdir()
    with pytest.raises(tc.TracecompError, match="libdir.so: it is a directory"):
        tc.export(lambda x: x * 2.0, [np.arange(4, dtype=np.float32)], str(tmp_path / "libdir.so"))
    assert sorted(os.listdir(tmp_path)) == ["libdir.so"]


LOAD_WHILE_EXPORTING = """
    import sys, threading
    import numpy as np
    import tracecomp as tc
    path = sys.argv[1]
    x = np.arange(4, dtype=np.float32)
    tc.export(lambda x: x + 1.0, [x], path)
    done = threading.Event()
    def exporter():
        for i in range(6):
            tc.export((lambda x: x + 1.0) if i % 2 else (lambda x: x + 2.0), [x], path)
        done.set()
    threading.Thread(target=exporter).start()
    seen = set()
    while not done.is_set():
        seen.add(float(tc.load(path)(x).numpy()[0]))
    print("seen", sorted(seen))
"""


def test_loads_during_exports_see_one_version_or_the_other(tmp_path):
    """The checksum is renamed before the library, and a mismatch is read again: a reader
    never fails and never gets a mix."""
    out = finished(run_child(LOAD_WHILE_EXPORTING, tmp_path / "libbusy.so"))
    assert set(json.loads(out.split("seen", 1)[1])) <= {1.0, 2.0}


# ------------------------------------------------------------------ 6: one lock per library, not per name

RACE = """
    import sys, threading
    import numpy as np
    import tracecomp as tc
    names = sys.argv[1:]
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    inputs = [rng.standard_normal((256, 64)).astype(np.float32) for _ in names]
    expect = [np.tanh(np.tanh(a @ w) @ w).sum(axis=1) for a in inputs]
    functions = [tc.load(n, name="race") for n in names]
    wrong = [0] * len(names)
    def worker(i):
        for _ in range(400):
            out = functions[i](inputs[i], w).numpy()
            wrong[i] += not np.allclose(out, expect[i], rtol=1e-3, atol=1e-3)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(names))]
    for t in threads: t.start()
    for t in threads: t.join()
    print("wrong", sum(wrong), "of", 400 * len(names))
"""


def test_one_library_under_three_names_shares_one_lock(tmp_path):
    """A hard link and a symlink are the same library (dlopen maps it once, with one static
    workspace): calls through all three names must not run at once (20-85 of 600 results
    were wrong with one lock per path)."""
    path = str(tmp_path / "librace.so")
    tc.export(lambda a, w: (a @ w).tanh().matmul(w).tanh().sum(dim=1),
              [np.zeros((256, 64), np.float32), np.zeros((64, 64), np.float32)], path)
    os.link(path, tmp_path / "libhard.so")
    os.symlink(path, tmp_path / "libsoft.so")
    out = finished(run_child(RACE, path, tmp_path / "libhard.so", tmp_path / "libsoft.so", timeout=300))
    assert "wrong 0 of 1200" in out, out


# ------------------------------------------------------------------ 7: symbols type-checked before calls

def build_foreign(tmp_path, source: str, name: str = "libforeign.so") -> str:
    """A shared library compiled with cc from C `source` (not by tc.export)."""
    c_file = tmp_path / "foreign.c"
    c_file.write_text(textwrap.dedent(source))
    path = str(tmp_path / name)
    r = subprocess.run([CC, "-shared", "-fPIC", "-o", path, str(c_file)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cc cannot build a shared library here: {r.stderr}")
    return path


METADATA = json.dumps({"format": 1, "target": {"cpu": "generic", "features": ""},
                       "inputs": [{"dtype": "float32", "shape": [4]}],
                       "outputs": [{"dtype": "float32", "shape": [4]}], "sizes": []})
GOOD = {
    "metadata": 'const char* foreign_metadata(void) { return "%s"; }',
    "entry": "int foreign(const void* const* in, void* const* out) { return 0; }",
    "error_string": 'const char* foreign_error_string(int c) { return "none"; }',
}
DATA = {
    "metadata": 'const char foreign_metadata[] = "%s";',
    "entry": "const char foreign[] = {0xff, 0xff, 0xff, 0xff};",
    "error_string": 'const char foreign_error_string[] = "none";',
}

LOAD_AND_CALL = """
    import sys
    import numpy as np
    import tracecomp as tc
    try:
        f = tc.load(sys.argv[1], name="foreign")
        print("loaded", np.asarray(f(np.zeros(4, np.float32))).shape)
    except tc.TracecompError as e:
        print(type(e).__name__, e)
"""


def foreign_source(data_symbol=None, metadata=METADATA) -> str:
    parts = dict(GOOD)
    if data_symbol:
        parts[data_symbol] = DATA[data_symbol]
    escaped = metadata.replace("\\", "\\\\").replace('"', '\\"')
    return "\n".join(p.replace("%s", escaped) if "%s" in p else p for p in parts.values())


def test_a_well_formed_foreign_library_loads(tmp_path):
    """The control for the cases below: the hand-made library is acceptable as it is."""
    out = finished(run_child(LOAD_AND_CALL, build_foreign(tmp_path, foreign_source())))
    assert out.startswith("loaded (4,)"), out


@pytest.mark.parametrize("symbol", ["metadata", "entry", "error_string"])
def test_a_data_symbol_where_a_function_belongs_is_refused(tmp_path, symbol):
    """`const char foreign_metadata[]` used to be called: SIGSEGV."""
    path = build_foreign(tmp_path, foreign_source(symbol))
    out = finished(run_child(LOAD_AND_CALL, path))
    name = "foreign" if symbol == "entry" else f"foreign_{symbol}"
    assert out.startswith("BackendError") and f"'{name}' is a data (object) symbol, not a function" in out, out
    assert path in out


def test_a_data_error_index_is_refused_when_the_metadata_lists_index_checks(tmp_path):
    """A failed computed-index check calls NAME_error_index: it must be a function too."""
    metadata = json.dumps(dict(json.loads(METADATA), computed_index_checks=[{"code": 3000}]))
    source = foreign_source(metadata=metadata) + '\nconst long foreign_error_index[] = {0};'
    out = finished(run_child(LOAD_AND_CALL, build_foreign(tmp_path, source)))
    assert out.startswith("BackendError") and "'foreign_error_index' is a data (object) symbol" in out, out


# ------------------------------------------------------------------ 9: malformed metadata in a foreign library

def metadata_with(**changes) -> str:
    md = json.loads(METADATA)
    md.update(changes)
    return json.dumps(md)


@pytest.mark.parametrize("metadata, message", [
    ("[1, 2]", "metadata must be a JSON object"),
    (json.dumps({"format": 1}), "metadata has no 'target'"),
    (metadata_with(sizes=3), "metadata['sizes'] must be a JSON array"),
    (metadata_with(computed_index_checks=[{"code": "3000"}]), "must be an object with an int 'code'"),
    (metadata_with(target="x86"), "metadata['target'] must be a JSON object"),
    (metadata_with(target={"cpu": "x"}), "metadata['target'] has no 'features'"),
    (metadata_with(target={"cpu": 1, "features": ""}), "metadata['target']['cpu'] must be a JSON string"),
    (metadata_with(inputs="abc"), "metadata['inputs'] must be a JSON array"),
    (metadata_with(inputs=[7]), "metadata['inputs'][0] must be a JSON object"),
    (metadata_with(inputs=[{"shape": [4]}]), "metadata['inputs'][0] has no 'dtype'"),
    (metadata_with(inputs=[{"dtype": "object", "shape": [4]}]), "metadata['inputs'][0]['dtype'] must be one of"),
    (metadata_with(inputs=[{"dtype": "float32", "shape": 4}]), "metadata['inputs'][0]['shape'] must be a JSON array"),
    (metadata_with(inputs=[{"dtype": "float32", "shape": [-4]}]), "must not be negative"),
    (metadata_with(inputs=[{"dtype": "float32", "shape": [[4]]}]), "must be an int or a size expression"),
    (metadata_with(outputs=[{"dtype": "float32", "shape": ["n"]}]), "uses the size 'n', which no earlier input dim binds"),
    (metadata_with(sizes=["batch"]), "metadata['sizes'][0] must name a size"),
    (metadata_with(output_structure={"tuple": ["*", "*"]}), "has 2 tensor leaves for 1 outputs"),
    (metadata_with(output_structure={"set": ["*"]}), "must be tuple, list, dict or static"),
    (metadata_with(output_structure={"dict": [[1, "*"]]}), "must be a [string key, structure] pair"),
    (metadata_with(format=2), "has metadata format 2; tracecomp"),
])
def test_malformed_metadata_names_the_library_and_the_field(tmp_path, metadata, message):
    """A foreign library's metadata of the wrong shape used to end in a raw AttributeError
    or KeyError (in tc.load or at the first call)."""
    path = build_foreign(tmp_path, foreign_source(metadata=metadata))
    out = finished(run_child(LOAD_AND_CALL, path))
    assert out.startswith("BackendError") and path in out and message in out, out


@pytest.mark.parametrize("body", ["return 0;", 'return "\\xff\\xfe";', 'return "{not json";'])
def test_metadata_that_is_not_json_text(tmp_path, body):
    source = foreign_source().replace(GOOD["metadata"].split("{")[0],
                                      f"const char* foreign_metadata(void) {{ {body} }}\n//")
    out = finished(run_child(LOAD_AND_CALL, build_foreign(tmp_path, source)))
    assert out.startswith("BackendError") and ("returned NULL" in out or "unreadable metadata" in out), out


# ------------------------------------------------------------------ 7: FIFOs and devices refused without waiting

READER = """
    import sys
    import tracecomp as tc
    from tracecomp.core import safe_files
    from tracecomp.runtime import cache_auth
    which, path = sys.argv[1], sys.argv[2]
    def from_npy():
        from tracecomp.dask import arrays
        return arrays.from_npy(path, rows=4)
    readers = {
        "load": lambda: tc.load(path),
        "load_state": lambda: tc.load_state(path),
        "load_metadata": lambda: tc.tensors.checkpoint.load_metadata(path),
        "cache_reader": lambda: safe_files.read_regular(path, 1 << 20, private=True),
        "dask_from_npy": from_npy,
    }
    try:
        readers[which]()
        print("read it")
    except (tc.TracecompError, OSError) as e:
        print(type(e).__name__, e)
"""


def fifo(tmp_path, name="pipe"):
    path = tmp_path / name
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize("which", ["load", "load_state", "load_metadata", "cache_reader",
                                   "dask_from_npy"])
@pytest.mark.parametrize("kind", ["fifo", "device", "link to a device"])
def test_readers_refuse_fifos_and_devices_without_waiting(tmp_path, which, kind):
    """tc.load_state on a FIFO used to wait forever for a writer."""
    if kind == "fifo":
        path = fifo(tmp_path, "libpipe.so")
    elif kind == "device":
        path = "/dev/zero"
    else:
        path = str(tmp_path / "libzero.so")
        os.symlink("/dev/zero", path)
    out = finished(run_child(READER, which, path, timeout=60))
    assert "not a regular file" in out or "symbolic link" in out, out
    assert path in out


TUNING = """
    import sys
    from pathlib import Path
    from tracecomp.runtime import tuning
    print("record", tuning.load_record(Path(sys.argv[1])))
"""


def test_a_fifo_in_place_of_the_tuning_record_is_no_record(tmp_path):
    """The host's tuning record lies beside the compile cache: a FIFO there is no record
    (the choices are measured again), not a wait at every process's first compile."""
    from tracecomp.runtime import tuning
    record = tuning.record_path(tmp_path)
    record.parent.mkdir(parents=True)
    os.mkfifo(record)
    assert "record None" in finished(run_child(TUNING, tmp_path, timeout=60))


def test_a_fifo_in_place_of_the_checksum_is_refused(library, tmp_path):
    path = str(tmp_path / "libdbl.so")
    shutil.copy(library, path)
    os.mkfifo(path + ".sha256")
    out = finished(run_child(READER, "load", path, timeout=60))
    assert out.startswith("BackendError") and "checksum file" in out and "not a regular file" in out, out


def test_a_checkpoint_through_a_symlink_still_loads(tmp_path):
    """Model hubs keep checkpoints as links to blobs: the checkpoint reader follows links."""
    tc.save({"w": np.arange(3, dtype=np.float32)}, tmp_path / "blob")
    os.symlink(tmp_path / "blob", tmp_path / "model.safetensors")
    np.testing.assert_array_equal(tc.load_state(tmp_path / "model.safetensors")["w"].numpy(), [0, 1, 2])


# ------------------------------------------------------------------ 9: a checksum file present must be valid

@pytest.mark.parametrize("text, message", [(b"", "is empty"), (b"\n \n", "is empty"),
                                           (b"garbage  libdbl.so\n", "does not start with a sha256"),
                                           (b"ab" * 31 + b"  libdbl.so\n", "does not start with a sha256"),
                                           (b"zz" * 32 + b"  libdbl.so\n", "does not start with a sha256")])
def test_an_empty_or_garbage_checksum_file_is_refused(library, tmp_path, text, message):
    """Such files used to count as absent: the library loaded unchecked."""
    path = str(tmp_path / "libdbl.so")
    shutil.copy(library, path)
    with open(path + ".sha256", "wb") as f:
        f.write(text)
    out = finished(run_child(READER, "load", path))
    assert out.startswith("BackendError") and path + ".sha256" in out and message in out, out


def test_the_checksum_of_a_symlinked_library_is_the_one_beside_the_file(library, tmp_path):
    os.symlink(library, tmp_path / "libdbl.so")
    loaded = tc.load(str(tmp_path / "libdbl.so"))
    assert loaded.sha256 == open(library + ".sha256").read().split()[0]


# ------------------------------------------------------------------ 8: private copies released

RELOADS = """
    import gc, os, sys
    import numpy as np
    import tracecomp as tc
    path = sys.argv[1]
    x = np.arange(4, dtype=np.float32)
    def mapped_copies():
        return {line.split()[4] for line in open("/proc/self/maps") if "libleak.so" in line}
    counts = []
    for i in range(12):
        tc.export((lambda x: x * 2.0) if i % 2 else (lambda x: x * 3.0), [x], path)
        f = tc.load(path)
        assert f(x).numpy()[1] == (2.0 if i % 2 else 3.0)
        del f
        gc.collect()
        counts.append(len(mapped_copies()))
    print("mapped", counts)
    print("left", os.listdir(os.environ["TMPDIR"]))
"""


def test_reloads_release_their_private_copies(tmp_path):
    """Each reload of a replaced library used to keep its private copy mapped and on disk
    for the life of the process (about 1.9 MiB each for a model's library)."""
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("no /proc/self/maps to count mappings")
    temp = tmp_path / "tmp"
    temp.mkdir()
    out = finished(run_child(RELOADS, tmp_path / "libleak.so", env=dict(os.environ, TMPDIR=str(temp))))
    assert "mapped [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]" in out and "left []" in out, out


KEEP_TWO = """
    import sys
    import numpy as np
    import tracecomp as tc
    path = sys.argv[1]
    x = np.arange(4, dtype=np.float32)
    tc.export(lambda x: x * 2.0, [x], path)
    a, b = tc.load(path), tc.load(path)
    print("shared", a._lock is b._lock, a._mapping is b._mapping)
    del a
    print("b still works", b(x).numpy().tolist())
"""


def test_loads_of_the_same_bytes_share_one_mapping_that_outlives_a_dropped_handle(tmp_path):
    out = finished(run_child(KEEP_TWO, tmp_path / "libtwo.so"))
    assert "shared True True" in out and "b still works [0.0, 2.0, 4.0, 6.0]" in out, out


RELEASE_WHILE_THREADS_CALL = """
    import gc, sys, threading
    import numpy as np
    import tracecomp as tc
    paths = sys.argv[1:]
    x = np.arange(10, dtype=np.float32)
    for k, path in enumerate(paths):
        tc.export(lambda x, i, k=k: x[i + 1] * (k + 2.0), [x, np.int64(0)], path, name="idx")
    wrong = 0
    for r in range(20):
        f = tc.load(paths[r % 2], name="idx")
        def work(f=f, k=r % 2):
            global wrong
            for j in range(20):
                wrong += float(np.asarray(f(x, np.int64(j % 8)))) != (j % 8 + 1) * (k + 2.0)
                try:
                    f(x, np.int64(9))           # a failed index check: its thread-local index
                except tc.TracecompError:
                    pass
        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads: t.start()
        for t in threads: t.join()
        del f, threads, work
        gc.collect()                            # the library is dlclosed here
    print("wrong", wrong)
"""


def test_libraries_released_and_loaded_again_while_threads_called_them(tmp_path):
    """dlclose once the last function goes: safe after threaded calls (libgomp's threads,
    the thread-local error index), and a library loaded again works."""
    out = finished(run_child(RELEASE_WHILE_THREADS_CALL, tmp_path / "liba.so", tmp_path / "libb.so"))
    assert "wrong 0" in out, out


def test_a_copy_folder_left_by_a_killed_process_is_removed(library, tmp_path):
    """A process killed between writing its private copy and dlopen leaves a folder; the
    next load in this user's next process removes it (its pid is gone, it is old)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = temp / f"tracecomp-load-{dead.pid}-0-abcdef"
    left.mkdir()
    (left / "libdbl.so").write_bytes(b"partial copy")
    alive = temp / f"tracecomp-load-{os.getpid()}-0-abcdef"       # this process: kept
    alive.mkdir()
    old = time.time() - 3600
    for folder in (left, alive):
        os.utime(folder, (old, old))
    out = finished(run_child(READER, "load", library, env=dict(os.environ, TMPDIR=str(temp))))
    assert out.startswith("read it"), out
    assert sorted(os.listdir(temp)) == [alive.name]


def test_a_temporary_folder_that_cannot_map_code_falls_back_to_the_library_folder(
        library, tmp_path, monkeypatch):
    """A temporary folder mounted noexec: dlopen there fails to map the code, so the
    private copy is made beside the library instead (and removed there too)."""
    import ctypes
    from tracecomp.runtime import private_copies
    noexec, beside = tmp_path / "noexec", tmp_path / "lib"
    noexec.mkdir()
    beside.mkdir()
    shutil.copy(library, beside / "libdbl.so")
    real_cdll = ctypes.CDLL

    def cdll(name, *args, **kwargs):
        if str(name).startswith(str(noexec)):
            raise OSError(f"{name}: failed to map segment from shared object")
        return real_cdll(name, *args, **kwargs)
    monkeypatch.setattr(private_copies.tempfile, "gettempdir", lambda: str(noexec))
    monkeypatch.setattr(private_copies.ctypes, "CDLL", cdll)
    monkeypatch.setattr(private_copies, "_mapped", type(private_copies._mapped)())
    f = tc.load(str(beside / "libdbl.so"))
    np.testing.assert_array_equal(f(np.arange(4, dtype=np.float32)).numpy(), [1, 3, 5, 7])
    assert os.listdir(noexec) == [] and sorted(os.listdir(beside)) == ["libdbl.so"]
