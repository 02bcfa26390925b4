"""A handle's pickled state is one ``bytes`` read by the extension: whatever bytes arrive (a
state cut short, altered, or not one at all), unpickling opens the memory the state names or
refuses with ValueError or BufferError, never a crash, and never memory outside the segment.
And where a handle arrives, ``asdlpack`` takes the view it holds as it is.
"""

from __future__ import annotations

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


def opened_or_refused(state: bytes) -> None:
    try:
        handle = workers.handles._rebuild(state)
    except (ValueError, BufferError):
        return
    # It opened: what it shows lies in the segment it names, and is the source's elements or
    # another view of them (a forged but consistent state may name a different layout).
    view = dlpack.asdlpack(handle)
    assert memoryview(view).nbytes == view.nbytes


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(data=st.binary(max_size=300))
def test_any_bytes_open_or_are_refused(data):
    opened_or_refused(data)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(data=st.data())
def test_altered_states_open_or_are_refused(data):
    state = bytearray(workers.pack(workers.fields_of(dlpack.share(SOURCE))))
    edits = data.draw(
        st.lists(
            st.tuples(st.integers(0, len(state) - 1), st.integers(1, 255)), min_size=1, max_size=4
        )
    )
    for at, xor in edits:
        state[at] ^= xor
    cut = data.draw(st.integers(0, len(state)))
    opened_or_refused(bytes(state[:cut]))


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
