"""Zero-copy DLPack exchange for any Python array: ``asdlpack(obj)``.

``asdlpack`` accepts anything that speaks DLPack (``__dlpack__`` or a raw capsule), the CUDA array
interface, the array interface (``__array_interface__`` / ``__array_struct__``) or the buffer
protocol, and returns a :class:`DLPackObject` that every ``from_dlpack`` accepts::

    import torch
    from dlpack import asdlpack

    t = torch.from_dlpack(asdlpack(b"Hello!"))
"""

import os
from typing import Any

from ._dlpack import DLPACK_VERSION, DLDeviceType, DLPackObject, __version__, asdlpack, copyto

# dlpack.sharing (sockets, threads, ctypes) is imported on first use: most users never share, and
# importing it would double the time ``import dlpack`` takes.
_SHARING = ("SharedHandle", "SharedTree", "empty_shared", "share", "share_tree")
TYPE_CHECKING = False  # type checkers read the names from here (importing typing takes 10 ms)
if TYPE_CHECKING:
    from .sharing import SharedHandle, SharedTree, empty_shared, share, share_tree

__all__ = [
    "DLPACK_VERSION",
    "DLDeviceType",
    "DLPackObject",
    "SharedHandle",
    "SharedTree",
    "__version__",
    "asdlpack",
    "copyto",
    "empty_shared",
    "get_include",
    "share",
    "share_tree",
]


def get_include() -> str:
    """The folder holding ``dlpack_adapter.h``, the C header of the runtime's C API (the capsule
    ``dlpack._dlpack._C_API``), for a C or C++ extension's include path, as
    ``numpy.get_include()`` gives numpy's::

        Extension("ext", ["ext.c"], include_dirs=[dlpack.get_include()])
    """
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


def __getattr__(name: str) -> Any:
    if name in _SHARING:
        from . import sharing

        # Kept here, so that later lookups (``dlpack.share`` per message) skip this function.
        value = globals()[name] = getattr(sharing, name)
        return value
    raise AttributeError(f"module 'dlpack' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_SHARING})
