"""A segment and this process's one mapping of it, and the registry of the segments this
process maps: by address (memory already in a segment is shared without a copy) and by file (a
process maps each segment once, however many handles to it arrive)."""

from __future__ import annotations

import bisect
import fcntl
import mmap
import os
import stat
import weakref

from ..._dlpack import (
    _lock_file,
    asdlpack,
)
from ._format import _SEALS, TRAILER, file_size, require_linux, size_mismatch, stale
from ._pool import _Files, _pool_take


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


def _hold_inherited_after_fork() -> None:
    """A forked child: the mappings it inherited get locks of its own."""
    for ref in list(_by_base.values()):
        segment = ref()
        if segment is not None and segment.mapping() is not None:
            try:
                segment.hold_after_fork()
            except OSError:
                pass  # no /proc: the parent may reuse it (as without this module's reuse)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_hold_inherited_after_fork)
