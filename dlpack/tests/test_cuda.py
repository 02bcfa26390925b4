"""CUDA exchanges; skipped unless torch sees a CUDA device."""

import pytest

from dlpack import asdlpack

from ._helpers import CapsuleInfo, CudaArrayInterface

torch = pytest.importorskip("torch")


def _has_cuda():
    try:
        return torch.cuda.is_available() and torch.cuda.device_count() > 0
    except Exception:
        return False


pytestmark = pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA device")


def test_torch_cuda_tensor_roundtrip():
    t = torch.arange(12, device="cuda", dtype=torch.float32).reshape(3, 4)
    obj = asdlpack(t)
    assert obj.device == (2, t.device.index or 0)
    assert obj.__dlpack_device__() == obj.device
    assert obj.shape == (3, 4)
    assert obj.strides == (4, 1)
    assert obj.data_ptr == t.data_ptr()
    back = torch.from_dlpack(obj)
    assert back.device == t.device
    assert back.data_ptr() == t.data_ptr()
    assert torch.equal(back, t)
    back[0, 0] = 100
    assert float(t[0, 0]) == 100


def test_cuda_array_interface_roundtrip():
    t = torch.arange(6, device="cuda", dtype=torch.int32)
    obj = asdlpack(CudaArrayInterface(t.__cuda_array_interface__, owner=t))
    assert obj.device[0] in (2, 13)
    assert obj.dtype == "int32"
    assert obj.data_ptr == t.data_ptr()
    back = torch.from_dlpack(obj)
    assert back.device.type == "cuda"
    assert torch.equal(back, t)


def test_cuda_versioned_capsule():
    t = torch.ones(5, device="cuda")
    obj = asdlpack(t)
    cap = obj.__dlpack__(max_version=(1, 3))
    info = CapsuleInfo(cap)
    assert info.device == obj.device
    assert info.first_element == t.data_ptr()


@pytest.mark.parametrize("stream", [None, 1, 2])
def test_cuda_stream_values(stream):
    obj = asdlpack(torch.ones(5, device="cuda"))
    torch.cuda.synchronize()
    cap = obj.__dlpack__(stream=stream, max_version=(1, 0))
    assert CapsuleInfo(cap).device[0] == 2


def test_cuda_to_cpu_device_refused():
    obj = asdlpack(torch.zeros(3, device="cuda"))
    with pytest.raises(BufferError):
        obj.__dlpack__(max_version=(1, 0), dl_device=(1, 0))


def test_numpy_refuses_cuda_data():
    np = pytest.importorskip("numpy")
    obj = asdlpack(torch.zeros(3, device="cuda"))
    with pytest.raises((BufferError, RuntimeError, ValueError, TypeError)):
        np.from_dlpack(obj)
