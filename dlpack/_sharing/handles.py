"""``share()``, ``empty_shared()`` and the handle: what it holds in the process that made it,
what its pickle carries, and what unpickling it opens."""

from __future__ import annotations

import math
import os
import sys

from .._dlpack import (
    ELEMENT_TYPES,
    HOST_DEVICE_TYPES,
    DLDeviceType,
    DLPackObject,
    asdlpack,
    byte_extent,
)
from . import host, lender

# The layout of a pickled handle's state; a handle of another layout is refused, not misread.
_FORMAT = 1


class SharedHandle:
    """A handle to memory shared with other processes: pickle it (``Queue.put``,
    ``Connection.send``, ``pickle.dumps``) to send it, and pass it to ``asdlpack`` (or any
    ``from_dlpack``) where it arrives to use the memory without a copy.

    Made by :func:`dlpack.share`; in the process that made it, it keeps the memory alive.
    """

    __slots__ = ("_keep", "_layout", "_memory", "_view", "_writable")

    def __init__(self, *args, **kwargs):
        raise TypeError("SharedHandle objects are made by dlpack.share()")

    @classmethod
    def _make(cls, view: DLPackObject, writable: bool, layout: tuple, memory: tuple, keep):
        handle = object.__new__(cls)
        handle._view = view  # the memory as this process sees it
        handle._writable = writable
        handle._layout = layout  # (offset, shape, byte strides, typestr, dtype name)
        handle._memory = memory  # ("host", segment key, size, generation): see host
        handle._keep = keep  # what keeps the memory alive here, lent on when pickled
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
        names = {DLDeviceType.kDLCPU: "cpu", DLDeviceType.kDLCUDA: "cuda"}
        device = names.get(device_type, f"device{device_type}")
        return (
            f"SharedHandle(shape={self.shape}, dtype={self.dtype}, device={device}:{device_id}, "
            f"writable={self._writable})"
        )

    def __reduce__(self):
        token, address, memory = b"", "", self._memory
        if self._keep is not None:  # None: no elements, no memory, nothing to lend
            lent_by = lender.lender()
            fd = self._keep.fd_for(self._writable)
            token, address = lent_by.lend(lender.Pin(fd, self._keep)), lent_by.address
            memory = (*memory, fd)  # receivers open it through /proc when they can
        state = (
            _FORMAT,
            host.host_id(),
            os.getpid(),
            address,
            token,
            self._writable,
            self._layout,
            memory,
        )
        return _rebuild, (state,)


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
    interface = source.__array_interface__
    typestr = interface["typestr"]
    shape, strides, itemsize = source.shape, source.byte_strides, source.itemsize
    low, high = byte_extent(shape, strides, itemsize)
    if low == high:
        layout = (0, shape, strides, typestr, source.dtype)
        view = host.view(None, 0, shape, strides, typestr, source.dtype, readonly=not writable)
        return SharedHandle._make(view, writable, layout, ("host", None, 0), None)
    # Memory behind suboffsets has no address to look up (its interface names a copy).
    address = source.data_ptr
    found = isinstance(interface["data"], tuple) and host.segment_at(address + low, address + high)
    if found:
        segment, mapping = found
        if writable and not segment.writable:
            raise ValueError(
                "this memory is a read-only mapping of another process's segment; it can only "
                "be shared read-only"
            )
        offset = address - segment.base
    elif writable:
        raise ValueError(
            "writable sharing needs memory that is shared already (receivers' writes would "
            "land in a copy): allocate it with dlpack.empty_shared(), or share read-only"
        )
    else:
        segment, copy = host.copy_in(source, typestr)
        mapping, offset, strides = segment.mapping(), 0, copy.byte_strides
    layout = (offset, shape, strides, typestr, source.dtype)
    view = host.view(mapping, offset, shape, strides, typestr, source.dtype, not writable)
    return SharedHandle._make(
        view, writable, layout, ("host", segment.key, segment.size, segment.generation), segment
    )


def empty_shared(shape, dtype) -> DLPackObject:
    """A new writable, zero-filled, C-ordered host array in shared memory, as a
    ``DLPackObject`` (so any library takes it: ``np.asarray``, ``torch.from_dlpack``): sharing
    it, or any array that views its memory, later sends only a handle.

    ``shape``: an int or a sequence of ints; ``dtype``: a name such as ``"float32"`` or
    ``"bfloat16"``, or a numpy, ml_dtypes or torch dtype.
    """
    shape = _shape(shape)
    name = _dtype_name(dtype)
    if name not in ELEMENT_TYPES:
        raise ValueError(f"unknown element type {name!r} (one of {', '.join(ELEMENT_TYPES)})")
    typestr, itemsize = ELEMENT_TYPES[name]
    if math.prod(shape) * itemsize > sys.maxsize:
        raise ValueError(f"shape {shape} of {name} needs more bytes than an address space has")
    return host.empty(shape, typestr, name, itemsize)


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


# -- opening handles ----------------------------------------------------------------------------


def _malformed(why: str) -> ValueError:
    return ValueError(f"not a dlpack shared-memory handle ({why})")


def _rebuild(state) -> SharedHandle:
    """Unpickle a handle: check it, then open what it names in this process."""
    try:
        version, host_id, pid, address, token, writable, layout, memory = state
    except (TypeError, ValueError):
        raise _malformed("its state is not an 8-tuple") from None
    if version != _FORMAT:
        raise _malformed(f"format {version!r}, this dlpack reads format {_FORMAT}")
    checks = [
        (host_id, str),
        (pid, int),
        (address, str),
        (token, bytes),
        (writable, bool),
        (layout, tuple),
        (memory, tuple),
    ]
    if any(type(value) is not kind for value, kind in checks) or not memory:
        raise _malformed("a field of the wrong type")
    if host_id != host.host_id():
        raise BufferError(
            f"this handle was made on another machine (boot id {host_id}, this one's is "
            f"{host.host_id()}): shared memory can't cross machines; send the array itself "
            "instead (a DLPackObject pickles its data), e.g. through Dask distributed"
        )
    layout = _checked_layout(layout)
    if memory[0] == "host":
        return _open_host(pid, address, token, writable, layout, memory)
    raise _malformed(f"memory of kind {memory[0]!r}")


def _checked_layout(layout: tuple) -> tuple:
    try:
        offset, shape, strides, typestr, dtype_name = layout
    except ValueError:
        raise _malformed("its layout is not a 5-tuple") from None
    well_typed = (
        isinstance(shape, tuple)
        and isinstance(strides, tuple)
        and len(strides) == len(shape)
        and all(type(n) is int for n in (offset, *shape, *strides))
        and all(n >= 0 for n in shape)
        and type(typestr) is str
        and type(dtype_name) is str
    )
    expected = ELEMENT_TYPES[dtype_name][0] if well_typed and dtype_name in ELEMENT_TYPES else None
    # The typestr may be in either byte order (memory in the other order is shared as it is).
    if expected is None or typestr not in {expected, "<" + expected[1:], ">" + expected[1:]}:
        raise _malformed(f"a malformed layout {layout!r}")
    return offset, shape, strides, typestr, dtype_name


def _within(layout: tuple, size: int) -> None:
    """ValueError unless the layout's elements lie in the ``size`` bytes of its memory."""
    offset, shape, strides, _, dtype_name = layout
    low, high = byte_extent(shape, strides, ELEMENT_TYPES[dtype_name][1])
    if low != high and (offset + low < 0 or offset + high > size):
        raise ValueError(
            f"the handle's layout reaches bytes [{offset + low}, {offset + high}) of its "
            f"{size}-byte memory (a forged or corrupted handle)"
        )


def _open_host(pid, address, token, writable, layout, memory) -> SharedHandle:
    offset, shape, strides, typestr, dtype_name = layout
    if len(memory) == 3 and memory[1] is None:  # no elements, no memory
        if math.prod(shape) != 0:
            raise _malformed("elements without memory")
        view = host.view(None, 0, shape, strides, typestr, dtype_name, readonly=not writable)
        return SharedHandle._make(view, writable, layout, memory, None)
    try:
        _, key, size, generation, lent_fd = memory
    except ValueError:
        raise _malformed("host memory that is not a 5-tuple") from None
    if (
        not isinstance(key, tuple)
        or len(key) != 2
        or any(type(n) is not int for n in (*key, size, generation, lent_fd))
        or size <= host.TRAILER
        or lent_fd < 0
        or len(token) != lender.TOKEN_BYTES
    ):
        raise _malformed("a malformed segment")
    _within(layout, size - host.TRAILER)
    memory = memory[:4]  # the descriptor's number is the producer's, not ours to pass on
    found = None
    own = address == lender.own_address() and pid == os.getpid()
    if own:
        pin = lender.lender().take(token)
        if pin is not None:
            found = pin.keep, pin.keep.remap()
    if found is None:
        found = host.segment_named(key, writable)
        if found is not None:
            if found[0].size != size:
                raise host.size_mismatch(size, found[0].size)
            if found[0].generation != generation:
                raise host.stale()
            if not own:
                lender.release(address, token)
        elif own:
            raise BufferError("this handle was already opened from its pickle, and closed")
        else:
            found = _open_lent(pid, address, token, lent_fd, size, generation, writable, key)
    segment, mapping = found
    view = host.view(mapping, offset, shape, strides, typestr, dtype_name, not writable)
    return SharedHandle._make(view, writable, layout, memory, segment)


def _open_lent(pid, address, token, lent_fd, size, generation, writable, key):
    """Map the segment another process lent: opened straight from its descriptor table through
    /proc (no round trip; the file is checked to be the segment named), or else claimed from
    its lender, which also says why when it can't be had. The token is given back once this
    process holds its lock on the segment (until then, the producer must not reuse it)."""
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
    try:
        fd = os.open(f"/proc/{pid}/fd/{lent_fd}", flags)
    except OSError:
        fd = None  # the producer exited, or /proc won't serve (another pid namespace, ptrace rules)
    found = None
    try:
        if fd is not None:
            try:
                found = host.Segment.adopt(fd, size, writable, key, generation, True)
            except host.StaleHandle:
                raise
            except BufferError:
                pass  # not that segment (its token spent and the number reused, or another pid)
        if found is None:
            fd = lender.claim(address, pid, token)
            found = host.Segment.adopt(fd, size, writable, key, generation, False)
    finally:
        lender.release(address, token)
    return found
