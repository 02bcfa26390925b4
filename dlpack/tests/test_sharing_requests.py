"""What a ``SharedHandle`` says and lends when asked directly: its device, and ``__dlpack__``
with each request a consumer can make (legacy or versioned capsule, copy, device, stream), in
the process that shared it and in one that received it; and ``empty_shared`` sizes that can't
be had.

Values are checked against the numpy source, and whether memory is the segment's against this
process's own mappings (/proc/self/maps), not against what ``asdlpack`` reports.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import sys

import pytest

import dlpack

from . import _sharing_workers as workers
from ._helpers import need, optional

np = need("numpy")

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="sharing host memory needs Linux (memfd)"
)

CPU = (dlpack.DLDeviceType.kDLCPU, 0)
SOURCE = np.arange(12.0).reshape(3, 4)


class Lent:
    """Hands numpy one capsule as it is (numpy's from_dlpack takes only objects)."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **_request):
        return self.capsule

    def __dlpack_device__(self):
        return CPU


def capsule_name(capsule) -> bytes:
    name = ctypes.pythonapi.PyCapsule_GetName
    name.argtypes = [ctypes.py_object]
    name.restype = ctypes.c_char_p
    return name(capsule)


def in_segment(address: int, handle) -> bool:
    """Whether this process maps ``address`` from the segment file ``handle`` names."""
    mapped = workers.mapped_file(address)
    if mapped is None:
        return False
    major, minor = (int(part, 16) for part in mapped[0].split(":"))
    return (os.makedev(major, minor), int(mapped[1])) == handle._memory[1]


@pytest.fixture(params=["producer", "receiver"])
def side(request):
    """A handle as the producer holds it, or as a receiver has it (unpickled: opened here)."""
    return (lambda handle: handle) if request.param == "producer" else received


def received(handle):
    return pickle.loads(pickle.dumps(handle))


def consume(handle, **request) -> np.ndarray:
    return np.from_dlpack(Lent(handle.__dlpack__(**request)))


# -- device ---------------------------------------------------------------------------------


def test_device_is_the_sources(side):
    sources = [SOURCE, np.asarray(dlpack.empty_shared(3, "int8"))]
    torch = optional("torch")
    if torch is not None:
        sources.append(torch.arange(4.0))
    for source in sources:
        handle = side(dlpack.share(source))
        assert source.__dlpack_device__() == CPU  # what the library itself says
        assert handle.device == CPU and handle.__dlpack_device__() == CPU
        assert type(handle.device[0]) is int  # plain ints, as __dlpack_device__ promises


# -- capsules -------------------------------------------------------------------------------


def test_versioned_capsule_lends_the_segment_read_only(side):
    handle = side(dlpack.share(SOURCE))
    for request in ({"max_version": (1, 0)}, {"max_version": (1, 3)}, {"max_version": (2, 0)}):
        capsule = handle.__dlpack__(**request)
        assert capsule_name(capsule) == b"dltensor_versioned", request
        array = np.from_dlpack(Lent(capsule))
        assert np.array_equal(array, SOURCE) and array.shape == SOURCE.shape
        assert in_segment(array.ctypes.data, handle), request
        assert not array.flags.writeable  # the READ_ONLY flag numpy honours


def test_legacy_capsule_of_read_only_memory_is_a_copy(side):
    """A legacy capsule can't say read-only: the consumer gets a copy of the elements."""
    handle = side(dlpack.share(SOURCE))
    for request in ({}, {"max_version": None}, {"max_version": (0, 8)}):
        capsule = handle.__dlpack__(**request)
        assert capsule_name(capsule) == b"dltensor", request
        array = np.from_dlpack(Lent(capsule))
        assert np.array_equal(array, SOURCE), request
        assert not in_segment(array.ctypes.data, handle), request
    with pytest.raises(BufferError, match="read-only memory can't be handed .* copy=False"):
        handle.__dlpack__(copy=False)


def test_legacy_capsule_of_writable_memory_is_the_segment(side):
    shared = np.asarray(dlpack.empty_shared((3, 4), "float64"))
    shared[:] = SOURCE
    handle = side(dlpack.share(shared, writable=True))
    for request in ({}, {"copy": False}):
        capsule = handle.__dlpack__(**request)
        assert capsule_name(capsule) == b"dltensor", request
        array = np.from_dlpack(Lent(capsule))
        assert array.ctypes.data == shared.ctypes.data and in_segment(array.ctypes.data, handle)
        assert np.array_equal(array, SOURCE)


def test_copy_true_is_a_private_copy(side):
    shared = np.asarray(dlpack.empty_shared((3, 4), "float64"))
    shared[:] = SOURCE
    handle = side(dlpack.share(shared, writable=True))
    for request in ({"copy": True}, {"copy": True, "max_version": (1, 0)}):
        copied = consume(handle, **request)
        assert np.array_equal(copied, SOURCE), request
        assert copied.ctypes.data != shared.ctypes.data, request
        assert not in_segment(copied.ctypes.data, handle), request
    assert copied.flags.writeable  # the versioned copy is the consumer's own
    copied[:] = -1
    assert np.array_equal(shared, SOURCE)  # the shared memory is untouched
    assert np.array_equal(consume(handle, max_version=(1, 0)), SOURCE)


def test_copy_false_lends_the_segment(side):
    handle = side(dlpack.share(SOURCE))
    array = consume(handle, max_version=(1, 0), copy=False)
    assert np.array_equal(array, SOURCE) and in_segment(array.ctypes.data, handle)


def test_numpy_from_dlpack_requests(side):
    """numpy's own requests (it passes max_version, copy and device itself)."""
    handle = side(dlpack.share(SOURCE))
    lent = np.from_dlpack(handle, copy=False, device="cpu")
    assert np.array_equal(lent, SOURCE) and in_segment(lent.ctypes.data, handle)
    copied = np.from_dlpack(handle, copy=True)
    assert np.array_equal(copied, SOURCE) and not in_segment(copied.ctypes.data, handle)


# -- devices asked for ----------------------------------------------------------------------


def test_the_cpu_asked_for_is_the_segment(side):
    handle = side(dlpack.share(SOURCE))
    for request in ({"dl_device": CPU}, {"dl_device": (1, 0), "copy": False}):
        array = consume(handle, max_version=(1, 0), **request)
        assert np.array_equal(array, SOURCE) and in_segment(array.ctypes.data, handle)


def test_other_devices_are_refused(side):
    handle = side(dlpack.share(SOURCE))
    with pytest.raises(BufferError, match="moving to another device, and copy=False forbids"):
        handle.__dlpack__(max_version=(1, 0), dl_device=(2, 0), copy=False)
    for device, name in (((4, 0), "opencl:0"), ((1, 1), "cpu:1")):
        with pytest.raises(BufferError, match=f"on {name}: only moves between the CPU and CUDA"):
            handle.__dlpack__(max_version=(1, 0), dl_device=device)
    with pytest.raises(ValueError, match="stream must be None"):
        handle.__dlpack__(stream=1)


def test_cuda_asked_for_is_a_copy_there_or_refused(side):
    """copy=None allows a move: to CUDA where there is one, else a BufferError saying why."""
    handle = side(dlpack.share(SOURCE))
    torch = optional("torch")
    if torch is None or not torch.cuda.is_available():
        with pytest.raises(BufferError, match="can't copy to cuda:0"):
            handle.__dlpack__(max_version=(1, 0), dl_device=(2, 0))
        return
    capsule = handle.__dlpack__(max_version=(1, 0), dl_device=(2, 0))
    moved = torch.utils.dlpack.from_dlpack(capsule)
    assert moved.device.type == "cuda" and moved.device.index == 0
    assert torch.equal(moved.cpu(), torch.from_numpy(SOURCE))


def test_read_only_memory_in_shared_memory_is_never_shared_writable(side):
    """Read-only memory lies in a segment already (a read-only view of an empty_shared array, a
    read-only handle received): a writable handle to it is refused, not found and lent."""
    shared = np.asarray(dlpack.empty_shared((3, 4), "float64"))
    shared[...] = SOURCE
    view = shared.view()
    view.flags.writeable = False
    read_only = side(dlpack.share(shared))
    for source in (view, read_only):
        with pytest.raises(ValueError, match="^read-only memory can't be shared writable$"):
            dlpack.share(source, writable=True)
    assert dlpack.share(shared, writable=True).writable  # the writable array itself may be


# -- empty_shared sizes ---------------------------------------------------------------------


def test_empty_shared_sizes_past_an_address_space_are_a_value_error():
    for shape, message in [
        ((2**62, 8), r"has more than 2\*\*63 elements"),
        ((2**40, 2**40), r"has more than 2\*\*63 elements"),
        ((2**61,), r"address(es)? more than 2\*\*63 bytes"),
        ((0, 2**62), r"address(es)? more than 2\*\*63 bytes"),  # no elements, still no layout
        ((2**63, 0), r"extent 9223372036854775808 of shape .* does not fit in 64 bits"),
        ((0, 2**70), r"extent 1180591620717411303424 of shape .* does not fit in 64 bits"),
        ((3, -1), r"negative extent -1 in shape \[3, -1\]"),
    ]:
        with pytest.raises(ValueError, match=message):
            dlpack.empty_shared(shape, "float64")


def test_empty_shared_sizes_no_machine_has_are_a_memory_error():
    """Sizes an address space holds but memory doesn't: refused before anything is allocated."""
    for shape in ((sys.maxsize // 8,), (2**57,)):
        with pytest.raises(MemoryError, match="can't allocate [0-9]+ bytes .* of shared memory"):
            dlpack.empty_shared(shape, "float64")
