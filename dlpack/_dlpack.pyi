"""Type stubs for the Rust extension ``dlpack._dlpack``."""

from collections.abc import Mapping, Sequence
from enum import IntEnum
from types import ModuleType
from typing import Any, SupportsIndex, final, overload

from typing_extensions import CapsuleType

__all__ = [
    "CPU_READABLE_DEVICE_TYPES",
    "DLDeviceType",
    "DLPACK_VERSION",
    "DLPackObject",
    "ELEMENT_TYPES",
    "HOST_DEVICE_TYPES",
    "IMPORT_ORDER",
    "SharedHandle",
    "TreeSegment",
    "__version__",
    "_C_API",
    "_SHARE_POOL_SEGMENTS",
    "_copy_engine",
    "_from_buffer",
    "_share_after_fork",
    "_share_clear_pool",
    "_share_empty",
    "_share",
    "_share_rebuild",
    "_share_tree",
    "_share_tree_rebuild",
    "asdlpack",
    "byte_extent",
    "copyto",
    "dense_strides",
]

# Hooks for the package's own tests and benchmarks, not API (``dlpack._dlpack._testing``).
_testing: ModuleType

DLPACK_VERSION: tuple[int, int]
__version__: str

class DLDeviceType(IntEnum):
    """DLPack device type codes, as in ``dlpack.h``; ``__dlpack_device__()`` returns these ints."""

    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLOpenCL = 4
    kDLVulkan = 7
    kDLMetal = 8
    kDLVPI = 9
    kDLROCM = 10
    kDLROCMHost = 11
    kDLExtDev = 12
    kDLCUDAManaged = 13
    kDLOneAPI = 14
    kDLWebGPU = 15
    kDLHexagon = 16
    kDLMAIA = 17
    kDLTrn = 18

HOST_DEVICE_TYPES: frozenset[int]
# The protocols ``asdlpack`` tries, first to last.
IMPORT_ORDER: tuple[str, ...]
"""Host memory: the CPU addresses it directly, with no stream to order with."""
CPU_READABLE_DEVICE_TYPES: frozenset[int]
"""Memory the CPU can read in place: host memory and CUDA managed memory."""
_C_API: object
"""A capsule named ``"dlpack._dlpack._C_API"``: the table of functions other extensions view
memory and make ``DLPackObject``s through (see the internals documentation)."""
ELEMENT_TYPES: Mapping[str, tuple[str, int]]
"""Element type name -> (typestr in native byte order, itemsize), as ``DLPackObject`` spells
them; bfloat16 and the float8 types are raw bytes (``|V2``, ``|V1``) to the array interface."""

def byte_extent(
    shape: Sequence[int], byte_strides: Sequence[int], itemsize: int
) -> tuple[int, int]:
    """The bytes ``[low, high)`` the elements span relative to the first element; ``(0, 0)``
    when there are none."""

def _from_buffer(
    memory: Any,
    offset: int,
    shape: Sequence[int],
    byte_strides: Sequence[int] | None,
    typestr: str,
    dtype: str,
    readonly: bool,
) -> DLPackObject:
    """A DLPackObject of the elements at byte ``offset`` of ``memory`` (flat, contiguous bytes:
    ``mmap``, ``bytearray``, ``bytes``; None for no elements) with this layout (C order when
    ``byte_strides`` is None), keeping ``memory`` alive. Read-only when asked or when ``memory``
    is; ValueError when the elements reach outside ``memory``'s bytes or ``typestr`` doesn't
    spell ``dtype``."""

def dense_strides(shape: Sequence[int], byte_strides: Sequence[int], itemsize: int) -> list[int]:
    """Byte strides packing ``shape`` densely in the order ``byte_strides`` lays the dimensions
    out in memory (numpy's ``order="K"``; ties go the C way)."""

def _copy_engine(measure: bool = False) -> dict[str, Any]:
    """What the CPU copy engine chose, per kind of copy (``"contiguous"``, ``"transpose"``,
    ``"gather"``, ``"byte swap"``), size band and destination memory (``"mapped"``: written
    before; ``"fresh"``: pages the kernel maps as the copy first writes them), and from what::

        {"max_threads", "parallel_threshold", "large_threshold", "margin",
         "settings": {variable: value or None}, "settings_error": str or None,
         "choices": [{"kind", "bytes": (low, high or None), "memory",
                      "state": "measured" | "fixed" | "not yet",
                      "threads", "stores": "regular" | "streaming" (None when not yet),
                      "candidates": [{"threads", "stores", "gb_per_s" (None: not measured)}],
                      "copy_bytes", "calibrated_bytes", "seconds", "cost_seconds"}]}

    (the last four None unless measured). ``measure``: first measure, on copies of the
    engine's own, whatever this process hasn't yet; MemoryError when their memory can't be
    had."""

def asdlpack(obj: Any) -> DLPackObject:
    """Wrap ``obj`` (DLPack, CUDA array interface, array interface or buffer) without copying.

    Raises TypeError when ``obj`` speaks none of these protocols, BufferError when its memory
    can't be expressed in DLPack, ValueError when its interface holds invalid values.
    """

def copyto(dst: Any, src: Any, *, stream: int | None = None) -> None:
    """Copy ``src`` into the existing, writable array ``dst`` (argument order as numpy.copyto).

    Any supported source and destination, any layout, host or CUDA memory; ``src`` broadcasts
    like numpy. Without ``stream`` the copy is complete on return; with a CUDA stream handle it
    is queued on that stream (after the arrays' producers' streams). Raises TypeError for
    different dtypes, ValueError for read-only or immutable destinations, shapes that don't
    broadcast and bad streams, BufferError for memory a Rust or C extension's view holds. JAX
    arrays are immutable: :func:`dlpack.interop.copyto_jax` refills one through JAX's buffer
    donation.
    """

# Sharing (``dlpack.sharing``; Linux only).

@final
class SharedHandle:
    """A handle to memory shared with other processes: pickle it (``Queue.put``,
    ``Connection.send``, ``pickle.dumps``) to send it, and pass it to ``asdlpack`` (or any
    ``from_dlpack``) where it arrives to use the memory without a copy.

    Made by :func:`dlpack.share`; in the process that made it, it keeps the memory alive.
    """

    def __new__(cls, *_args: Any, **_kwargs: Any) -> SharedHandle: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def device(self) -> tuple[int, int]: ...
    @property
    def writable(self) -> bool:
        """Whether receivers may write (``share(obj, writable=True)``)."""
    @property
    def _memory(self) -> tuple[Any, ...]:
        """The memory the handle names, as its state spells it (for tests)."""
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Any = None,
        dl_device: Any = None,
        copy: Any = None,
    ) -> CapsuleType: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        """Pickle: the state names the segment (pinned for the receiver here)."""

def _share_rebuild(state: Any) -> SharedHandle:
    """Unpickle a handle: check its state, then open what it names in this process."""

_SHARE_POOL_SEGMENTS: int

def _share(obj: Any, writable: Any) -> SharedHandle:
    """``dlpack.share(obj, writable=writable)``."""

def _share_empty(shape: Sequence[int], dtype: str) -> DLPackObject:
    """A writable, zero-filled, C-ordered array in new shared memory."""

@final
class TreeSegment:
    """A pytree's segment as this process holds it (what a ``SharedTree`` holds)."""

    def __new__(cls, *_args: Any, **_kwargs: Any) -> TreeSegment: ...
    def structure(self) -> bytes:
        """The tree's structure, as ``share_tree`` wrote it."""
    def leaves(self) -> list[DLPackObject]:
        """The leaves over the segment's memory, read-only (made once)."""
    def update(self, leaves: list[Any], name: Any, timeout: float | None = None) -> int:
        """Write ``leaves`` as the next generation, which it returns."""
    @overload
    def snapshot(
        self, timeout: float | None = None, keys: None = None
    ) -> tuple[list[DLPackObject], int]:
        """A copy of every leaf, all of one generation, and that generation."""
    @overload
    def snapshot(
        self, timeout: float | None, keys: tuple[Any, ...]
    ) -> tuple[dict[Any, DLPackObject], int]:
        """The same, as a dict of ``keys`` (a state dict's) in order."""
    @property
    def generation(self) -> int: ...
    @property
    def _sequence(self) -> int:
        """The sequence word as it is (for tests: odd while a write is under way)."""
    @property
    def writable(self) -> bool:
        """Whether this process may update the tree."""
    @property
    def lends_writable(self) -> bool:
        """Whether pickles of it lend it writable."""
    @property
    def nbytes(self) -> int: ...
    def __len__(self) -> int: ...
    @property
    def _memory(self) -> tuple[tuple[int, int], int]:
        """``((device, inode), size)`` of its segment (for tests)."""
    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        """Pickle: the handle of the segment (pinned for the receiver here)."""

def _share_tree(leaves: list[Any], structure: bytes, writable: Any, name: Any) -> TreeSegment:
    """``dlpack.share_tree``'s work: a new segment holding ``leaves`` and ``structure``."""

def _share_tree_rebuild(state: Any) -> TreeSegment:
    """Unpickle a tree's segment: its handle opened, its header and table read and checked."""

def _share_after_fork() -> None:
    """Sharing's per-process state in a forked child."""

def _share_clear_pool() -> None:
    """Close the segments kept for reuse."""

@final
class DLPackObject:
    """A DLPack view of another object's memory; pass it to any ``from_dlpack``.

    It also lends host memory through the buffer protocol (``memoryview(obj)``) and describes it
    with ``__array_interface__`` / ``__array_struct__``, and CUDA memory with
    ``__cuda_array_interface__``.
    """

    __dlpack_c_exchange_api__: CapsuleType
    """The DLPack 1.3 C exchange API table (a capsule named "dlpack_exchange_api")."""

    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> CapsuleType: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __arrow_c_array__(self, requested_schema: object = None, /) -> tuple[object, object]:
        """The Arrow PyCapsule interface: (schema, array) capsules of host memory. 1-D numbers
        as they are; N-d C-ordered memory as an arrow.fixed_shape_tensor; other layouts one
        C-ordered copy. A requested_schema of this element type whose rows are the array's last
        dimensions (a column, nested fixed-size lists, an arrow.fixed_shape_tensor) is given as
        asked; any other is a ValueError."""
    def __arrow_c_stream__(self, requested_schema: object = None, /) -> CapsuleType:
        """The Arrow PyCapsule interface: a stream capsule ("arrow_array_stream") of host
        memory, whose one array is the one ``__arrow_c_array__`` gives."""
    def __arrow_c_device_array__(
        self, requested_schema: object = None, **kwargs: None
    ) -> tuple[object, object]:
        """The Arrow PyCapsule interface's device variant: (schema, device array) capsules
        ("arrow_schema", "arrow_device_array") of host memory as the CPU's (device id -1, no
        event); the array is ``__arrow_c_array__``'s. Other keywords must be None
        (NotImplementedError otherwise)."""
    def __arrow_c_device_stream__(
        self, requested_schema: object = None, **kwargs: None
    ) -> CapsuleType:
        """The Arrow PyCapsule interface's device variant: a device stream capsule
        ("arrow_device_array_stream") of host memory (the CPU's), whose one array is the one
        ``__arrow_c_device_array__`` gives. Other keywords must be None."""
    def __reduce_ex__(self, protocol: SupportsIndex, /) -> tuple[Any, ...]:
        """Pickle support: host memory goes out of band with protocol 5 (no copy), in the
        pickle before, and unpickles through ``_from_buffer``; device memory raises
        BufferError."""
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...] | None:
        """Strides in elements (not bytes); None when the byte strides are not whole elements."""
    @property
    def byte_strides(self) -> tuple[int, ...]: ...
    @property
    def copy_reason(self) -> str | None:
        """Why exporting needs a copy (memory DLPack can't express as it is), or why the object's
        memory is a copy made when it was made (Arrow booleans, chunks, tables); None when exports
        share the source's memory."""
    @property
    def ndim(self) -> int: ...
    @property
    def dtype(self) -> Any:
        """The element type: a ``numpy.dtype`` where numpy can be imported (ml_dtypes' types,
        such as bfloat16, where ml_dtypes can), else its name (``str(obj.dtype)`` is the name
        either way)."""
    @property
    def itemsize(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def c_contiguous(self) -> bool: ...
    @property
    def f_contiguous(self) -> bool: ...
    @property
    def readonly(self) -> bool: ...
    @property
    def device(self) -> tuple[int, int]: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def stream(self) -> int | None: ...
    @property
    def __array_interface__(self) -> dict[str, Any]:
        """numpy's array interface (version 3) of host memory; AttributeError for device memory."""
    @property
    def __array_struct__(self) -> CapsuleType:
        """numpy's ``PyArrayInterface`` capsule of host memory described in place."""
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA array interface (version 3) of CUDA memory; AttributeError for host memory."""
