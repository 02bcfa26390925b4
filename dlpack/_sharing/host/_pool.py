"""Reuse of fresh copies' segments: their open files outlive their Segment objects, and are
kept (within limits) for the next fresh copy of the same size once no process maps them."""

from __future__ import annotations

import collections
import os
import threading

from ..._dlpack import _lock_file

# Reuse: the segments of fresh copies whose every view, handle and pin here is gone are kept
# (up to these limits: a few arrays of up to 1 GiB each, on a machine of 16 GiB or more) for the
# next fresh copy of the same size, which then costs a copy into memory already there instead of
# allocating it (page faults are most of a fresh share's time). Each process that maps a segment
# holds a read lock on it (an open file description lock, which the kernel drops when the process
# closes the file or dies), and a kept segment is reused only once no lock is left: no process
# can still see it.
POOL_SEGMENTS = 4
POOL_BYTES = min(2 << 30, (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // 8)


class _Files:
    """A segment's open files, which outlive its Segment objects when it is kept for reuse:
    ``fds`` (the first is the one mapped; all are closed together), the read-only one lent to
    read-only handles, and whether this process may reuse the segment."""

    __slots__ = ("fds", "key", "owner", "poolable", "readonly_fd", "size")

    def __init__(self, fd: int, size: int, key: tuple[int, int], poolable: bool):
        self.fds = [fd]
        self.readonly_fd: int | None = None
        self.size = size
        self.key = key
        self.poolable = poolable
        self.owner = os.getpid()  # a forked child never reuses what it inherited

    def close(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds.clear()

    def release(self) -> None:
        """The last Segment of these files is gone: keep them for reuse, or close them."""
        if not (self.poolable and self.owner == os.getpid() and _pool_keep(self)):
            self.close()


# The kept segments. Finalizers (which run in any thread, and inside any allocation, a garbage
# collection's) only append to ``_returned``; the list itself changes under ``_pool_lock`` alone,
# so that no segment is handed out twice or lost.
_pool: list[_Files] = []
_returned: collections.deque[_Files] = collections.deque()
_pool_lock = threading.Lock()


def _pool_keep(files: _Files) -> bool:
    if files.size > POOL_BYTES:
        return False
    _returned.append(files)
    if _pool_lock.acquire(blocking=False):  # else the holder, or the next caller, tidies up
        try:
            _tidy()
        finally:
            _pool_lock.release()
    return True


def _tidy() -> None:
    """Move returned segments into the pool and close the oldest beyond its limits (with
    ``_pool_lock`` held)."""
    while _returned:
        _pool.append(_returned.popleft())
    while len(_pool) > POOL_SEGMENTS or sum(f.size for f in _pool) > POOL_BYTES:
        _pool.pop(0).close()


def _pool_take(size: int) -> _Files | None:
    """Kept files of ``size`` bytes that no process maps any more (write-locked while the new
    generation is written: see ``Segment.reuse``), or None."""
    with _pool_lock:
        _tidy()
        for files in _pool:
            if files.size == size and _lock_file(files.fds[0], "write"):
                _pool.remove(files)
                return files
    return None


def pooled() -> int:
    """How many segments are kept for reuse (for tests)."""
    with _pool_lock:
        _tidy()
        return len(_pool)


def clear_pool() -> None:
    """Close the segments kept for reuse, returning their memory."""
    with _pool_lock:
        _tidy()
        while _pool:
            _pool.pop().close()


def _forget_pool_after_fork() -> None:
    """A forked child: the kept segments are the parent's to reuse (forget them; the parent
    keeps its descriptors)."""
    global _pool_lock
    _pool_lock = threading.Lock()  # another thread of the parent may have held it
    while _returned:
        _returned.popleft().close()
    while _pool:
        _pool.pop().close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_after_fork)
