"""CUDA exchanges; skipped unless torch sees a CUDA device."""

import pytest

from dlpack import asdlpack

from ._helpers import CapsuleInfo, CudaArrayInterface, torch_cuda_available

torch = pytest.importorskip("torch")


pytestmark = pytest.mark.skipif(not torch_cuda_available(), reason="needs a CUDA device")


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


def test_cuda_to_cpu_move_copies():
    t = torch.arange(12, device="cuda", dtype=torch.float32).reshape(3, 4)
    obj = asdlpack(t)
    with pytest.raises(BufferError, match="copy=False"):
        obj.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=False)
    cap = obj.__dlpack__(max_version=(1, 0), dl_device=(1, 0))
    info = CapsuleInfo(cap)
    assert info.device == (1, 0)
    assert info.flags & 2  # IS_COPIED
    back = torch.from_dlpack(cap)
    assert back.device.type == "cpu"
    assert torch.equal(back, t.cpu())


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_cpu_to_cuda_and_back(layout):
    base = torch.arange(48, dtype=torch.float64).reshape(6, 8)
    src = {"contiguous": base, "transposed": base.T, "strided": base[::2, 1::3]}[layout]
    obj = asdlpack(src)
    on_gpu = torch.from_dlpack(obj.__dlpack__(max_version=(1, 3), dl_device=(2, 0)))
    assert on_gpu.device.type == "cuda"
    assert torch.equal(on_gpu.cpu(), src)
    # and a strided CUDA tensor back to the CPU (staged through the host)
    strided_gpu = on_gpu.T if layout != "strided" else on_gpu[:, ::2]
    back = asdlpack(strided_gpu).__dlpack__(max_version=(1, 3), dl_device=(1, 0))
    assert torch.equal(torch.from_dlpack(back), strided_gpu.cpu())


def test_cuda_copy_true_is_a_device_copy():
    t = torch.arange(10, device="cuda", dtype=torch.int32)
    copy = torch.from_dlpack(asdlpack(t).__dlpack__(max_version=(1, 3), copy=True))
    assert copy.device == t.device
    assert copy.data_ptr() != t.data_ptr()
    assert torch.equal(copy, t)
    copy[0] = 42
    assert int(t[0]) == 0


def test_producer_stream_is_waited_for():
    """A CUDA array interface producer's pending kernel must finish before the consumer reads:
    torch.cuda._sleep keeps the producer stream busy while the data is being written."""
    producer = torch.cuda.Stream()
    with torch.cuda.stream(producer):
        t = torch.zeros(1 << 20, device="cuda")
        torch.cuda._sleep(50_000_000)
        t.fill_(7.0)
    interface = dict(t.__cuda_array_interface__)
    interface["stream"] = producer.cuda_stream
    obj = asdlpack(CudaArrayInterface(interface, owner=t))
    assert obj.stream == producer.cuda_stream
    consumer = torch.cuda.current_stream()
    back = torch.from_dlpack(obj)  # torch passes its current stream
    total = back.sum()  # runs on the consumer stream, after the event wait
    consumer.synchronize()
    assert float(total) == 7.0 * (1 << 20)


def test_numpy_refuses_cuda_data():
    np = pytest.importorskip("numpy")
    obj = asdlpack(torch.zeros(3, device="cuda"))
    with pytest.raises((BufferError, RuntimeError, ValueError, TypeError)):
        np.from_dlpack(obj)
