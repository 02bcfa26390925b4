"""dtype mapping through every producer path, including ml_dtypes' extension types."""

import json
import sys

import pytest

from dlpack import asdlpack

from ._helpers import (
    DTYPE_CODES,
    ML_DTYPES_NAMES,
    NUMPY_NATIVE_DTYPES,
    ArrayInterface,
    ArrayStruct,
    CapsuleInfo,
    array_interface_of,
    need,
    np_data_ptr,
    run_python,
)

np = need("numpy")


def _sample(dtype, shape=(2, 3)):
    n = int(np.prod(shape))
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return (np.arange(n) % 2 == 0).reshape(shape)
    if dt.kind == "c":
        return (np.arange(n) + 1j * np.arange(n)[::-1]).astype(dt).reshape(shape)
    return np.arange(n).astype(dt).reshape(shape)


PATHS = {
    "dlpack": lambda a: a,
    "array_interface": lambda a: ArrayInterface(array_interface_of(a), owner=a),
    "array_struct": lambda a: ArrayStruct(a),
    "buffer": lambda a: memoryview(a),
}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("dtype", NUMPY_NATIVE_DTYPES)
def test_native_dtype(dtype, path):
    src = _sample(dtype)
    obj = asdlpack(PATHS[path](src))
    assert obj.dtype == dtype
    code, bits, itemsize = DTYPE_CODES[dtype]
    assert obj.itemsize == itemsize
    assert obj.nbytes == src.size * itemsize
    assert obj.data_ptr == np_data_ptr(src)
    info = CapsuleInfo(obj.__dlpack__(max_version=(1, 3)))
    assert info.dtype == (code, bits, 1)
    out = np.from_dlpack(obj)
    assert out.dtype == src.dtype
    np.testing.assert_array_equal(out, src)


@pytest.mark.parametrize("dtype", NUMPY_NATIVE_DTYPES)
def test_native_dtype_strided_via_buffer(dtype):
    base = _sample(dtype, shape=(6, 8))
    view = base[1::2, ::-3]
    obj = asdlpack(memoryview(view))
    assert obj.dtype == dtype
    assert obj.strides == (view.strides[0] // view.itemsize, view.strides[1] // view.itemsize)
    np.testing.assert_array_equal(np.from_dlpack(obj), view)


@pytest.mark.parametrize("typestr", ["|u1", "|i1", "|b1", ">u1", ">i1", "<u1"])
def test_one_byte_types_any_byte_order(typestr):
    src = np.arange(4, dtype=np.uint8)
    iface = array_interface_of(src, typestr=typestr, descr=[("", typestr)])
    obj = asdlpack(ArrayInterface(iface, owner=src))
    assert obj.itemsize == 1
    expected = {"u": "uint8", "i": "int8", "b": "bool"}[typestr[1]]
    assert obj.dtype == expected


@pytest.mark.parametrize("typestr", ["=i4", "<i4"])
def test_native_byte_order_prefixes(typestr):
    src = np.arange(4, dtype=np.int32)
    iface = array_interface_of(src, typestr=typestr, descr=[("", typestr)])
    obj = asdlpack(ArrayInterface(iface, owner=src))
    assert obj.dtype == "int32"
    np.testing.assert_array_equal(np.from_dlpack(obj), src)


# ---------------------------------------------------------------------------
# ml_dtypes (numpy refuses to __dlpack__ them; the array interface + dtype name is used)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ML_DTYPES_NAMES)
def test_ml_dtypes(name):
    ml_dtypes = need("ml_dtypes")
    if not hasattr(ml_dtypes, name):
        pytest.skip(f"ml_dtypes has no {name}")
    dt = np.dtype(getattr(ml_dtypes, name))
    src = np.array([0.5, 1.0, 2.0, 4.0], dtype=np.float32).astype(dt).reshape(2, 2)
    obj = asdlpack(src)
    assert obj.dtype == name
    code, bits, itemsize = DTYPE_CODES[name]
    assert obj.itemsize == itemsize == dt.itemsize
    assert obj.shape == (2, 2)
    assert obj.data_ptr == np_data_ptr(src)
    assert obj.readonly is False
    info = CapsuleInfo(obj.__dlpack__(max_version=(1, 3)))
    assert info.dtype == (code, bits, 1)
    assert info.first_element == np_data_ptr(src)


@pytest.mark.parametrize("name", ML_DTYPES_NAMES)
def test_ml_dtypes_strided_and_readonly(name):
    ml_dtypes = need("ml_dtypes")
    if not hasattr(ml_dtypes, name):
        pytest.skip(f"ml_dtypes has no {name}")
    dt = np.dtype(getattr(ml_dtypes, name))
    base = np.ones((4, 6), dtype=np.float32).astype(dt)
    view = base[::2, 1::2]
    view.flags.writeable = False
    obj = asdlpack(view)
    assert obj.dtype == name
    assert obj.shape == (2, 3)
    assert obj.strides == (12, 2)
    assert obj.readonly is True


TORCH_NAMES = {
    "bfloat16": "bfloat16",
    "float8_e4m3fn": "float8_e4m3fn",
    "float8_e5m2": "float8_e5m2",
    "float8_e4m3fnuz": "float8_e4m3fnuz",
    "float8_e5m2fnuz": "float8_e5m2fnuz",
    "float8_e8m0fnu": "float8_e8m0fnu",
}


@pytest.mark.parametrize("name", list(TORCH_NAMES))
def test_ml_dtypes_to_torch(name):
    ml_dtypes = need("ml_dtypes")
    torch = need("torch")
    tdt = getattr(torch, TORCH_NAMES[name], None)
    if tdt is None:
        pytest.skip(f"torch has no {name}")
    try:  # what torch's DLPack import can't take from torch itself is no test of ours
        torch.from_dlpack(torch.zeros(2, dtype=tdt).__dlpack__(max_version=(1, 3)))
    except (BufferError, RuntimeError, TypeError) as exc:
        pytest.skip(f"torch {torch.__version__} has no DLPack for {name}: {exc}")
    values = np.array([0.5, 1.0, 2.0, 4.0], dtype=np.float32)
    src = values.astype(getattr(ml_dtypes, name))
    obj = asdlpack(src)
    t = torch.from_dlpack(obj)
    assert t.dtype == tdt
    assert t.data_ptr() == np_data_ptr(src)
    np.testing.assert_array_equal(t.float().numpy(), src.astype(np.float32))


def test_bfloat16_numpy_consumer_refuses_cleanly():
    ml_dtypes = need("ml_dtypes")
    src = np.ones(3, dtype=ml_dtypes.bfloat16)
    obj = asdlpack(src)
    # numpy has no bfloat16; it must refuse the capsule with an exception
    with pytest.raises((BufferError, TypeError, ValueError, RuntimeError)):
        np.from_dlpack(obj)
    assert obj.dtype == "bfloat16"


def test_ml_dtypes_unknown_void_refused():
    # a plain void dtype with no DLPack meaning
    src = np.zeros(3, dtype="V2")
    with pytest.raises(BufferError):
        asdlpack(src)


@pytest.mark.parametrize("dtype", NUMPY_NATIVE_DTYPES)
def test_dtype_is_numpys_so_numpy_and_jax_read_the_object(dtype):
    """numpy 2 and JAX read an array-like's ``.dtype`` and need a real dtype: np.dtype(obj),
    np.result_type(obj) and jnp.asarray(obj) take the object as the array it is."""
    jnp = need("jax.numpy", "jax")
    src = _sample(dtype)
    obj = asdlpack(src)
    assert isinstance(obj.dtype, np.dtype) and obj.dtype == src.dtype
    assert str(obj.dtype) == src.dtype.name
    assert np.dtype(obj) == src.dtype
    assert np.result_type(obj, np.int8) == np.result_type(src, np.int8)
    if dtype in ("float64", "int64", "uint64", "complex128"):  # JAX narrows them without x64
        return
    got = jnp.asarray(obj)
    assert got.dtype == src.dtype
    np.testing.assert_array_equal(np.asarray(got), src)


@pytest.mark.parametrize("name", ML_DTYPES_NAMES)
def test_ml_dtypes_dtype_is_ml_dtypes(name):
    ml_dtypes = need("ml_dtypes")
    if not hasattr(ml_dtypes, name):
        pytest.skip(f"ml_dtypes has no {name}")
    dt = np.dtype(getattr(ml_dtypes, name))
    obj = asdlpack(np.zeros(3, dt))
    assert obj.dtype == dt and type(obj.dtype) is type(dt) and str(obj.dtype) == name
    assert np.dtype(obj) == dt


def test_dtype_read_before_ml_dtypes_imports_becomes_its_dtype_after():
    """The extension keeps the dtypes it has made, but not a name given for want of a library:
    a bfloat16 object read while ml_dtypes can't be imported says "bfloat16", and the same
    object read once ml_dtypes can be imported gives ml_dtypes' dtype."""
    need("ml_dtypes")
    need("torch")  # makes the bfloat16 source without ml_dtypes
    # ml_dtypes blocked (as if not installed) while the object is first read, then imported
    code = (
        "import sys\n"
        "sys.modules['ml_dtypes'] = None\n"
        "import numpy as np, torch\n"
        "from dlpack import asdlpack\n"
        "obj = asdlpack(torch.zeros(3, dtype=torch.bfloat16))\n"
        "before = obj.dtype\n"
        "del sys.modules['ml_dtypes']\n"
        "import ml_dtypes\n"
        "after = obj.dtype\n"
        "print(type(before).__name__, before, isinstance(after, np.dtype), after, "
        "after == np.dtype(ml_dtypes.bfloat16))\n"
    )
    done = run_python("-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["str", "bfloat16", "True", "bfloat16", "True"]


def test_dtype_lets_an_interrupt_during_ml_dtypes_import_through():
    """An interrupt (or exit) raised while ml_dtypes imports is the user's, not a reason to
    answer with the type's name; an ordinary import failure still gives the name."""
    need("numpy")
    need("torch")  # makes the bfloat16 source without ml_dtypes
    # One child tries each in turn (the extension keeps no answer of a failed import: each
    # read imports again), on an object of its own; the ordinary failure last.
    code = (
        "import json, sys\n"
        "class Finder:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ml_dtypes':\n"
        "            raise eval(RAISED)\n"
        "sys.meta_path.insert(0, Finder())\n"
        "import torch\n"
        "from dlpack import asdlpack\n"
        "seen = {}\n"
        "for RAISED in sys.argv[1:]:\n"
        "    obj = asdlpack(torch.zeros(3, dtype=torch.bfloat16))\n"
        "    try:\n"
        "        seen[RAISED] = repr(obj.dtype)\n"
        "    except BaseException as exc:\n"
        "        seen[RAISED] = type(exc).__name__\n"
        "print(json.dumps(seen))\n"
    )
    raised = ("KeyboardInterrupt", "SystemExit(3)", "MemoryError", "ImportError('broken')")
    done = run_python("-c", code, *raised)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {
        "KeyboardInterrupt": "KeyboardInterrupt",
        "SystemExit(3)": "SystemExit",
        "MemoryError": "MemoryError",
        "ImportError('broken')": "'bfloat16'",
    }


@pytest.mark.parametrize("name", ML_DTYPES_NAMES)
def test_ml_dtypes_reach_numpy_and_jax_asarray_as_their_type(name):
    """numpy (and so ``jnp.asarray``, which reads through it) gets ml_dtypes' dtype from
    ``__array_struct__``, not two opaque bytes: the same memory, the same type, the same bits,
    strided and read-only as the source."""
    ml_dtypes = need("ml_dtypes")
    jnp = need("jax.numpy", "jax")
    if not hasattr(ml_dtypes, name):
        pytest.skip(f"ml_dtypes has no {name}")
    dt = np.dtype(getattr(ml_dtypes, name))
    src = np.arange(12, dtype=np.float32).reshape(3, 4).astype(dt)
    for source in (src, src[::2, ::-1]):
        obj = asdlpack(source)
        got = np.asarray(obj)
        assert got.dtype == dt and got.shape == source.shape
        assert np.shares_memory(got, source)
        assert got.tobytes() == source.tobytes()
        on_jax = jnp.asarray(obj)
        assert on_jax.dtype == dt
        assert np.asarray(on_jax).tobytes() == source.tobytes()
    readonly = src.copy()
    readonly.flags.writeable = False
    assert not np.asarray(asdlpack(readonly)).flags.writeable
    # each capsule gives its reference to the dtype back
    obj = asdlpack(src)
    np.asarray(obj)
    before = sys.getrefcount(dt)
    for _ in range(1000):
        np.asarray(obj)
    assert sys.getrefcount(dt) == before
