"""Pickling DLPackObject: host memory as out-of-band buffers with protocol 5 (what Dask and Ray
use), bytes in the pickle otherwise; the same shape, strides, element type and read-only flag
on the other side, in this process and in another."""

from __future__ import annotations

import multiprocessing
import pickle

import pytest

import dlpack

from . import _sharing_workers as workers
from ._helpers import need
from .test_sharing import SOURCES

np = need("numpy")


@pytest.fixture(scope="module")
def peer():
    serving = workers.Peer(multiprocessing.get_context("forkserver"))
    yield serving
    serving.close()


@pytest.mark.parametrize(
    "name",
    [
        "c",
        "fortran",
        "transposed",
        "strided",
        "reversed",
        "scalar",
        "empty",
        "broadcast",
        "bfloat16",
        "complex64",
        "bool",
    ],
)
@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_dlpackobject_pickles(name, protocol):
    if name not in SOURCES:
        need("ml_dtypes")
    array = SOURCES[name]
    buffers = []
    data = pickle.dumps(
        dlpack.asdlpack(array), protocol, buffer_callback=buffers.append if protocol >= 5 else None
    )
    restored = pickle.loads(data, buffers=buffers)
    assert type(restored) is dlpack.DLPackObject
    assert workers.elements(restored) == (*workers.numpy_elements(array), not array.flags.writeable)


def test_dense_memory_goes_out_of_band_without_a_copy():
    array = np.arange(1 << 16, dtype=np.float32).reshape(256, 256)
    for layout in (array, array.T):
        source = dlpack.asdlpack(layout)
        buffers = []
        data = pickle.dumps(source, 5, buffer_callback=buffers.append)
        assert len(data) < 200 and len(buffers) == 1
        # The pickle refers to the memory itself, uncopied, as flat bytes.
        lent = buffers[0].raw()
        address = layout.ctypes.data  # numpy's own: both layouts start at the same byte
        assert lent.ndim == 1 and np.frombuffer(lent, np.uint8).ctypes.data == address
        restored = pickle.loads(data, buffers=buffers)
        assert restored.data_ptr == address
        assert np.array_equal(np.from_dlpack(restored), layout)


def test_read_only_flag_survives_pickling():
    frozen = np.arange(4.0)
    frozen.flags.writeable = False
    for protocol in (2, 5):
        assert pickle.loads(pickle.dumps(dlpack.asdlpack(frozen), protocol)).readonly
        assert not pickle.loads(pickle.dumps(dlpack.asdlpack(np.arange(4.0)), protocol)).readonly


def test_dlpackobject_through_multiprocessing(peer):
    array = np.arange(30, dtype=np.int16).reshape(5, 6)[:, ::2]
    assert peer.call("read", dlpack.asdlpack(array)) == (*workers.numpy_elements(array), False)
