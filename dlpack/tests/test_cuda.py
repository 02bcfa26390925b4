"""CUDA exchanges; skipped unless torch sees a CUDA device (failed instead where
``DLPACK_TESTS_REQUIRE`` names ``cuda``)."""

import pytest

from dlpack import asdlpack, copyto

from ._helpers import CapsuleInfo, CudaArrayInterface, need, need_cuda, torch_cuda_available

torch = need("torch")


@pytest.fixture(autouse=True)
def _cuda_device():
    need_cuda(torch_cuda_available(), "needs a CUDA device")


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


def _slowly_filled(value):
    """A tensor that a busy producer stream (torch.cuda._sleep) fills with ``value``, and a CUDA
    array interface object naming that stream: ``(t, producer, interface object)``."""
    producer = torch.cuda.Stream()
    with torch.cuda.stream(producer):
        t = torch.zeros(1 << 20, device="cuda")
        torch.cuda._sleep(50_000_000)
        t.fill_(value)
    interface = dict(t.__cuda_array_interface__)
    interface["stream"] = producer.cuda_stream
    return t, producer, CudaArrayInterface(interface, owner=t)


def test_producer_stream_is_waited_for():
    """A CUDA array interface producer's pending kernel must finish before the consumer reads."""
    t, producer, obj = _slowly_filled(7.0)
    obj = asdlpack(obj)
    assert obj.stream == producer.cuda_stream
    consumer = torch.cuda.current_stream()
    back = torch.from_dlpack(obj)  # torch passes its current stream
    total = back.sum()  # runs on the consumer stream, after the event wait
    consumer.synchronize()
    assert float(total) == 7.0 * (1 << 20)


def test_numpy_refuses_cuda_data():
    np = need("numpy")
    obj = asdlpack(torch.zeros(3, device="cuda"))
    with pytest.raises((BufferError, RuntimeError, ValueError, TypeError)):
        np.from_dlpack(obj)


# --- the CUDA copy engine: strided device copies and copyto on every device pair ----------

SOURCE_LAYOUTS = {
    "contiguous": lambda t: t,
    "transposed": lambda t: t.T,  # element rows: staged through the host
    "column slice": lambda t: t[:, 1:5],  # one 2-D pitched transfer
    "row step": lambda t: t[::2],  # one 2-D pitched transfer (rows of the whole width)
    "reversed": lambda t: t.flip(0),
    "gather": lambda t: t[::2, ::3],
}


def _matrix(device, dtype=torch.float32):
    return torch.arange(6 * 8, dtype=dtype, device=device).reshape(6, 8)


@pytest.mark.parametrize("layout", SOURCE_LAYOUTS)
def test_strided_cuda_copy_true_stays_on_the_device(layout):
    src = SOURCE_LAYOUTS[layout](_matrix("cuda"))
    cap = asdlpack(src).__dlpack__(max_version=(1, 3), copy=True)
    info = CapsuleInfo(cap)
    assert info.device == (2, src.device.index or 0)
    assert info.flags & 2  # IS_COPIED
    copy = torch.from_dlpack(cap)
    assert copy.is_contiguous()
    assert torch.equal(copy, src)


def test_sliced_3d_cuda_to_cpu():
    base = torch.arange(4 * 8 * 10, dtype=torch.int16, device="cuda").reshape(4, 8, 10)
    src = base[:, 1:6, 2:5]  # one 3-D pitched transfer
    back = torch.from_dlpack(asdlpack(src).__dlpack__(max_version=(1, 3), dl_device=(1, 0)))
    assert back.device.type == "cpu"
    assert torch.equal(back, src.cpu())


@pytest.mark.parametrize("layout", SOURCE_LAYOUTS)
def test_copyto_host_to_cuda(layout):
    np = need("numpy")
    src_host = SOURCE_LAYOUTS[layout](_matrix("cpu")).numpy()
    dst = torch.full(src_host.shape, -1.0, device="cuda")
    copyto(dst, src_host)
    assert torch.equal(dst.cpu(), torch.from_numpy(np.ascontiguousarray(src_host)))


@pytest.mark.parametrize("layout", SOURCE_LAYOUTS)
def test_copyto_cuda_to_host(layout):
    np = need("numpy")
    src = SOURCE_LAYOUTS[layout](_matrix("cuda"))
    dst = np.full(tuple(src.shape), -1.0, dtype=np.float32)
    copyto(dst, src)
    assert np.array_equal(dst, src.cpu().numpy())


@pytest.mark.parametrize("src_layout", SOURCE_LAYOUTS)
@pytest.mark.parametrize("dst_layout", ["contiguous", "transposed", "column slice"])
def test_copyto_cuda_to_cuda(src_layout, dst_layout):
    src = SOURCE_LAYOUTS[src_layout](_matrix("cuda"))
    shape = tuple(src.shape)
    if dst_layout == "contiguous":
        dst_base = torch.full(shape, -1.0, device="cuda")
        dst = dst_base
    elif dst_layout == "transposed":
        dst_base = torch.full(shape[::-1], -1.0, device="cuda")
        dst = dst_base.T
    else:
        dst_base = torch.full((shape[0], shape[1] + 3), -1.0, device="cuda")
        dst = dst_base[:, 1 : 1 + shape[1]]
    copyto(dst, src)
    assert torch.equal(dst, src)
    if dst_layout == "column slice":  # bytes around the destination are untouched
        assert bool((dst_base[:, 0] == -1).all()) and bool((dst_base[:, -2:] == -1).all())


def test_copyto_into_a_cuda_view_with_gaps():
    np = need("numpy")
    base = torch.zeros(64, 64, device="cuda")
    src = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    copyto(base[:, ::2], src)  # element rows into a destination with gaps: never its span
    assert torch.equal(base[:, ::2].cpu(), torch.from_numpy(src))
    assert not bool(base[:, 1::2].any())


def test_copyto_cuda_broadcasts_and_overlaps():
    t = torch.arange(10, dtype=torch.float64, device="cuda")
    expected = t.clone()
    expected[1:] = expected[:-1].clone()
    copyto(t[1:], t[:-1])  # shared bytes: staged on the device first
    assert torch.equal(t, expected)
    grid = torch.zeros(4, 5, device="cuda")
    copyto(grid, torch.arange(5, dtype=torch.float32, device="cuda"))
    assert torch.equal(grid, torch.arange(5.0, device="cuda").expand(4, 5))


def test_copyto_on_a_stream_waits_for_the_producer():
    consumer = torch.cuda.Stream()
    dst = torch.empty(1 << 20, device="cuda")
    torch.cuda.synchronize()
    src, _, interface = _slowly_filled(5.0)
    copyto(dst, interface, stream=consumer.cuda_stream)
    consumer.synchronize()
    assert float(dst.min()) == 5.0 and float(dst.max()) == 5.0


def test_copyto_without_a_stream_is_complete_on_return():
    np = need("numpy")
    src = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    dst = np.empty(1 << 20, dtype=np.float32)
    copyto(dst, src)
    assert dst[-1] == float((1 << 20) - 1)


@pytest.mark.skipif(
    not torch_cuda_available() or torch.cuda.device_count() < 2, reason="needs two CUDA devices"
)
@pytest.mark.parametrize("layout", SOURCE_LAYOUTS)
def test_between_two_devices(layout):
    src = SOURCE_LAYOUTS[layout](_matrix("cuda:0"))
    moved = torch.from_dlpack(asdlpack(src).__dlpack__(max_version=(1, 3), dl_device=(2, 1)))
    assert moved.device == torch.device("cuda:1")
    assert torch.equal(moved.cpu(), src.cpu())
    dst = torch.full(tuple(src.shape), -1.0, device="cuda:1").T.contiguous().T
    copyto(dst, src)
    assert torch.equal(dst.cpu(), src.cpu())
