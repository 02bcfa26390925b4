"""Property tests: numpy views (sliced, or placed byte by byte with any strides and offset), torch
tensors and raw capsules survive asdlpack -> from_dlpack with their values, shared where DLPack
can describe them."""

import pytest

from dlpack import asdlpack

from ._helpers import (
    ML_DTYPES_NAMES,
    NUMPY_NATIVE_DTYPES,
    ArrayInterface,
    ArrayStruct,
    array_interface_of,
    element_strides,
    need,
    np_data_ptr,
    optional,
    run_python,
)

np = need("numpy")
hypothesis = need("hypothesis")
st = need("hypothesis.strategies")
HealthCheck, given, settings = hypothesis.HealthCheck, hypothesis.given, hypothesis.settings
as_strided = np.lib.stride_tricks.as_strided

WRAPPERS = {
    "self": lambda a: a,
    "memoryview": lambda a: memoryview(a),
    "array_interface": lambda a: ArrayInterface(array_interface_of(a), owner=a),
    "array_struct": lambda a: ArrayStruct(a),
}


@st.composite
def strided_views(draw):
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=ndim, max_size=ndim)))
    dtype = np.dtype(draw(st.sampled_from(NUMPY_NATIVE_DTYPES)))
    base = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).astype(dtype)
    base = base.reshape(shape)
    if draw(st.booleans()):
        base = np.asfortranarray(base)
    index = []
    for n in shape:
        step = draw(st.sampled_from([1, 2, 3, -1, -2]))
        start = draw(st.integers(0, max(n - 1, 0)))
        index.append(slice(start, None, step) if step > 0 else slice(None, None, step))
    view = base[tuple(index)] if ndim else base[...]
    if ndim >= 2 and draw(st.booleans()):
        perm = draw(st.permutations(range(ndim)))
        view = view.transpose(perm)
    if draw(st.booleans()):
        view.flags.writeable = False
    return view


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(view=strided_views(), wrapper=st.sampled_from(list(WRAPPERS)))
def test_roundtrip_numpy(view, wrapper):
    obj = asdlpack(WRAPPERS[wrapper](view))
    assert obj.shape == view.shape
    assert obj.dtype == view.dtype.name
    assert obj.nbytes == view.nbytes
    assert obj.readonly is (not view.flags.writeable)
    if view.size:
        for n, got, exp in zip(view.shape, obj.strides, element_strides(view), strict=True):
            if n > 1:
                assert got == exp
        assert obj.data_ptr == np_data_ptr(view)
    out = np.from_dlpack(obj)
    assert out.dtype == view.dtype
    assert out.shape == view.shape
    np.testing.assert_array_equal(out, view)
    assert out.flags.writeable is view.flags.writeable
    if view.size:
        assert np.shares_memory(out, view)
        assert np_data_ptr(out) == np_data_ptr(view)
    if view.size and view.flags.writeable:
        idx = (0,) * view.ndim
        before = view[idx]
        out[idx] = not out[idx] if view.dtype == np.bool_ else out[idx] + 1
        assert view[idx] == out[idx] != before


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(view=strided_views())
def test_copy_roundtrip(view):
    out = np.from_dlpack(asdlpack(view), copy=True)
    np.testing.assert_array_equal(out, view)
    assert out.flags.writeable
    if view.size:
        assert not np.shares_memory(out, view)


# Raw layouts: views placed by hand on a byte buffer (`as_strided`), so strides can be zero,
# negative, odd or overlapping and the first element can sit at any byte (unaligned).

ml_dtypes = optional("ml_dtypes")
torch = optional("torch")

# Torch has no DLPack code for these three (it refuses them with "Unsupported code").
TORCH_LACKS = {"float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz"}


def _dtypes():
    names = [np.dtype(n) for n in NUMPY_NATIVE_DTYPES]
    # Non-native byte order: DLPack can't carry it, so the product must copy (and swap).
    swapped = [d.newbyteorder() for d in names if d.itemsize > 1]
    ml = [np.dtype(getattr(ml_dtypes, n)) for n in ML_DTYPES_NAMES] if ml_dtypes else []
    return names + swapped + ml


def _bytes(a):
    """Each element's bytes in native order, as uint8 rows: a reference that needs no float
    arithmetic (bfloat16 / float8 values compare by their bits) and that numpy computes itself."""
    if a.dtype.kind != "V":  # numbers: numpy swaps non-native ones to native order
        a = a.astype(a.dtype.newbyteorder("="))
    raw = np.array(a.view(f"V{a.itemsize}"), copy=True)  # plain void copies every byte
    return raw.reshape(-1).view(np.uint8).reshape((*a.shape, a.itemsize))


def _expressible(x) -> bool:
    """Independent rule for "DLPack can point at this memory as it is": native byte order, and
    every stride that addresses memory is a whole number of elements."""
    if not x.dtype.isnative:
        return False
    if x.size == 0:
        return True
    return all(s % x.itemsize == 0 for n, s in zip(x.shape, x.strides, strict=True) if n > 1)


def _placed(dtype, shape, strides, start, writeable):
    """A view of `dtype` placed by hand on a byte buffer, its first element `start` bytes in,
    and the buffer (the bytes the view reaches past its first element, and more)."""
    item = dtype.itemsize
    high = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if n and s > 0)
    size = start + high + item + 8
    buf = (np.arange(size, dtype=np.int64) * 37 % 251).astype(np.uint8)
    if dtype == np.bool_:
        buf &= 1  # only 0 and 1 are booleans
    # Placed as raw bytes of the item's size, then typed: as_strided goes through the array
    # interface, which can't spell every ml_dtypes type (float8_e5m2 is "<f1").
    first = buf[start : start + item].view(f"V{item}")
    view = as_strided(first, shape=shape, strides=strides, writeable=writeable)
    return view.view(dtype), buf


@st.composite
def raw_views(draw):
    dtype = draw(st.sampled_from(_dtypes()))
    item = dtype.itemsize
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim)))
    stride = st.one_of(
        st.just(0),
        st.integers(-3, 3).map(lambda k: k * item),  # whole elements, either sign
        st.integers(-2 * item - 3, 2 * item + 3),  # any byte count: odd, overlapping
    )
    strides = tuple(draw(st.lists(stride, min_size=ndim, max_size=ndim)))
    # The bytes the view reaches before its first element, so the buffer holds all of them.
    low = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if n and s < 0)
    start = -low + draw(st.integers(0, 2 * item + 1))  # any byte: unaligned starts too
    return _placed(dtype, shape, strides, start, writeable=draw(st.booleans()))


def _torch_takes(x) -> bool:
    """Whether torch can read what `asdlpack(x)` hands it. Where DLPack can't describe `x` in
    place, that is the object's own copy, dense and aligned: torch reads it whenever it has the
    type. In place, torch needs no negative strides (it refuses those itself: "Storage size
    calculation overflowed") and each element aligned to its size, as torch's types are
    (`c10::complex<double>` is `alignas(16)`). numpy's `aligned` flag asks less of complex128
    (8 bytes, a double's): torch's copy of a broadcast (zero-stride) complex128 8 bytes past a
    multiple of 16 dies on an aligned load (`vmovapd`, SIGSEGV in `.contiguous()`), from
    `torch.from_numpy(x)` or numpy's own capsule alike, without this package involved."""
    if torch is None or x.dtype.name in TORCH_LACKS:
        return False
    if not _expressible(x):
        return True
    return x.ctypes.data % x.itemsize == 0 and all(
        s >= 0 or n <= 1 for n, s in zip(x.shape, x.strides, strict=True)
    )


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=raw_views(), capsule=st.booleans())
def test_raw_layouts(case, capsule):
    x, buf = case
    expected = np.array(x, copy=True)  # values read by numpy itself, before any export
    expected_bytes = _bytes(x)
    is_numpy_type = x.dtype.name in NUMPY_NATIVE_DTYPES
    # numpy exports a capsule only for its own types, native order, whole-element strides; a
    # versioned one (max_version) so read-only views are allowed.
    capsule = capsule and is_numpy_type and _expressible(x)
    src = x.__dlpack__(max_version=(1, 0)) if capsule else x
    obj = asdlpack(src)
    assert obj.shape == x.shape
    assert obj.dtype == x.dtype.newbyteorder("=")
    assert obj.readonly is (not x.flags.writeable)
    if x.size:
        assert obj.data_ptr == x.ctypes.data  # the object always describes the source in place
    assert (obj.copy_reason is None) is _expressible(x)
    if is_numpy_type:
        out = np.from_dlpack(obj)
        assert out.dtype == x.dtype.newbyteorder("=")
        assert out.shape == x.shape
        np.testing.assert_array_equal(out, expected)
        if x.size:
            assert (out.ctypes.data == x.ctypes.data) is _expressible(x)
            assert np.shares_memory(out, buf) is _expressible(x)
        # A copy is the consumer's own, writable memory.
        assert out.flags.writeable is (x.flags.writeable or not _expressible(x))
    else:
        # numpy has no DLPack code for ml_dtypes' types ("Unsupported dtype in DLTensor"): read
        # the bits through the object's array interface alone, which describes the memory in
        # place (np.asarray(obj) itself takes the buffer protocol: see the xfail below).
        got = np.asarray(ArrayInterface(obj.__array_interface__, owner=obj))
        assert got.shape == x.shape
        np.testing.assert_array_equal(_bytes(got), expected_bytes)
        if x.size:
            assert got.ctypes.data == x.ctypes.data
    if _torch_takes(x):
        t = torch.from_dlpack(obj)
        assert tuple(t.shape) == x.shape
        got = t.contiguous().reshape(-1).view(torch.uint8).numpy()
        np.testing.assert_array_equal(got.reshape(expected_bytes.shape), expected_bytes)
        if x.size:
            assert (t.data_ptr() == x.ctypes.data) is _expressible(x)


# Raw layouts numpy calls aligned and torch does not: broadcast (zero-stride) complex types one
# component past their size's multiple, where torch's vectorised copy dies. In a child process:
# a test body that hands them to torch kills the interpreter, pytest and its report with it.
# (dtype, shape, strides, alignment, address % alignment)
TORCH_MISALIGNED = [
    ("complex128", (3,), (0,), 16, 8),
    ("complex128", (2, 3), (0, 16), 16, 8),
    ("complex64", (4,), (0,), 8, 4),
    ("complex128", (3,), (8,), 16, 3),  # not whole elements: torch gets the object's own copy
]


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_raw_layouts_torch_alignment():
    script = f"""CASES = {TORCH_MISALIGNED!r}
import numpy as np
from dlpack.tests import test_property as tp
for name, shape, strides, align, residue in CASES:
    for start in range(align):  # the start whose address leaves the residue asked for
        x, buf = tp._placed(np.dtype(name), shape, strides, start, writeable=True)
        if x.ctypes.data % align == residue:
            break
    assert x.ctypes.data % align == residue, (name, x.ctypes.data)
    for capsule in (False, True):
        tp.test_raw_layouts.hypothesis.inner_test(case=(x, buf), capsule=capsule)
    print(name, shape, strides, "passed", flush=True)
"""
    done = run_python("-X", "faulthandler", "-c", script)
    assert done.returncode == 0, f"status {done.returncode}\n{done.stdout}{done.stderr}"


@st.composite
def torch_views(draw):
    """Torch tensors as torch makes them: from numpy, transposed, sliced with steps, and
    `as_strided` with zero and overlapping strides and a storage offset."""
    name = draw(
        st.sampled_from(
            [
                "bool",
                "int8",
                "uint8",
                "int16",
                "int32",
                "int64",
                "float16",
                "bfloat16",
                "float32",
                "float64",
                "complex64",
                "float8_e4m3fn",
                "float8_e5m2",
            ]
        )
    )
    dtype = getattr(torch, name)
    n = draw(st.integers(1, 40))
    base = torch.from_numpy((np.arange(n, dtype=np.int64) * 37 % 251).astype(np.uint8).copy())
    base = base.to(torch.bool) if dtype == torch.bool else base.to(torch.float32).to(dtype)
    how = draw(st.sampled_from(["plain", "transpose", "slice", "as_strided"]))
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim)))
    if how == "as_strided":
        strides = tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))
        reach = sum((k - 1) * s for k, s in zip(shape, strides, strict=True) if k)
        offset = draw(st.integers(0, 3))
        hypothesis.assume(0 in shape or offset + reach < n)
        return base.as_strided(shape, strides, offset)
    count = int(np.prod(shape, dtype=np.int64))
    hypothesis.assume(count <= n)
    view = base[:count].reshape(shape)
    if how == "transpose" and ndim >= 2:
        view = view.permute(*draw(st.permutations(range(ndim))))
    if how == "slice" and ndim >= 1:
        view = view[
            tuple(
                slice(draw(st.integers(0, 2)), None, draw(st.integers(1, 3))) for _ in range(ndim)
            )
        ]
    return view


def _torch_bytes(t):
    """Each element's bytes, computed by torch alone (a dense copy viewed as bytes)."""
    if not t.numel():  # torch can't view an empty tensor as bytes
        return torch.empty((*t.shape, t.element_size()), dtype=torch.uint8)
    # A fresh tensor: `contiguous()` keeps a one-element tensor's odd stride.
    dense = torch.empty(t.shape, dtype=t.dtype).copy_(t)
    return dense.view(-1).view(torch.uint8).reshape(*t.shape, t.element_size())


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(t=torch_views() if torch else st.nothing(), capsule=st.booleans())
def test_torch_layouts(t, capsule):
    expected = _torch_bytes(t).numpy().copy()  # before anything else sees the tensor
    obj = asdlpack(t.__dlpack__() if capsule else t)  # a raw capsule, or the tensor itself
    assert obj.shape == tuple(t.shape)
    assert str(obj.dtype) == str(t.dtype).removeprefix("torch.")
    assert obj.copy_reason is None  # torch strides are whole elements: always in place
    if t.numel():
        assert obj.data_ptr == t.data_ptr()
        for k, got, want in zip(t.shape, obj.strides, t.stride(), strict=True):
            if k > 1:  # strides of extent-1 dimensions address nothing
                assert got == want
    back = torch.from_dlpack(obj)
    assert back.dtype == t.dtype and back.shape == t.shape
    np.testing.assert_array_equal(_torch_bytes(back).numpy(), expected)
    if t.numel():
        assert back.data_ptr() == t.data_ptr()
    if str(obj.dtype) in NUMPY_NATIVE_DTYPES:
        out = np.from_dlpack(obj)
        assert out.shape == tuple(t.shape)
        np.testing.assert_array_equal(_bytes(out), expected)
        if t.numel():
            assert out.ctypes.data == t.data_ptr()


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_capsules_are_taken_once():
    # The one refusal of a raw capsule: it was consumed (here by the first asdlpack).
    for cap in (np.arange(3.0).__dlpack__(), torch.arange(3).__dlpack__()):
        asdlpack(cap)
        with pytest.raises(ValueError, match="^this DLPack capsule was already consumed$"):
            asdlpack(cap)


@pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes is not installed")
@pytest.mark.parametrize("name", ML_DTYPES_NAMES)
def test_ml_dtypes_through_numpy_array(name):
    # The buffer protocol has no format for these types (pad bytes, '2x', would be read as a
    # struct without fields, and copied as nothing), so numpy reads __array_struct__, which
    # carries ml_dtypes' dtype: the same bytes, as the same type.
    x = np.arange(1, 5).astype(getattr(ml_dtypes, name))  # no 0: float8_e8m0fnu has none
    got = np.array(asdlpack(x))
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(_bytes(got), _bytes(x))
    np.testing.assert_array_equal(got, x)
