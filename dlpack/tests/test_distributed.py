"""Arrays of any library to a Dask distributed worker process and back, as DLPackObjects: Dask
pickles them with protocol 5, and their memory travels as out-of-band frames, uncopied."""

from __future__ import annotations

import os

import pytest

import dlpack

from . import _sharing_workers as workers
from ._helpers import arrays_of_every_library, need

np = need("numpy")
distributed = need("distributed")


@pytest.fixture(scope="module")
def client():
    """A local cluster of one worker process (the same transport as a remote one: TCP)."""
    cluster = distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
    )
    with cluster, distributed.Client(cluster) as connected:
        yield connected


def sources():
    """(library name, array, from_dlpack) for every library installed here."""
    return arrays_of_every_library(np.arange(24, dtype=np.float32).reshape(4, 6))


def test_arrays_of_every_library_go_to_a_worker_and_back(client):
    for name, array, from_dlpack in sources():
        future = client.submit(workers.doubled_with_numpy, dlpack.asdlpack(array), pure=False)
        returned = future.result(timeout=60)
        assert type(returned) is dlpack.DLPackObject, name
        back = from_dlpack(returned)  # the caller's own library again
        # each library's own conversion to numpy (__array__), not asdlpack's reading
        assert np.array_equal(np.asarray(back), np.asarray(array) * 2), name


def test_the_worker_is_another_process(client):
    array = np.arange(1000.0)
    pid, total = client.submit(workers.pid_and_sum, dlpack.asdlpack(array)).result(timeout=60)
    assert pid != os.getpid() and total == array.sum()


def test_torch_on_the_worker(client):
    need("torch")
    scattered = client.scatter(dlpack.asdlpack(np.arange(5, dtype=np.int64)))
    returned = client.submit(workers.plus_one_with_torch, scattered).result(timeout=60)
    assert np.from_dlpack(returned).tolist() == [1, 2, 3, 4, 5]


def test_memory_goes_out_of_band_uncopied():
    """What Dask sends: a small pickle and the memory itself as a frame."""
    from distributed.protocol import deserialize, serialize

    array = np.arange(1 << 16, dtype=np.float64)
    header, frames = serialize(dlpack.asdlpack(array), serializers=("dask", "pickle"))
    addresses = [np.frombuffer(frame, np.uint8).ctypes.data for frame in frames if len(frame)]
    assert array.ctypes.data in addresses
    assert sum(len(frame) for frame in frames) < array.nbytes + 1024  # no second copy inside
    restored = deserialize(header, frames)
    assert type(restored) is dlpack.DLPackObject and restored.data_ptr == array.ctypes.data
