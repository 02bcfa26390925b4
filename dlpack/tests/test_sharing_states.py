"""A handle's pickled state is one ``bytes`` read by the extension: whatever bytes arrive (a
state cut short, altered, or not one at all), unpickling opens the memory the state names or
refuses with ValueError or BufferError, never a crash, and never memory outside the segment.
And where a handle arrives, ``asdlpack`` takes the view it holds as it is.
"""

from __future__ import annotations

import os
import pickle
import sys

import pytest

import dlpack

from . import _sharing_workers as workers
from ._helpers import need

np = need("numpy")
hypothesis = need("hypothesis")
st = need("hypothesis.strategies")

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="sharing host memory needs Linux (memfd)"
)

SOURCE = np.arange(24.0).reshape(4, 6)[:, ::2]


def opened_or_refused(state: bytes, segment: tuple[int, int] | None = None) -> None:
    """Unpickle ``state``: refused, or what it opens is read in full and lies in a dlpack
    segment (the file ``segment``, (device, inode), where the test knows which)."""
    try:
        handle = workers.handles._rebuild(state)
    except (ValueError, BufferError):
        return
    # A forged but consistent state may name another layout of the segment's bytes.
    assert_inside_a_segment(np.asarray(dlpack.asdlpack(handle)), segment)


def assert_inside_a_segment(array, segment: tuple[int, int] | None = None) -> None:
    """Every byte of ``array`` (as numpy lays it out) lies in one mapping of a dlpack segment
    in this process, within the segment file's size, and reading it gives the file's bytes
    there (read apart, with pread)."""
    data = array.tobytes()  # reads every element: out of bounds, this faults
    if array.size == 0:
        return
    address = array.ctypes.data
    reaches = [(n - 1) * s for n, s in zip(array.shape, array.strides, strict=True)]
    low = address + sum(min(0, reach) for reach in reaches)
    high = address + sum(max(0, reach) for reach in reaches) + array.itemsize
    mapping = mapping_of(low)
    assert mapping is not None and mapping[4].endswith("/memfd:dlpack-share (deleted)"), mapping
    start, end, file_offset, inode, _ = mapping
    assert high <= end, (hex(low), hex(high), mapping)
    fd = descriptor_of(inode)
    stat = os.fstat(fd)
    if segment is not None:
        assert (stat.st_dev, stat.st_ino) == segment
    file_bytes = os.pread(fd, stat.st_size, 0)
    # numpy checks that this layout fits the file's bytes (ValueError otherwise)
    in_file = np.ndarray(
        array.shape,
        array.dtype,
        buffer=file_bytes,
        offset=file_offset + address - start,
        strides=array.strides,
    )
    assert data == in_file.tobytes()


def mapping_of(address: int) -> tuple[int, int, int, int, str] | None:
    """The mapping holding ``address``, from /proc/self/maps: (start, end, file offset, inode,
    its line)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, _, offset, _, inode = line.split()[:5]
            start, end = (int(e, 16) for e in span.split("-"))
            if start <= address < end:
                return start, end, int(offset, 16), int(inode), line.rstrip()
    return None


def descriptor_of(inode: int) -> int:
    """A descriptor this process holds for the dlpack segment file ``inode``."""
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
            if "memfd:dlpack-share" in target and os.stat(int(name)).st_ino == inode:
                return int(name)
        except OSError:  # the descriptor listdir itself used, closed since
            continue
    raise AssertionError(f"no descriptor of segment inode {inode} here")


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(data=st.binary(max_size=300))
def test_any_bytes_open_or_are_refused(data):
    opened_or_refused(data)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(data=st.data())
def test_altered_states_open_or_are_refused(data):
    fields = workers.fields_of(dlpack.share(SOURCE))
    state = bytearray(workers.pack(fields))
    edits = data.draw(
        st.lists(
            st.tuples(st.integers(0, len(state) - 1), st.integers(1, 255)), min_size=1, max_size=4
        )
    )
    for at, xor in edits:
        state[at] ^= xor
    cut = data.draw(st.integers(0, len(state)))
    opened_or_refused(bytes(state[:cut]), fields["segment"]["file"])


def test_a_state_that_is_not_bytes_is_refused():
    for state in ("text", None, bytearray(b"DLSH"), (3, "x")):
        with pytest.raises(ValueError, match="not a dlpack shared-memory handle"):
            workers.handles._rebuild(state)


def test_asdlpack_takes_the_view_a_handle_holds():
    shared = np.asarray(dlpack.empty_shared((4, 6), "float64"))
    shared[:] = np.arange(24.0).reshape(4, 6)
    handle = pickle.loads(pickle.dumps(dlpack.share(shared[:, ::2])))  # shared as it lies
    view = dlpack.asdlpack(handle)
    assert type(view) is dlpack.DLPackObject and view.readonly
    assert dlpack.asdlpack(handle) is view  # the same object: no capsule, no copy
    assert np.array_equal(np.asarray(view), SOURCE)
    assert view.shape == SOURCE.shape and view.strides == (6, 2)
    del handle  # the view alone keeps the memory
    assert np.array_equal(np.asarray(view), SOURCE)
    writable = dlpack.share(dlpack.empty_shared(3, "int8"), writable=True)
    assert not dlpack.asdlpack(pickle.loads(pickle.dumps(writable))).readonly


def test_the_segment_check_passes_what_opens_and_fails_elsewhere():
    fields = workers.fields_of(dlpack.share(SOURCE))
    segment = fields["segment"]["file"]
    opened = np.asarray(dlpack.asdlpack(workers.handles._rebuild(workers.pack(fields))))
    assert np.array_equal(opened, SOURCE)
    assert_inside_a_segment(opened, segment)
    # A forged but consistent layout opens: the last row, reversed, in the copy's C order.
    fields = workers.fields_of(dlpack.share(SOURCE))
    fields.update(offset=11 * 8, shape=[3], strides=[-8])
    reversed_row = np.asarray(dlpack.asdlpack(workers.handles._rebuild(workers.pack(fields))))
    assert reversed_row.tolist() == SOURCE[-1, ::-1].tolist()
    assert_inside_a_segment(reversed_row, fields["segment"]["file"])
    with pytest.raises(AssertionError, match="dlpack-share"):
        assert_inside_a_segment(np.arange(4.0))  # this process's own memory
    with pytest.raises(AssertionError):
        assert_inside_a_segment(opened, (segment[0], segment[1] + 1))  # another file
