"""``share()`` and ``empty_shared()``: which memory can be shared and how, and their arguments.
The handle itself (``SharedHandle``: what it holds, what its pickle carries, and what unpickling
it opens, in one call) and the work (finding the segment memory lies in, or copying it into
one) are the extension's (``src/share``)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, SupportsIndex

from .._dlpack import ELEMENT_TYPES, DLPackObject
from .process import not_linux, require_linux

__all__ = ["SharedHandle", "empty_shared", "share"]

if sys.platform == "linux":
    from .._dlpack import SharedHandle, _share, _share_empty

    # The reconstructor handles pickle to (dlpack._dlpack._share_rebuild), by its short name.
    from .._dlpack import _share_rebuild as _rebuild  # noqa: F401
else:  # no shared memory here: the name exists, nothing makes one

    class SharedHandle:
        """A handle to memory shared with other processes (Linux only)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise TypeError("SharedHandle objects are made by dlpack.share()")

    def _share(obj: Any, writable: bool) -> SharedHandle:
        raise not_linux()


# -- making handles -----------------------------------------------------------------------------


def share(obj: Any, *, writable: bool = False) -> SharedHandle:
    """A small picklable handle to the memory of ``obj`` (anything ``asdlpack`` reads) for other
    processes on this machine; where it arrives, ``asdlpack(handle)`` (or any ``from_dlpack``)
    uses the memory without a copy.

    Host memory already in shared memory (from :func:`empty_shared`, or received through a
    handle) is shared as it is, layout and all; other host memory is copied once into a new
    shared segment, in the order its dimensions lie in memory.

    Receivers get read-only memory unless ``writable=True``, which needs memory that is shared
    already (ValueError otherwise: writes would land in a copy). Read-only means: a receiver maps
    the memory copy-on-write, so a consumer that writes anyway (torch ignores the flag) changes
    only its own pages, never the producer's or other receivers'; a handle whose pickled state
    was altered to ask for more than it was lent is refused (ValueError). A receiver that wrote
    into its view and shares it again sends what it sees (a fresh copy). Memory from
    :func:`empty_shared` stays writable for the process that allocated it and for receivers of
    its writable handles: their writes show in read-only receivers' views, on the pages those
    have not written themselves.

    Memory that can't be had is a MemoryError before anything is allocated (the size asked for
    against what the machine and this process's cgroup have left). BufferError for memory that
    can't be shared: CUDA memory (CUDA IPC is not built yet) and other devices' memory.
    """
    return _share(obj, writable)


def empty_shared(shape: SupportsIndex | Iterable[SupportsIndex], dtype: Any) -> DLPackObject:
    """A new writable, zero-filled, C-ordered host array in shared memory, as a
    ``DLPackObject`` (so any library takes it: ``np.asarray``, ``torch.from_dlpack``): sharing
    it, or any array that views its memory, later sends only a handle.

    ``shape``: an int or a sequence of ints; ``dtype``: a name such as ``"float32"`` or
    ``"bfloat16"``, or a numpy, ml_dtypes or torch dtype.
    MemoryError, before anything is allocated, when more memory is asked for than the machine
    and this process's cgroup have left; read-only handles to it are explained in :func:`share`.
    """
    shape = _shape(shape)
    name = _dtype_name(dtype)
    known = ELEMENT_TYPES.get(name)
    if known is None:
        raise ValueError(f"unknown element type {name!r} (one of {', '.join(ELEMENT_TYPES)})")
    require_linux()
    return _share_empty(shape, name)


def _shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"shape must be an int or a sequence of ints, not {shape!r}") from None
    for n in dims:
        if isinstance(n, bool) or not hasattr(type(n), "__index__"):
            raise TypeError(f"shape must hold ints, not {type(n).__name__}")
    dims = tuple(n.__index__() for n in dims)
    # The extension checks extents and sizes; it takes them as 64-bit ints.
    for n in dims:
        if not -(2**63) <= n < 2**63:
            raise ValueError(f"extent {n} of shape {dims} does not fit in 64 bits")
    return dims


def _dtype_name(dtype: Any) -> str:
    """A dtype's name as DLPackObject spells it, from a name, a numpy or ml_dtypes dtype (or
    scalar type), or a torch dtype."""
    if isinstance(dtype, str):
        return dtype
    name = getattr(dtype, "name", None)
    if isinstance(name, str):
        return name
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(dtype, type):
        try:
            return str(numpy.dtype(dtype).name)
        except TypeError:
            pass
    if type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype":
        return str(dtype).removeprefix("torch.")
    raise TypeError(
        f"dtype must be a name such as 'float32', or a numpy or torch dtype, not {dtype!r}"
    )
