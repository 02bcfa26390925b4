"""The C example extension (examples/c-api), fed numpy, torch and Arrow arrays, its arrays fed to
numpy and torch: what a C extension built on the dlpack package's header sees."""

import gc
import re
import subprocess
import sys

import dlpack_c_example as c
import dlpack_example as rust_example
import numpy as np
import pyarrow as pa
import pytest
import torch

import dlpack


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(1000, dtype=np.float64),
        lambda: np.arange(24.0).reshape(4, 6)[::-2, 1::2],  # strided, reversed: a copy
        lambda: np.arange(6, dtype=">f8"),  # swapped: a copy in native order
        lambda: torch.arange(1000, dtype=torch.float64),
        lambda: torch.arange(12, dtype=torch.float64).reshape(3, 4).T,
        lambda: pa.array([1.5, 2.5, 4.0]),
        lambda: pa.table({"x": [1.5, 2.5, 4.0]})["x"],  # a table's column (one chunk)
        lambda: pa.chunked_array([[1.5, 2.5], [4.0]]),  # chunks joined: read from the copy
        lambda: dlpack.asdlpack(np.ones(3)),
    ],
    ids=[
        "numpy",
        "numpy-strided",
        "numpy-swapped",
        "torch",
        "torch-transposed",
        "arrow-array",
        "arrow-column",
        "arrow-chunked",
        "DLPackObject",
    ],
)
def test_total_sums_every_kind_of_float64_array(make):
    source = make()
    expected = np.asarray(source).sum()  # what the library itself hands numpy
    assert c.total(source) == pytest.approx(expected, rel=1e-15)


def test_total_names_what_it_can_not_read():
    with pytest.raises(TypeError, match="expected an array of float64, got one of DLPack type "):
        c.total(np.arange(3, dtype=np.float32))
    with pytest.raises(TypeError, match="__dlpack__"):
        c.total(object())


def test_fill_writes_in_place_in_any_layout():
    a = np.zeros((3, 4))
    c.fill(a, 2.0)
    np.testing.assert_array_equal(a, np.full((3, 4), 2.0))
    c.fill(a[::2, ::-3], 7.0)  # strided: written through copy_from
    expected = np.full((3, 4), 2.0)
    expected[::2, ::-3] = 7.0
    np.testing.assert_array_equal(a, expected)
    t = torch.zeros(5, dtype=torch.float64)
    c.fill(t, 1.5)
    assert t.tolist() == [1.5] * 5


def test_fill_refuses_what_a_write_would_not_reach():
    """Read-only memory, and memory an import had to copy (a chunked Arrow array: its chunks
    joined into new memory), are refused with a BufferError, the latter naming why it is a
    copy as the object's copy_reason does; nothing is written."""
    read_only = np.zeros(3)
    read_only.flags.writeable = False
    with pytest.raises(BufferError, match="read-only"):
        c.fill(read_only, 1.0)
    chunked = pa.chunked_array([[1.0, 2.0], [3.0]])
    reason = dlpack.asdlpack(chunked).copy_reason
    assert reason
    with pytest.raises(BufferError, match=re.escape(reason)):
        c.fill(chunked, 9.0)
    assert chunked.to_pylist() == [1.0, 2.0, 3.0]
    assert not read_only.any()


def test_a_mutable_view_excludes_other_views_of_the_memory():
    """Views held by this extension and another (the Rust example) share the runtime's one
    registry: while a shared view of numpy's memory is held in Rust, the C extension's mutable
    view of it is refused."""
    a = np.zeros(4)
    with pytest.raises(BufferError, match="borrowed"):
        rust_example.while_held(a, lambda: c.fill(a, 1.0))
    assert not a.any()


def test_memory_from_c_is_released_exactly_once_when_the_last_consumer_lets_go():
    before = c.releases()
    obj = c.arange(5)
    assert type(obj) is dlpack.DLPackObject
    as_numpy = np.from_dlpack(obj)
    as_torch = torch.from_dlpack(obj)
    assert as_numpy.tolist() == as_torch.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    as_numpy[0] = 10.0  # one memory: torch sees numpy's write
    assert as_torch[0].item() == 10.0
    del obj, as_numpy
    gc.collect()
    assert c.releases() == before  # torch still holds it
    del as_torch
    gc.collect()
    assert c.releases() == before + 1
    gc.collect()
    assert c.releases() == before + 1


def test_memory_from_c_refused_is_never_released():
    before = c.releases()
    with pytest.raises(ValueError, match="n >= 0"):
        c.arange(-1)
    with pytest.raises(MemoryError):
        c.arange(sys.maxsize // 4)
    gc.collect()
    assert c.releases() == before


def test_a_feature_level_the_runtime_lacks_is_an_import_error_naming_both_sides():
    level = c.FEATURE_VERSION
    assert c.import_api(level) >= level
    with pytest.raises(
        ImportError,
        match=rf"needs the dlpack C API of ABI version \d+ at feature level {level + 1} or later "
        rf".*the installed dlpack {re.escape(dlpack.__version__)} has ABI version \d+ at "
        rf"feature level {level}$",
    ):
        c.import_api(level + 1)


# A dlpack whose table is of another ABI version (its first two fields: ABI 1, level 56).
_OTHER_ABI = """
import ctypes

__version__ = "0.0.2"
_table = (ctypes.c_uint32 * 4)(1, 56, 0, 0)
_new = ctypes.pythonapi.PyCapsule_New
_new.restype = ctypes.py_object
_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
# A capsule keeps a pointer to its name: the name must live as long as the capsule, so it is a
# global of the module, not a constant of its code, which goes once the module has run.
_NAME = b"dlpack._dlpack._C_API"
_C_API = _new(ctypes.addressof(_table), _NAME, None)
"""


@pytest.mark.parametrize(
    "fake, message",
    [
        ("", "No module named 'dlpack._dlpack'"),
        ("__version__ = '0.0.1'\n", "the installed dlpack 0.0.1 has no C API capsule"),
        (_OTHER_ABI, "the installed dlpack 0.0.2 has ABI version 1 at feature level 56$"),
    ],
    ids=["missing", "no-c-api", "other-abi"],
)
def test_importing_the_extension_without_a_fitting_dlpack_is_an_import_error(
    tmp_path, fake, message
):
    """The module's initialisation calls dlpack_adapter_import(1): with no runtime (an empty
    dlpack package first on sys.path), one without a C API, or one of another ABI version,
    importing the extension is an ImportError naming what is installed."""
    package = tmp_path / "dlpack"
    package.mkdir()
    (package / "__init__.py").write_text("")
    if fake:
        (package / "_dlpack.py").write_text(fake)
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "try:\n"
        "    import dlpack_c_example\n"
        "except ImportError as exc:\n"
        "    print('ImportError:', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert re.search(message, out.stdout.strip()), out.stdout
