"""Property test: random numpy views survive asdlpack -> numpy.from_dlpack unchanged and shared."""

from dlpack import asdlpack

from ._helpers import (
    NUMPY_NATIVE_DTYPES,
    ArrayInterface,
    ArrayStruct,
    array_interface_of,
    element_strides,
    need,
    np_data_ptr,
)

np = need("numpy")
hypothesis = need("hypothesis")
st = need("hypothesis.strategies")
HealthCheck, given, settings = hypothesis.HealthCheck, hypothesis.given, hypothesis.settings

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
