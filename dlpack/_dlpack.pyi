"""Type stubs for the Rust extension ``dlpack._dlpack``."""

from typing import Any, SupportsIndex, final

from typing_extensions import CapsuleType

__all__ = ["DLPACK_VERSION", "DLPackObject", "__version__", "_footprint", "asdlpack", "copyto"]

DLPACK_VERSION: tuple[int, int]
__version__: str

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
    broadcast and bad streams.
    """

def _footprint(ndim: int) -> list[tuple[str, int]]:
    """Bytes behind our objects for a tensor of ``ndim`` dimensions (for memory reports)."""

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
    def __reduce_ex__(self, protocol: SupportsIndex, /) -> tuple[Any, ...]:
        """Pickle support: host memory goes out of band with protocol 5 (no copy), in the
        pickle before; device memory raises BufferError."""
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...] | None:
        """Strides in elements (not bytes); None when the byte strides are not whole elements."""
    @property
    def byte_strides(self) -> tuple[int, ...]: ...
    @property
    def copy_reason(self) -> str | None:
        """Why exporting needs a copy (memory DLPack can't express as it is), or None."""
    @property
    def ndim(self) -> int: ...
    @property
    def dtype(self) -> str: ...
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
