"""Host shared memory: memfd segments, this process's registry of the segments it maps, and
views of them as DLPackObjects.

A segment is an anonymous memory file (``os.memfd_create``): nothing is ever named in /dev/shm,
and its memory lives exactly as long as some process maps it or holds a descriptor of it. It is
sealed against shrinking and growing, so no holder can truncate it under another's mapping
(reads there would raise SIGBUS). The registry finds the segment an address lies in, so memory
already in one is shared without a copy, and the segment a handle names (by device and inode),
so a process maps each segment once, however many handles to it arrive.

Every process that maps a segment it did not make holds a read lock on it; the segments of fresh
copies are reused once no such lock is left (see ``POOL_BYTES``), and the generation number in
each segment's trailer tells a handle to its earlier contents from one to its current ones.
"""

from ._format import (
    TRAILER,
    StaleHandle,
    file_size,
    host_id,
    require_linux,
    size_mismatch,
    stale,
)
from ._pool import POOL_BYTES, POOL_SEGMENTS, clear_pool, pooled
from ._segment import Segment, live_segments, segment_at, segment_named
from ._views import POPULATE_MIN_BYTES, copy_in, empty, view

__all__ = [
    "POOL_BYTES",
    "POOL_SEGMENTS",
    "POPULATE_MIN_BYTES",
    "TRAILER",
    "Segment",
    "StaleHandle",
    "clear_pool",
    "copy_in",
    "empty",
    "file_size",
    "host_id",
    "live_segments",
    "pooled",
    "require_linux",
    "segment_at",
    "segment_named",
    "size_mismatch",
    "stale",
    "view",
]
