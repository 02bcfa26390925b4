"""``share()``, ``empty_shared()`` and the handle: what it holds in the process that made it,
what its pickle carries, and what unpickling it opens. The extension does the work: finding the
segment memory lies in or copying it into one, writing and checking the handle's state, and
opening the segment a handle names where it arrives (``src/share``)."""

from __future__ import annotations

import math
import sys

from .. import _dlpack
from .._dlpack import ELEMENT_TYPES, HOST_DEVICE_TYPES, DLDeviceType, DLPackObject, asdlpack
from .process import require_linux

_NAMES = {DLDeviceType.kDLCPU: "cpu", DLDeviceType.kDLCUDA: "cuda"}


class SharedHandle:
    """A handle to memory shared with other processes: pickle it (``Queue.put``,
    ``Connection.send``, ``pickle.dumps``) to send it, and pass it to ``asdlpack`` (or any
    ``from_dlpack``) where it arrives to use the memory without a copy.

    Made by :func:`dlpack.share`; in the process that made it, it keeps the memory alive.
    """

    __slots__ = ("_layout", "_memory", "_view", "_writable")

    def __init__(self, *args, **kwargs):
        raise TypeError("SharedHandle objects are made by dlpack.share()")

    @classmethod
    def _make(cls, view: DLPackObject, writable: bool, layout: tuple, memory: tuple):
        handle = object.__new__(cls)
        handle._view = view  # the memory as this process sees it; it keeps the memory alive
        handle._writable = writable
        handle._layout = layout  # (offset, shape, byte strides, typestr, dtype name)
        handle._memory = memory  # ("host", segment's (device, inode), size, generation)
        return handle

    @property
    def shape(self) -> tuple[int, ...]:
        return self._view.shape

    @property
    def dtype(self) -> str:
        return self._view.dtype

    @property
    def device(self) -> tuple[int, int]:
        return self._view.device

    @property
    def writable(self) -> bool:
        """Whether receivers may write (``share(obj, writable=True)``)."""
        return self._writable

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return self._view.__dlpack__(
            stream=stream, max_version=max_version, dl_device=dl_device, copy=copy
        )

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._view.__dlpack_device__()

    def __repr__(self) -> str:
        device_type, device_id = self.device
        device = _NAMES.get(device_type, f"device{device_type}")
        return (
            f"SharedHandle(shape={self.shape}, dtype={self.dtype}, device={device}:{device_id}, "
            f"writable={self._writable})"
        )

    def __reduce__(self):
        # The segment (if any) is pinned for the receiver in this process's lender.
        return _rebuild, (_dlpack._share_state(self._view, self._writable, self._layout),)


def _rebuild(state) -> SharedHandle:
    """Unpickle a handle: check it, then open what it names in this process."""
    require_linux()
    view = _dlpack._share_open(state)
    handle = object.__new__(SharedHandle)
    handle._view = view
    handle._writable = state[5]
    handle._layout = state[6]
    handle._memory = state[7][:4]  # the descriptor's number is the producer's, not ours
    return handle


# -- making handles -----------------------------------------------------------------------------


def share(obj, *, writable: bool = False) -> SharedHandle:
    """A small picklable handle to the memory of ``obj`` (anything ``asdlpack`` reads) for other
    processes on this machine; where it arrives, ``asdlpack(handle)`` (or any ``from_dlpack``)
    uses the memory without a copy.

    Host memory already in shared memory (from :func:`empty_shared`, or received through a
    handle) is shared as it is, layout and all; other host memory is copied once into a new
    shared segment, in the order its dimensions lie in memory.

    Receivers get read-only memory unless ``writable=True``, which needs memory that is shared
    already (ValueError otherwise: writes would land in a copy). BufferError for memory that
    can't be shared: CUDA memory (CUDA IPC is not built yet) and other devices' memory.
    """
    if type(writable) is not bool:
        raise TypeError(f"writable must be True or False, not {type(writable).__name__}")
    source = asdlpack(obj)
    device_type, _ = source.device  # BufferError when the device can't be told
    if device_type in HOST_DEVICE_TYPES:
        return _share_host(source, writable)
    if device_type == DLDeviceType.kDLCUDA:
        raise BufferError(
            "sharing CUDA memory between processes (CUDA IPC) is not available yet: copy it to "
            "host memory first (e.g. tensor.cpu()) and share that, or use torch.multiprocessing "
            "or CuPy's IPC calls"
        )
    if device_type == DLDeviceType.kDLCUDAManaged:
        raise BufferError(
            "CUDA managed memory can't be shared between processes (CUDA IPC serves only "
            "device memory from cudaMalloc); copy it to device or host memory first"
        )
    raise BufferError(
        f"memory of DLPack device type {device_type} can't be shared (host memory can)"
    )


def _share_host(source: DLPackObject, writable: bool) -> SharedHandle:
    if source.dtype not in ELEMENT_TYPES:
        raise BufferError(
            f"elements of type {source.dtype} can't be shared (the receiving side could not "
            f"name them); these can: {', '.join(ELEMENT_TYPES)}"
        )
    if writable and source.readonly:
        raise ValueError("read-only memory can't be shared writable")
    require_linux()
    # No elements, or memory in shared memory already: shared as it is.
    found = _dlpack._share_find(source, writable)
    if found is None:
        if writable:
            raise ValueError(
                "writable sharing needs memory that is shared already (receivers' writes would "
                "land in a copy): allocate it with dlpack.empty_shared(), or share read-only"
            )
        found = _dlpack._share_copy(source)
    view, layout, memory = found
    return SharedHandle._make(view, writable, layout, memory)


def empty_shared(shape, dtype) -> DLPackObject:
    """A new writable, zero-filled, C-ordered host array in shared memory, as a
    ``DLPackObject`` (so any library takes it: ``np.asarray``, ``torch.from_dlpack``): sharing
    it, or any array that views its memory, later sends only a handle.

    ``shape``: an int or a sequence of ints; ``dtype``: a name such as ``"float32"`` or
    ``"bfloat16"``, or a numpy, ml_dtypes or torch dtype.
    """
    shape = _shape(shape)
    name = _dtype_name(dtype)
    known = ELEMENT_TYPES.get(name)
    if known is None:
        raise ValueError(f"unknown element type {name!r} (one of {', '.join(ELEMENT_TYPES)})")
    _, itemsize = known
    if math.prod(shape) * itemsize > sys.maxsize:
        raise ValueError(f"shape {shape} of {name} needs more bytes than an address space has")
    require_linux()
    return _dlpack._share_empty(shape, name)


def _shape(shape) -> tuple[int, ...]:
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
    if any(n < 0 for n in dims):
        raise ValueError(f"shape {dims} has a negative extent")
    return dims


def _dtype_name(dtype) -> str:
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
            return numpy.dtype(dtype).name
        except TypeError:
            pass
    if type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype":
        return str(dtype).removeprefix("torch.")
    raise TypeError(
        f"dtype must be a name such as 'float32', or a numpy or torch dtype, not {dtype!r}"
    )
