"""Arrays of any library through Ray's object store as DLPackObjects: Ray pickles them with
protocol 5 and keeps their memory as out-of-band buffers in its shared-memory store, which
``ray.get`` and a task's arguments read in place."""

from __future__ import annotations

import os
import sys

import pytest

import dlpack

from . import _sharing_workers as workers
from . import _tree_workers as tree_workers
from ._helpers import arrays_of_every_library, need, package_root

np = need("numpy")
ray = need("ray")

# Ray starts its processes through subprocess (fork, then exec at once), which JAX warns about
pytestmark = pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")


@pytest.fixture(scope="module")
def store():
    """A local Ray instance with one worker CPU; yields the file (device, inode) Ray's object
    store maps, found where Ray's own zero-copy numpy path puts an array."""
    # Ray puts the driver's working directory first on its workers' paths: started from a
    # source checkout, they would import its `dlpack` (without the built extension) instead of
    # the one under test. From the folder holding that one, they import it.
    here = os.getcwd()
    os.chdir(package_root())
    try:
        ray.init(
            num_cpus=1,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    finally:
        os.chdir(here)
    try:
        reference = ray.get(ray.put(np.arange(1 << 12, dtype=np.float64)))
        mapped = workers.mapped_file(reference.ctypes.data)
        assert mapped is not None and mapped[2], "Ray's numpy arrays are not in shared memory"
        yield mapped[:2]
    finally:
        ray.shutdown()


def sources():
    """(library name, array, from_dlpack) for every library installed here; each array over
    100 KiB, which Ray would otherwise pass by value inside a task's description."""
    return arrays_of_every_library(np.arange(1 << 18, dtype=np.float32).reshape(512, 512))


def test_put_and_get_read_the_store_in_place(store):
    for name, array, from_dlpack in sources():
        source = dlpack.asdlpack(array)
        ref = ray.put(source)
        got, again = ray.get(ref), ray.get(ref)
        assert type(got) is dlpack.DLPackObject, name
        assert workers.mapped_file(got.data_ptr) == (*store, True), name
        assert again.data_ptr == got.data_ptr, name  # both read the one copy in the store
        assert got.readonly, name  # the store's objects are immutable
        back = from_dlpack(got)  # the caller's own library again
        # each library's own conversion to numpy (__array__), not asdlpack's reading
        assert np.array_equal(np.asarray(back), np.asarray(array)), name


def test_a_task_reads_its_argument_in_place_and_returns_through_the_store(store):
    task = ray.remote(workers.where_and_doubled)
    for name, array, _ in sources():
        source = dlpack.asdlpack(array)
        arrived, mapped, doubled = ray.get(task.remote(source), timeout=120)
        assert arrived == "DLPackObject", name
        # the worker maps the same store file, and its argument lies in it
        assert mapped == (*store, True), name
        assert type(doubled) is dlpack.DLPackObject, name
        assert workers.mapped_file(doubled.data_ptr) == (*store, True), name
        assert np.array_equal(np.from_dlpack(doubled), np.asarray(array) * 2), name


def test_the_task_runs_in_another_process(store):
    array = np.arange(1000.0)
    task = ray.remote(workers.pid_and_sum)
    pid, total = ray.get(task.remote(dlpack.asdlpack(array)), timeout=120)
    assert pid != os.getpid() and total == array.sum()


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="sharing host memory needs Linux (memfd)"
)
def test_a_tree_goes_to_a_ray_task(store):
    """Ray pickles a task's arguments (cloudpickle) to a worker process it started: a shared
    tree travels as its handle, and the worker reads the tree's memory, updates included."""
    shared = dlpack.share_tree({"w": np.arange(10.0), "tag": "x"})
    task = ray.remote(tree_workers.dask_sum)
    pid, total, tag = ray.get(task.remote(shared), timeout=120)
    assert pid != os.getpid() and total == 45.0 and tag == "x"
    shared.update({"w": np.arange(10.0) * 2, "tag": "x"})
    assert ray.get(task.remote(shared), timeout=120)[1:] == (90.0, "x")
