"""The DLPack 1.3 C exchange API (``__dlpack_c_exchange_api__``), both directions.

As producer, ``DLPackObject`` publishes a static ``DLPackExchangeAPI`` table; these tests call its
functions through ctypes exactly as a C consumer would. As consumer, ``asdlpack`` uses a
producer's table (torch has one) instead of its Python ``__dlpack__``.
"""

import ctypes
import gc
import sys

import pytest

from dlpack import DLPackObject, asdlpack

from ._helpers import DLManagedTensorVersioned, DLTensor, need

_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_GetPointer.restype = ctypes.c_void_p
_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_GetName = ctypes.pythonapi.PyCapsule_GetName
_GetName.restype = ctypes.c_char_p
_GetName.argtypes = [ctypes.py_object]

_SET_ERROR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)
# PYFUNCTYPE keeps the GIL across the call, as a C consumer holding Python objects does.
_FROM_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(ctypes.c_void_p))
_TO_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))
_DLTENSOR_FROM_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(DLTensor))
_ALLOCATOR = ctypes.PYFUNCTYPE(
    ctypes.c_int,
    ctypes.POINTER(DLTensor),
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.c_void_p,
    _SET_ERROR,
)
_STREAM = ctypes.PYFUNCTYPE(
    ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p)
)
_DELETER = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)
# Our own prototype of Py_DecRef, taking an address: ctypes.pythonapi's function objects are
# shared by the process, and other libraries set their argtypes (numba.cuda makes Py_DecRef take
# a py_object, which would give back the c_void_p holder's reference instead of the object's).
_DECREF_ADDRESS = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)(("Py_DecRef", ctypes.pythonapi))


class ExchangeAPI(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("prev_api", ctypes.c_void_p),
        ("managed_tensor_allocator", ctypes.c_void_p),
        ("managed_tensor_from_py_object_no_sync", ctypes.c_void_p),
        ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
        ("dltensor_from_py_object_no_sync", ctypes.c_void_p),
        ("current_work_stream", ctypes.c_void_p),
    ]


def _table():
    capsule = DLPackObject.__dlpack_c_exchange_api__
    assert _GetName(capsule) == b"dlpack_exchange_api"
    return ExchangeAPI.from_address(_GetPointer(capsule, b"dlpack_exchange_api"))


def _export(obj):
    out = ctypes.c_void_p()
    assert _FROM_PY(_table().managed_tensor_from_py_object_no_sync)(obj, ctypes.byref(out)) == 0
    return DLManagedTensorVersioned.from_address(out.value), out.value


def _delete(managed, address):
    _DELETER(managed.deleter)(address)


def test_table_is_on_the_type_and_versioned():
    table = _table()
    assert (table.major, table.minor) == (1, 3)
    assert table.prev_api is None
    for name, _ in ExchangeAPI._fields_[3:]:
        assert getattr(table, name), f"{name} is NULL"
    # the same static table every time
    assert ctypes.addressof(_table()) == ctypes.addressof(table)


def test_managed_tensor_from_py_object_shares_memory_and_frees():
    src = bytearray(b"\x01\x02\x03\x04\x05\x06")
    baseline = sys.getrefcount(src)
    obj = asdlpack(memoryview(src).cast("B", shape=[2, 3]))
    managed, address = _export(obj)
    t = managed.dl_tensor
    assert (managed.version.major, managed.version.minor) == (1, 3)
    assert managed.flags & 1 == 0  # writable source: no READ_ONLY flag
    assert t.ndim == 2 and [t.shape[0], t.shape[1]] == [2, 3]
    assert [t.strides[0], t.strides[1]] == [3, 1]
    assert t.data + t.byte_offset == obj.data_ptr
    assert (t.device.device_type, t.device.device_id) == (1, 0)
    ctypes.c_uint8.from_address(obj.data_ptr).value = 99
    assert src[0] == 99
    del obj
    gc.collect()
    assert sys.getrefcount(src) > baseline  # the managed tensor keeps the source
    _delete(managed, address)
    gc.collect()
    assert sys.getrefcount(src) == baseline


def test_managed_tensor_from_py_object_without_the_gil():
    # A consumer calling without the GIL (CFUNCTYPE releases it around the call) gets the same
    # export: the entry point takes the GIL itself rather than take its GIL-only shortcut.
    src = bytearray(b"\x01\x02\x03\x04")
    baseline = sys.getrefcount(src)
    obj = asdlpack(src)
    from_py = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))
    out = ctypes.c_void_p()
    assert from_py(_table().managed_tensor_from_py_object_no_sync)(id(obj), ctypes.byref(out)) == 0
    managed = DLManagedTensorVersioned.from_address(out.value)
    assert managed.dl_tensor.data + managed.dl_tensor.byte_offset == obj.data_ptr
    assert managed.flags & 2 == 0  # shared, not copied
    del obj
    gc.collect()
    assert sys.getrefcount(src) > baseline
    _delete(managed, out.value)
    gc.collect()
    assert sys.getrefcount(src) == baseline


def test_read_only_memory_is_copied_for_exchange_api_consumers():
    """C API consumers (tvm-ffi) write through tensors whatever their READ_ONLY flag says, so
    read-only memory goes out as a copy."""
    src = b"abc"
    managed, address = _export(asdlpack(src))
    assert managed.flags & 1 == 0 and managed.flags & 2 == 2  # not READ_ONLY, IS_COPIED
    t = managed.dl_tensor
    assert t.data + t.byte_offset != asdlpack(src).data_ptr
    assert ctypes.string_at(t.data + t.byte_offset, 3) == b"abc"
    _delete(managed, address)
    with pytest.raises(BufferError, match="read-only"):
        _DLTENSOR_FROM_PY(_table().dltensor_from_py_object_no_sync)(
            asdlpack(src), ctypes.byref(DLTensor())
        )


def test_tvm_ffi_cannot_write_into_read_only_sources():
    tvm_ffi = need("tvm_ffi")
    np = need("numpy")
    src = b"abcdef"
    view = np.from_dlpack(tvm_ffi.from_dlpack(asdlpack(src)))
    view[0] = ord("z")
    assert src == bytes([97, 98, 99, 100, 101, 102])  # made apart from src's constant


def test_copied_exports_carry_flags():
    np = need("numpy")
    swapped = np.arange(4, dtype=">i4")
    managed, address = _export(asdlpack(swapped))
    assert managed.flags & 2 == 2  # IS_COPIED: DLPack can't carry swapped bytes
    t = managed.dl_tensor
    values = (ctypes.c_int32 * 4).from_address(t.data + t.byte_offset)
    assert list(values) == [0, 1, 2, 3]
    _delete(managed, address)


def test_wrong_object_type_raises():
    out = ctypes.c_void_p()
    with pytest.raises(TypeError):
        _FROM_PY(_table().managed_tensor_from_py_object_no_sync)(b"abc", ctypes.byref(out))


def test_dltensor_from_py_object_borrows():
    obj = asdlpack(bytearray(range(8)))
    out = DLTensor()
    assert _DLTENSOR_FROM_PY(_table().dltensor_from_py_object_no_sync)(obj, ctypes.byref(out)) == 0
    assert out.ndim == 1 and out.shape[0] == 8 and out.strides[0] == 1
    assert out.data + out.byte_offset == obj.data_ptr
    assert bytes(ctypes.string_at(out.data, 8)) == bytes(range(8))


def test_dltensor_from_py_object_refuses_memory_that_needs_a_copy():
    np = need("numpy")
    obj = asdlpack(np.arange(3, dtype=">f8"))
    with pytest.raises(BufferError):
        _DLTENSOR_FROM_PY(_table().dltensor_from_py_object_no_sync)(obj, ctypes.byref(DLTensor()))


def test_to_py_object_takes_ownership():
    src = bytearray(b"xyz")
    baseline = sys.getrefcount(src)
    managed, address = _export(asdlpack(src))
    out = ctypes.c_void_p()
    assert _TO_PY(_table().managed_tensor_to_py_object_no_sync)(address, ctypes.byref(out)) == 0
    back = ctypes.cast(out, ctypes.py_object).value  # a borrowed view of our new reference...
    _DECREF_ADDRESS(out)  # ...which we, the C caller, now give back
    assert type(back) is DLPackObject
    assert back.shape == (3,) and back.dtype == "uint8"
    assert bytes(ctypes.string_at(back.data_ptr, 3)) == b"xyz"
    del out, back
    gc.collect()
    assert sys.getrefcount(src) == baseline  # the managed tensor was deleted exactly once


def test_allocator_makes_aligned_cpu_tensors_and_reports_errors():
    shape = (ctypes.c_int64 * 2)(3, 5)
    proto = DLTensor()
    proto.ndim = 2
    proto.shape = shape
    proto.device.device_type, proto.device.device_id = 1, 0
    proto.dtype.code, proto.dtype.bits, proto.dtype.lanes = 2, 32, 1
    out = ctypes.c_void_p()
    errors = []

    @_SET_ERROR
    def set_error(ctx, kind, message):
        errors.append((kind.decode(), message.decode()))

    alloc = _ALLOCATOR(_table().managed_tensor_allocator)
    assert alloc(ctypes.byref(proto), ctypes.byref(out), None, set_error) == 0
    managed = DLManagedTensorVersioned.from_address(out.value)
    t = managed.dl_tensor
    assert [t.shape[0], t.shape[1]] == [3, 5] and [t.strides[0], t.strides[1]] == [5, 1]
    assert t.data % 64 == 0
    ctypes.memset(t.data, 7, 60)  # the whole tensor is writable
    _delete(managed, out.value)
    assert errors == []
    proto.device.device_type = 2  # CUDA: not ours to allocate
    assert alloc(ctypes.byref(proto), ctypes.byref(out), None, set_error) == -1
    assert errors and errors[0][0] == "BufferError"


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda p: setattr(p.dtype, "code", 99), "BufferError"),  # no such DLPack type
        (lambda p: p.shape.__setitem__(0, -3), "ValueError"),
        (lambda p: p.shape.__setitem__(0, 1 << 58), "MemoryError"),  # 5 * 2**60 bytes
    ],
    ids=["dtype", "negative-extent", "too-large"],
)
def test_allocator_errors_are_the_exceptions_python_callers_see(change, expected):
    """The allocator reports errors by name through its callback: the same names Python
    callers get for the same kind of error (one mapping)."""
    shape = (ctypes.c_int64 * 2)(3, 5)
    proto = DLTensor()
    proto.ndim, proto.shape = 2, shape
    proto.device.device_type, proto.device.device_id = 1, 0
    proto.dtype.code, proto.dtype.bits, proto.dtype.lanes = 2, 32, 1
    change(proto)
    errors = []

    @_SET_ERROR
    def set_error(ctx, kind, message):
        errors.append((kind.decode(), message.decode()))

    out = ctypes.c_void_p()
    alloc = _ALLOCATOR(_table().managed_tensor_allocator)
    assert alloc(ctypes.byref(proto), ctypes.byref(out), None, set_error) == -1
    assert [kind for kind, _ in errors] == [expected], errors
    assert errors[0][1]


def test_current_work_stream_is_null():
    stream = ctypes.c_void_p(1234)
    assert _STREAM(_table().current_work_stream)(2, 0, ctypes.byref(stream)) == 0
    assert stream.value is None


# -- consumer side ------------------------------------------------------------------------------


def test_asdlpack_uses_torch_exchange_api_instead_of_dunder_dlpack(monkeypatch):
    torch = need("torch")
    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        pytest.skip(f"torch {torch.__version__} has no __dlpack_c_exchange_api__")
    t = torch.arange(6, dtype=torch.float32)

    def refuse(*args, **kwargs):
        raise AssertionError("the Python __dlpack__ was called")

    monkeypatch.setattr(torch.Tensor, "__dlpack__", refuse)
    obj = asdlpack(t)
    assert obj.data_ptr == t.data_ptr()
    assert obj.shape == (6,) and obj.dtype == "float32"
    np = need("numpy")
    view = np.from_dlpack(obj)
    view[0] = 42
    assert t[0].item() == 42


def test_torch_exchange_api_lifetime():
    torch = need("torch")
    np = need("numpy")
    t = torch.arange(4.0)
    baseline = sys.getrefcount(t)
    for _ in range(2000):
        np.from_dlpack(asdlpack(t))
        asdlpack(t).__dlpack__(max_version=(1, 0))
    gc.collect()
    assert sys.getrefcount(t) == baseline
    keep = np.from_dlpack(asdlpack(t))
    del t
    gc.collect()
    assert keep.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_torch_tensors_whose_memory_is_not_their_value_are_refused():
    """torch's C API exports the raw memory of lazily conjugated or negated tensors (wrong values)
    and of tensors requiring grad; asdlpack refuses them as torch's __dlpack__ does (and the
    negative bit, which torch's __dlpack__ itself lets through with wrong values)."""
    torch = need("torch")
    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        pytest.skip(f"torch {torch.__version__} has no __dlpack_c_exchange_api__")
    with pytest.raises(BufferError, match="conjugate"):
        asdlpack(torch.tensor([1 + 2j, 3 - 1j]).conj())
    with pytest.raises(BufferError, match="negative bit"):
        asdlpack(torch.tensor([1.0, 2.0])._neg_view())
    with pytest.raises(BufferError, match="gradient"):
        asdlpack(torch.ones(3, requires_grad=True))
    np = need("numpy")
    resolved = np.from_dlpack(asdlpack(torch.tensor([1 + 2j]).conj().resolve_conj()))
    assert resolved.tolist() == [1 - 2j]
    assert np.from_dlpack(asdlpack(torch.ones(2, requires_grad=True).detach())).tolist() == [1, 1]


def test_tvm_ffi_consumes_through_exchange_api():
    tvm_ffi = need("tvm_ffi")
    np = need("numpy")
    a = np.arange(5, dtype=np.int32)
    x = tvm_ffi.from_dlpack(asdlpack(a))
    back = np.from_dlpack(x)
    assert back.tolist() == [0, 1, 2, 3, 4]
    back[1] = 7
    assert a[1] == 7
