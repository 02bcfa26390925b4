"""Memory on devices other than the CPU and CUDA (ROCm, Metal, oneAPI, ...), handed over in
capsules a foreign producer made: described and passed on as it is, never read by the CPU, every
copy refused with the reason, and the producer's deleter called exactly once."""

import ctypes
import gc

import pytest

from dlpack import DLDeviceType, asdlpack, copyto
from dlpack._dlpack import CPU_READABLE_DEVICE_TYPES, HOST_DEVICE_TYPES

from ._helpers import (
    CapsuleInfo,
    DLManagedTensorVersioned,
    _GetPointer,
    capsule_name,
    need,
)

np = need("numpy")

_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

VALUES = [1.5, -2.0, 3.25, 4.0, 5.5, -6.75]

# CUDA and CUDA managed memory have tests of their own (test_cuda.py): what they can do here
# depends on a driver being installed.
ELSEWHERE = sorted(
    int(t)
    for t in DLDeviceType
    if t not in HOST_DEVICE_TYPES
    and t not in CPU_READABLE_DEVICE_TYPES
    and t not in (DLDeviceType.kDLCUDA,)
)
HOST_OTHER_THAN_CPU = sorted(int(t) for t in HOST_DEVICE_TYPES if t != DLDeviceType.kDLCPU)


class Foreign:
    """A producer's side of one capsule, made with ctypes as a C library would: float32 values
    at a known address on device (device_type, device_id), and a deleter that counts calls."""

    def __init__(self, device_type, device_id=1):
        self.data = (ctypes.c_float * len(VALUES))(*VALUES)
        self.shape = (ctypes.c_int64 * 2)(2, 3)
        self.deleted = 0
        self.deleter = _DELETER(self._delete)
        mt = self.managed = DLManagedTensorVersioned()
        mt.version.major, mt.version.minor = 1, 0
        mt.deleter = ctypes.cast(self.deleter, ctypes.c_void_p)
        t = mt.dl_tensor
        t.data = ctypes.addressof(self.data)
        t.device.device_type, t.device.device_id = device_type, device_id
        t.ndim = 2
        t.dtype.code, t.dtype.bits, t.dtype.lanes = 2, 32, 1  # kDLFloat
        t.shape = self.shape
        self.capsule = _PyCapsule_New(ctypes.addressof(mt), b"dltensor_versioned", None)

    def _delete(self, address):
        assert address == ctypes.addressof(self.managed)
        self.deleted += 1

    @property
    def address(self) -> int:
        return ctypes.addressof(self.data)


def test_the_device_sets_leave_other_devices():
    # The sets the cases come from are the extension's: a device type wrongly put among host
    # memory would silently leave this module's main test.
    assert {4, 7, 8, 9, 10, 12, 14, 15, 16, 17, 18} <= set(ELSEWHERE)
    assert HOST_OTHER_THAN_CPU == [DLDeviceType.kDLCUDAHost, DLDeviceType.kDLROCMHost]


@pytest.mark.parametrize("device_type", ELSEWHERE)
def test_memory_elsewhere_is_described_passed_on_and_never_read(device_type):
    src = Foreign(device_type)
    obj = asdlpack(src.capsule)
    assert capsule_name(src.capsule) == "used_dltensor_versioned"
    assert obj.__dlpack_device__() == (device_type, 1)
    assert (obj.shape, obj.strides, str(obj.dtype)) == ((2, 3), (3, 1), "float32")
    label = repr(obj).split("device=")[1].split(",")[0]
    assert label.endswith(":1")

    # Passed on as it is: the same address and device, to a consumer that can use it.
    for max_version in (None, (1, 0)):
        info = CapsuleInfo(obj.__dlpack__(max_version=max_version))
        assert (info.data, info.device, info.shape) == (src.address, (device_type, 1), (2, 3))
    same_device = obj.__dlpack__(max_version=(1, 0), dl_device=(device_type, 1))
    assert CapsuleInfo(same_device).data == src.address
    del same_device

    # Never read by the CPU: no host protocol serves it, and every copy says why.
    with pytest.raises(BufferError, match=f"{label} memory can't be lent through the buffer"):
        memoryview(obj)
    assert not hasattr(obj, "__array_interface__")
    assert not hasattr(obj, "__cuda_array_interface__")
    with pytest.raises(BufferError, match="only moves between the CPU and CUDA"):
        obj.__dlpack__(max_version=(1, 0), dl_device=(1, 0))
    with pytest.raises(BufferError, match=f"device type {device_type} is not CUDA memory"):
        obj.__dlpack__(max_version=(1, 0), copy=True)
    host = np.zeros((2, 3), np.float32)
    with pytest.raises(BufferError, match=f"device type {device_type} is not CUDA memory"):
        copyto(host, obj)
    assert not host.any()
    with pytest.raises(BufferError, match=f"device type {device_type} is not CUDA memory"):
        copyto(obj, np.ones((2, 3), np.float32))
    assert list(src.data) == VALUES  # read by nobody, written by nobody

    assert src.deleted == 0
    del obj
    gc.collect()
    assert src.deleted == 1


@pytest.mark.parametrize("device_type", HOST_OTHER_THAN_CPU)
def test_pinned_host_memory_is_read_in_place(device_type):
    """CUDA and ROCm pinned host memory is the CPU's to read: host protocols lend it as it is."""
    src = Foreign(device_type, device_id=0)
    obj = asdlpack(src.capsule)
    assert obj.__dlpack_device__() == (device_type, 0)
    assert memoryview(obj).tolist() == [VALUES[:3], VALUES[3:]]
    assert obj.__array_interface__["data"] == (src.address, False)
    out = np.from_dlpack(obj)
    assert out.ctypes.data == src.address
    out[0, 0] = 9.0
    assert src.data[0] == 9.0
    del obj, out
    gc.collect()
    assert src.deleted == 1


def test_the_capsule_pointer_is_the_producers():
    # The harness itself: the capsule holds the struct the deleter is checked against.
    src = Foreign(DLDeviceType.kDLROCM)
    assert _GetPointer(src.capsule, b"dltensor_versioned") == ctypes.addressof(src.managed)
    obj = asdlpack(src.capsule)
    del obj
    gc.collect()
    assert src.deleted == 1
