"""Pickling ``DLPackObject``: host memory travels as a ``pickle.PickleBuffer``, so protocol 5
with a ``buffer_callback`` (Dask distributed, Ray, ``pickle.dumps(..., buffer_callback=...)``)
sends the memory itself, out of band, without a copy; protocol 5 without one and older
protocols put the bytes in the pickle. It unpickles to a ``DLPackObject`` of the same shape,
strides, element type and read-only flag, which every ``from_dlpack`` accepts.

Memory that is not dense (strided views, memory behind suboffsets) is first copied densely, in
C order, with the copy engine: only the elements travel. Device memory is refused: pickling it
would move it to the host unasked.
"""

from __future__ import annotations

import math
import pickle

from .._dlpack import HOST_DEVICE_TYPES, DLPackObject, copyto, dense_strides
from . import host


def reduce_ex(obj: DLPackObject, protocol: int):
    """``DLPackObject.__reduce_ex__``: rebuild from a buffer of the elements and their layout."""
    device_type, device_id = obj.device
    if device_type not in HOST_DEVICE_TYPES:
        raise BufferError(
            f"a DLPackObject of memory on device ({device_type}, {device_id}) can't be pickled "
            "(pickling would move it to the host unasked); copy it to host memory first, or "
            "share it between processes of this machine with dlpack.share"
        )
    typestr = obj.__array_interface__["typestr"]
    shape, strides = obj.shape, obj.byte_strides
    if math.prod(shape) == 0:
        return _rebuild, (None, shape, strides, typestr, obj.dtype, obj.readonly)
    dense = obj.copy_reason is None and (obj.c_contiguous or obj.f_contiguous)
    if dense:
        # Lent as flat bytes: transports join and slice frames as one-dimensional bytes (Dask's
        # TCP comm fails on a Fortran-ordered or multi-dimensional one).
        buffer = pickle.PickleBuffer(pickle.PickleBuffer(obj).raw())
    else:
        strides = tuple(dense_strides(shape, (0,) * len(shape), obj.itemsize))  # C order
        copied = bytearray(obj.nbytes)
        copyto(host.view(copied, 0, shape, strides, typestr, obj.dtype, readonly=False), obj)
        buffer = pickle.PickleBuffer(copied)
    if protocol < 5:  # no PickleBuffer: bytes in the pickle, a bytearray if writes are allowed
        buffer = buffer.raw().tobytes() if obj.readonly else bytearray(buffer.raw())
    return _rebuild, (buffer, shape, strides, typestr, obj.dtype, obj.readonly)


def _rebuild(buffer, shape, strides, typestr, dtype_name, readonly) -> DLPackObject:
    """Unpickle: a view of the bytes pickle hands back (bytes, bytearray, or the transport's
    out-of-band buffer). Read-only if the original was or the buffer is (as numpy does, the
    memory is used as it arrives, not copied to make it writable)."""
    if buffer is not None:
        readonly = readonly or memoryview(buffer).readonly
    return host.view(buffer, 0, shape, strides, typestr, dtype_name, readonly)
