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

from __future__ import annotations

import bisect
import collections
import fcntl
import math
import mmap
import os
import stat
import sys
import threading
import weakref

from .._dlpack import (
    DLPackObject,
    _from_buffer,
    _lock_file,
    _populate_write,
    asdlpack,
    copyto,
    dense_strides,
)

# Sealed this way, the file's size is fixed for good: a mapping of it can never fault.
_SEALS = (
    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL if sys.platform == "linux" else 0
)

# Below this, faulting pages in as the copy writes them costs less than starting threads.
POPULATE_MIN_BYTES = 4 << 20

_host_id: str | None = None


def require_linux() -> None:
    if sys.platform != "linux" or not hasattr(os, "memfd_create"):
        raise BufferError(f"sharing host memory needs Linux (memfd_create); this is {sys.platform}")


def host_id() -> str:
    """This machine's identity in handles: the kernel's boot id, new at every boot and
    different on every machine, so a handle opened elsewhere is recognised as foreign."""
    global _host_id
    if _host_id is None:
        require_linux()
        with open("/proc/sys/kernel/random/boot_id") as f:
            _host_id = f.read().strip()
    return _host_id


# Every segment ends in this many bytes holding its generation: a random number, new each time
# the segment is reused for other data, which a handle carries, so that a handle to the
# segment's earlier contents can't open the new ones.
TRAILER = 8


def file_size(nbytes: int) -> int:
    """The length of a segment for ``nbytes`` bytes of elements: rounded up to whole 8-byte
    words (so the generation is aligned), then the trailer."""
    return -(-nbytes // TRAILER) * TRAILER + TRAILER


def size_mismatch(named: int, actual: int) -> ValueError:
    return ValueError(
        f"the handle says its segment holds {named} bytes, but it holds {actual} (a forged or "
        "corrupted handle)"
    )


# Reuse: the segments of fresh copies whose every view, handle and pin here is gone are kept
# (up to these limits: a few arrays of up to 1 GiB each, on a machine of 16 GiB or more) for the
# next fresh copy of the same size, which then costs a copy into memory already there instead of
# allocating it (page faults are most of a fresh share's time). Each process that maps a segment
# holds a read lock on it (an open file description lock, which the kernel drops when the process
# closes the file or dies), and a kept segment is reused only once no lock is left: no process
# can still see it.
POOL_SEGMENTS = 4
POOL_BYTES = min(2 << 30, (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // 8)


class StaleHandle(BufferError):
    """A handle to contents its segment no longer holds."""


def stale() -> StaleHandle:
    return StaleHandle(
        "this handle was already opened from its pickle, and its memory has been reused since "
        "(each pickle opens while its memory is still shared)"
    )


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


class Segment:
    """A memory file and this process's one mapping of it.

    It lives while the mapping does (a finalizer of the mmap, which every view's buffer keeps
    alive, holds it), or while the lender holds it for a handle in flight; its files are closed
    (or kept for reuse) when it dies. ``key`` is the file's (device, inode): the same file in
    every process; ``size`` its length, trailer included.
    """

    __slots__ = ("__weakref__", "_files", "_mapping", "base", "generation", "writable")

    def __init__(self, files: _Files, writable: bool):
        self._files = files
        weakref.finalize(self, files.release).atexit = False
        self.writable = writable
        self.generation = 0
        self._mapping: weakref.ref[mmap.mmap] | None = None
        self.base = 0

    @classmethod
    def create(cls, nbytes: int, poolable: bool = False) -> tuple[Segment, mmap.mmap]:
        """A new zero-filled segment for ``nbytes`` bytes (at least 1), mapped writable;
        ``poolable``: kept for reuse once nothing maps it."""
        require_linux()
        size = file_size(nbytes)
        fd = os.memfd_create("dlpack-share", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            info = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        segment = cls(_Files(fd, size, (info.st_dev, info.st_ino), poolable), True)
        mapping = segment._map()
        segment._new_generation(mapping)
        return segment, mapping

    @classmethod
    def reuse(cls, nbytes: int) -> tuple[Segment, mmap.mmap] | None:
        """A kept segment for ``nbytes`` bytes that no process maps any more, mapped writable
        with a new generation, or None. The write lock taken to find it unmapped is held until
        the new generation is written, so a process opening an old handle meanwhile finds the
        lock (or the new generation) and refuses."""
        files = _pool_take(file_size(nbytes))
        if files is None:
            return None
        try:
            segment = cls(files, True)
            mapping = segment._map(populate=True)
            segment._new_generation(mapping)
        finally:
            _lock_file(files.fds[0], "unlock")
        return segment, mapping

    @classmethod
    def adopt(
        cls,
        fd: int,
        size: int,
        writable: bool,
        key: tuple[int, int],
        generation: int,
        description_of_ours: bool,
    ) -> tuple[Segment, mmap.mmap]:
        """Map a descriptor received for a handle, after checking it is the sealed memory file
        of ``size`` bytes the handle names, at the generation it names; the descriptor is ours
        to close from now on. ``description_of_ours``: it was opened here (through /proc), not
        passed (a passed one shares the lender's file description, and so its locks)."""
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) != tuple(key):
                raise BufferError("the descriptor received is not the segment the handle names")
            if info.st_size != size:
                raise size_mismatch(size, info.st_size)
            if not fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK:
                raise BufferError(
                    "the segment received is not sealed against shrinking, so a mapping of it "
                    "could fault: not a dlpack segment"
                )
            access = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
            if writable and access != os.O_RDWR:
                raise BufferError("the segment received for a writable handle is read-only")
            if not description_of_ours:
                passed, fd = fd, os.open(f"/proc/self/fd/{fd}", access | os.O_CLOEXEC)
                os.close(passed)
            if not _lock_file(fd, "read"):
                raise stale()  # its producer is reusing it for other data right now
        except BaseException:
            os.close(fd)
            raise
        segment = cls(_Files(fd, size, tuple(key), poolable=False), writable)
        mapping = segment._map()
        if segment.generation != generation:
            raise stale()
        return segment, mapping

    def _map(self, populate: bool = False) -> mmap.mmap:
        rw = mmap.PROT_READ | mmap.PROT_WRITE
        populated = mmap.MAP_POPULATE if populate else 0
        if self.writable:
            flags = mmap.MAP_SHARED | populated
            mapping = mmap.mmap(self.fd, self.size, flags=flags, prot=rw)
        else:
            # Copy-on-write from a read-only descriptor: the producer's memory can't be written
            # through it, and a consumer that writes despite the read-only flag (torch ignores
            # it) changes only pages of its own, instead of crashing on a read-only mapping.
            mapping = mmap.mmap(self.fd, self.size, flags=mmap.MAP_PRIVATE, prot=rw)
        self.generation = int.from_bytes(mapping[self.size - TRAILER :], "little")
        self.base = asdlpack(mapping).data_ptr
        self._mapping = weakref.ref(mapping)
        weakref.finalize(mapping, _unmapped, self).atexit = False
        _register(self)
        return mapping

    def _new_generation(self, mapping: mmap.mmap) -> None:
        self.generation = int.from_bytes(os.urandom(TRAILER), "little")
        mapping[self.size - TRAILER :] = self.generation.to_bytes(TRAILER, "little")

    def hold_after_fork(self) -> None:
        """In a forked child that inherited this segment's mapping: a lock of the child's own,
        so that the parent, whose locks don't count its own mappings, can't reuse the segment
        while the child sees it."""
        fd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)
        self._files.fds.append(fd)
        self._files.poolable = False
        _lock_file(fd, "read")

    @property
    def fd(self) -> int:
        return self._files.fds[0]

    @property
    def size(self) -> int:
        return self._files.size

    @property
    def key(self) -> tuple[int, int]:
        return self._files.key

    def mapping(self) -> mmap.mmap | None:
        """The live mapping, or None once every view of it is gone."""
        return None if self._mapping is None else self._mapping()

    def remap(self) -> mmap.mmap:
        """A mapping of this segment: the live one, or a new one (of a descriptor of our own)."""
        mapping = self.mapping()
        if mapping is None:
            mapping = self._map()
        return mapping

    def fd_for(self, writable: bool) -> int:
        """The descriptor to lend: this one for a writable handle, otherwise a read-only one
        (opened once, through /proc, as a new read-only open of the same file), through which
        no process can map the memory writable."""
        if writable or not self.writable:
            return self.fd
        files = self._files
        if files.readonly_fd is None:
            flags = os.O_RDONLY | os.O_CLOEXEC
            files.readonly_fd = os.open(f"/proc/self/fd/{self.fd}", flags)
            files.fds.append(files.readonly_fd)
        return files.readonly_fd


# The registry: live segments by the address of their mapping (bases sorted for bisection) and
# by file. Every change and lookup is a few GIL-atomic operations; a finalizer may run between
# them (a garbage collection), so lookups tolerate entries vanishing under them.
_by_base: dict[int, weakref.ref[Segment]] = {}
_bases: list[int] = []
_by_key: dict[tuple[int, int, bool], weakref.ref[Segment]] = {}


def _register(segment: Segment) -> None:
    ref = weakref.ref(segment)
    if segment.base not in _by_base:
        bisect.insort(_bases, segment.base)
    _by_base[segment.base] = ref
    _by_key[(*segment.key, segment.writable)] = ref


def _unmapped(segment: Segment) -> None:
    """The mapping of ``segment`` is gone: forget its address, which may be reused from now."""
    segment._mapping = None
    ref = _by_base.get(segment.base)
    if ref is not None and ref() is segment:
        del _by_base[segment.base]
        index = bisect.bisect_left(_bases, segment.base)
        if index < len(_bases) and _bases[index] == segment.base:
            del _bases[index]
    key = (*segment.key, segment.writable)
    ref = _by_key.get(key)
    if ref is not None and ref() is segment:
        del _by_key[key]


def segment_at(low: int, high: int) -> tuple[Segment, mmap.mmap] | None:
    """The live segment whose mapping holds the addresses [low, high), with its mapping."""
    try:
        base = _bases[bisect.bisect_right(_bases, low) - 1] if _bases else None
    except IndexError:  # emptied by a finalizer meanwhile
        return None
    if base is None or base > low:
        return None
    ref = _by_base.get(base)
    segment = None if ref is None else ref()
    mapping = None if segment is None else segment.mapping()
    if segment is None or mapping is None or high > segment.base + segment.size - TRAILER:
        return None
    return segment, mapping


def segment_named(key: tuple[int, int], writable: bool) -> tuple[Segment, mmap.mmap] | None:
    """The live segment of the file ``key`` mapped here, writable if asked (a read-only handle
    is served by either mapping)."""
    for mode in (True,) if writable else (False, True):
        ref = _by_key.get((*key, mode))
        segment = None if ref is None else ref()
        mapping = None if segment is None else segment.mapping()
        if mapping is not None:
            return segment, mapping
    return None


def live_segments() -> int:
    """How many segments this process maps (for tests and leak checks)."""
    return sum(1 for ref in list(_by_base.values()) if ref() is not None)


# -- views --------------------------------------------------------------------------------------


def view(
    memory, offset: int, shape, byte_strides, typestr: str, dtype_name: str, readonly: bool
) -> DLPackObject:
    """A DLPackObject of the elements at ``offset`` in ``memory`` (a segment's mapping, or any
    object with flat bytes; None for no elements). It keeps the memory alive (for a mapping, and
    with it the segment)."""
    if memory is None:
        memory = b"" if readonly else bytearray()
    strides = None if byte_strides is None else tuple(byte_strides)
    return _from_buffer(memory, offset, tuple(shape), strides, typestr, dtype_name, readonly)


def empty(shape, typestr: str, dtype_name: str, itemsize: int) -> DLPackObject:
    """A writable, zero-filled, C-ordered array in a new segment."""
    strides = tuple(dense_strides(shape, [0] * len(shape), itemsize))
    nbytes = math.prod(shape) * itemsize
    if nbytes == 0:
        return view(None, 0, shape, strides, typestr, dtype_name, readonly=False)
    _, mapping = Segment.create(nbytes)
    return view(mapping, 0, shape, strides, typestr, dtype_name, readonly=False)


def copy_in(source: DLPackObject, typestr: str) -> tuple[Segment | None, DLPackObject]:
    """Copy host memory (its elements of type ``typestr``) into a new segment (or a kept one of
    the same size), packed densely in the order of its dimensions in memory, with the copy
    engine; the segment (None when there are no elements) and a writable view of the copy."""
    shape, itemsize = source.shape, source.itemsize
    strides = tuple(dense_strides(shape, source.byte_strides, itemsize))
    nbytes = math.prod(shape) * itemsize
    if nbytes == 0:
        return None, view(None, 0, shape, strides, typestr, source.dtype, readonly=False)
    reused = Segment.reuse(nbytes)
    if reused is not None:
        segment, mapping = reused
    else:
        segment, mapping = Segment.create(nbytes, poolable=True)
        if nbytes >= POPULATE_MIN_BYTES:
            # Faulted in from several threads first: on a virtual machine each page fault is
            # dear, and a copy that faults as it writes takes a fifth longer. A MemoryError
            # here, when the memory can't be had, rather than the OOM killer mid-copy.
            _populate_write(mapping, nbytes)
    copy = view(mapping, 0, shape, strides, typestr, source.dtype, readonly=False)
    copyto(copy, source)
    return segment, copy


def _after_fork_in_child() -> None:
    """A forked child: the kept segments are the parent's to reuse (forget them; the parent
    keeps its descriptors), and the mappings it inherited get locks of its own."""
    global _pool_lock
    _pool_lock = threading.Lock()  # another thread of the parent may have held it
    while _returned:
        _returned.popleft().close()
    while _pool:
        _pool.pop().close()
    for ref in list(_by_base.values()):
        segment = ref()
        if segment is not None and segment.mapping() is not None:
            try:
                segment.hold_after_fork()
            except OSError:
                pass  # no /proc: the parent may reuse it (as without this module's reuse)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
