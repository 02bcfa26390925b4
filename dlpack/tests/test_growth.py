"""Memory over many exchanges: no growth of the process's memory or of Python objects, per source
kind, per object, and for fresh sources each time."""

import ctypes
import os

import pytest

from dlpack import asdlpack

from ._helpers import (
    ArrayInterface,
    ArrayStruct,
    Buf,
    collect,
    need,
)

# ---------------------------------------------------------------------------
# no growth over many exchanges
# ---------------------------------------------------------------------------


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _rss_growth(batch, warm_up, measured):
    """Bytes the process grew by over `batch(measured)`, after `batch(warm_up)` settled it."""
    batch(warm_up)
    collect()
    before = _rss_bytes()
    batch(measured)
    collect()
    return _rss_bytes() - before


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc/self/statm")
def test_no_growth_fresh_sources():
    """A leaked source (or its export) would cost >= 8 KiB per iteration: 160 MB here."""
    np = need("numpy")

    def once():
        src = bytearray(8192)
        obj = asdlpack(src)
        c1 = obj.__dlpack__(max_version=(1, 3))
        c2 = obj.__dlpack__()
        out = np.from_dlpack(obj)
        out[0] = 1
        del c1, c2, out, obj, src

    def batch(n):
        for _ in range(n):
            once()

    grown = _rss_growth(batch, 2000, 20000)
    assert grown < 32 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB"


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc/self/statm")
def test_no_growth_small_exports():
    """Unconsumed, consumed and copied capsules of one source: per-export structs must be freed."""
    np = need("numpy")
    src = np.zeros((4, 4, 4, 4), dtype=np.float32)[:, ::2]  # ndim 4 -> bigger shape arrays
    obj = asdlpack(src)

    def batch(n):
        for _ in range(n):
            obj.__dlpack__(max_version=(1, 3))
            obj.__dlpack__()
            np.from_dlpack(obj)
            asdlpack(obj.__dlpack__(max_version=(1, 0)))
            obj.__dlpack__(max_version=(1, 3), copy=True)

    grown = _rss_growth(batch, 5000, 40000)
    # a leak of >= 64 bytes per export would be >= 12 MiB
    assert grown < 6 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB"


def _interface_over(buffer):
    address = ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer))
    iface = {"shape": (len(buffer),), "typestr": "|u1", "data": (address, False), "version": 3}
    return ArrayInterface(iface, owner=buffer)


def _numpy():
    return need("numpy")


_OWNER_KINDS = {
    "buffer": lambda: bytearray(16),
    "memoryview": lambda: memoryview(bytearray(16))[::2],
    "array interface": lambda: _interface_over(bytearray(16)),
    "array struct": lambda: ArrayStruct(_numpy().zeros(16, dtype="uint8")),
    "numpy": lambda: _numpy().zeros((4, 4), dtype="float32")[:, ::2],
    "dlpack capsule": lambda: asdlpack(bytearray(16)).__dlpack__(max_version=(1, 3)),
}


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc/self/statm")
@pytest.mark.parametrize("kind", sorted(_OWNER_KINDS))
def test_no_growth_per_object(kind):
    """Each owner kind releases everything it holds when its object goes: a leaked buffer view
    or description (>= 64 bytes per object) would be >= 9 MiB here."""
    make = _OWNER_KINDS[kind]
    sources = [make() for _ in range(64)]

    def batch(n):
        for k in range(n):
            if kind == "dlpack capsule":
                asdlpack(make())
            else:
                asdlpack(sources[k % 64])

    grown = _rss_growth(batch, 10000, 150000)
    assert grown < 4 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB"


def test_no_python_object_growth():
    import tracemalloc

    src = Buf(bytes(64))

    def batch(n):
        for _ in range(n):
            obj = asdlpack(memoryview(src)[::2])
            obj.__dlpack__(max_version=(1, 3))
            obj.__dlpack__()

    batch(1000)
    collect()
    tracemalloc.start()
    try:
        snap0 = tracemalloc.take_snapshot()
        batch(20000)
        collect()
        snap1 = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    stats = snap1.compare_to(snap0, "filename")
    grown = sum(s.size_diff for s in stats)
    assert grown < 512 * 1024, f"traced Python memory grew by {grown} bytes"
