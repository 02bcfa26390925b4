"""Views of shared memory as DLPackObjects: new empty arrays and fresh copies in segments."""

from __future__ import annotations

import math

from ..._dlpack import (
    DLPackObject,
    _from_buffer,
    _populate_write,
    copyto,
    dense_strides,
)
from ._segment import Segment

# Below this, faulting pages in as the copy writes them costs less than starting threads.
POPULATE_MIN_BYTES = 4 << 20


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
