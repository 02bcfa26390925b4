"""What the extension tells Python about element types, devices and layouts agrees with what
``DLPackObject`` does with real arrays, and with plain reference implementations."""

import pickle

import pytest

import dlpack
from dlpack import DLDeviceType, _dlpack, asdlpack

from ._helpers import DTYPE_CODES, need

np = need("numpy")
hypothesis = need("hypothesis")
st = hypothesis.strategies


def test_device_type_enum_is_the_package_one():
    assert dlpack.DLDeviceType is DLDeviceType is _dlpack.DLDeviceType
    assert DLDeviceType.__module__ == "dlpack"
    assert pickle.loads(pickle.dumps(DLDeviceType.kDLCUDAManaged)) is DLDeviceType.kDLCUDAManaged
    # dlpack.h's codes; 5 and 6 are retired there
    assert [(m.name, m.value) for m in DLDeviceType][:4] == [
        ("kDLCPU", 1),
        ("kDLCUDA", 2),
        ("kDLCUDAHost", 3),
        ("kDLOpenCL", 4),
    ]
    assert DLDeviceType.kDLTrn == 18 and 5 not in DLDeviceType.__members__.values()


def test_host_device_sets():
    host = {DLDeviceType.kDLCPU, DLDeviceType.kDLCUDAHost, DLDeviceType.kDLROCMHost}
    assert _dlpack.HOST_DEVICE_TYPES == host
    assert _dlpack.CPU_READABLE_DEVICE_TYPES == host | {DLDeviceType.kDLCUDAManaged}
    assert asdlpack(b"x").device[0] in _dlpack.HOST_DEVICE_TYPES


def test_element_types_match_what_objects_say():
    table = _dlpack.ELEMENT_TYPES
    assert set(table) == set(DTYPE_CODES)
    with pytest.raises(TypeError):
        table["float32"] = ("<f4", 4)  # read-only
    ml_dtypes = need("ml_dtypes")
    for name, (typestr, itemsize) in table.items():
        dtype = np.dtype(getattr(ml_dtypes, name, None) or name)
        obj = asdlpack(np.zeros(3, dtype))
        assert obj.dtype == name
        assert obj.itemsize == itemsize == DTYPE_CODES[name][2]
        assert obj.__array_interface__["typestr"] == typestr


def _extent_reference(shape, strides, itemsize):
    if 0 in shape:
        return 0, 0
    low = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s < 0)
    high = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s > 0)
    return low, high + itemsize


def _dense_reference(shape, strides, itemsize):
    order = sorted(range(len(shape)), key=lambda k: (abs(strides[k]), -k))
    out, step = [0] * len(shape), itemsize
    for k in order:
        out[k] = step
        step *= max(shape[k], 1)
    return out


_dims = st.lists(st.tuples(st.integers(0, 6), st.integers(-64, 64)), max_size=5)


@hypothesis.given(dims=_dims, itemsize=st.sampled_from([1, 2, 4, 8, 16]))
def test_layout_math_matches_reference(dims, itemsize):
    shape = [n for n, _ in dims]
    strides = [s for _, s in dims]
    assert _dlpack.byte_extent(shape, strides, itemsize) == _extent_reference(
        shape, strides, itemsize
    )
    assert _dlpack.dense_strides(shape, strides, itemsize) == _dense_reference(
        shape, strides, itemsize
    )


def test_dense_strides_of_real_layouts():
    a = np.zeros((3, 4, 5), np.float32)
    for view in (a, a.T, a.transpose(1, 0, 2), a[::-1, :, ::2]):
        dense = np.empty_like(view, order="K")
        assert _dlpack.dense_strides(view.shape, view.strides, 4) == list(dense.strides)


def test_layout_math_refuses_bad_values():
    with pytest.raises(ValueError, match="do not match"):
        _dlpack.byte_extent((2, 3), (4,), 4)
    with pytest.raises(ValueError, match="do not match"):
        _dlpack.dense_strides((2,), (4, 4), 4)
    with pytest.raises(ValueError):
        _dlpack.byte_extent((-1,), (4,), 4)
    with pytest.raises(ValueError, match="2\\*\\*63"):
        _dlpack.dense_strides((1 << 62, 4), (4, 16), 4)
    with pytest.raises(TypeError):
        _dlpack.byte_extent("ab", (4, 4), 4)
