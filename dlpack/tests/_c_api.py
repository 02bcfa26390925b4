"""The runtime's C API (the capsule ``dlpack._dlpack._C_API``) declared for ctypes, as a C
extension declares it by including ``dlpack_adapter.h`` (``dlpack.get_include()``): the tests'
one declaration, which ``test_c_api`` checks field by field against the header."""

import ctypes

from dlpack import _dlpack

DLPACK_ADAPTER_ABI_VERSION = 2
DLPACK_ADAPTER_FEATURE_VERSION = 1
CAPSULE_NAME = b"dlpack._dlpack._C_API"

DLPACK_ADAPTER_VIEW_MUTABLE = 1
DLPACK_ADAPTER_VIEW_SWAPPED = 2
DLPACK_ADAPTER_VIEW_INDIRECT = 4
DLPACK_ADAPTER_VIEW_C_CONTIGUOUS = 8
DLPACK_ADAPTER_VIEW_READONLY = 16
DLPACK_ADAPTER_MEMORY_READONLY = 1


# DLPack's two structs, as the header declares them (where dlpack.h isn't included first); kept
# here rather than taken from _helpers, so that sharing's worker processes import no pytest.
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLPackAdapterView(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("dtype", DLDataType),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("byte_strides", ctypes.POINTER(ctypes.c_int64)),
        ("held", ctypes.c_void_p),
    ]

    def __init__(self) -> None:
        """As ``DLPACK_ADAPTER_VIEW_INIT``: zeroed, its size set."""
        super().__init__(size=ctypes.sizeof(DLPackAdapterView))


RELEASE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLPackAdapterMemory(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("data", ctypes.c_void_p),
        ("dtype", DLDataType),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("byte_strides", ctypes.POINTER(ctypes.c_int64)),
        ("release", RELEASE),
        ("context", ctypes.c_void_p),
    ]

    def __init__(self, **fields) -> None:
        """As ``DLPACK_ADAPTER_MEMORY_INIT``, then ``fields``."""
        super().__init__(size=ctypes.sizeof(DLPackAdapterMemory), **fields)


# PYFUNCTYPE: called holding the GIL, and a raised exception comes back as one (as in C, where
# -1 or NULL says one is set). Views and memory are passed as addresses (c_void_p), so that a
# test may hand over a struct of another size, as a client built against another header would.
_VIEW = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_uint32, ctypes.c_void_p)
_RELEASE_VIEW = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)
_COPY_TO = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_COPY_FROM = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_FROM_MEMORY = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p)
_CHECK_MEMORY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_uint64)


class DLPackAdapterAPI(ctypes.Structure):
    _fields_ = [
        ("abi_version", ctypes.c_uint32),
        ("feature_version", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("view", _VIEW),
        ("release_view", _RELEASE_VIEW),
        ("copy_to", _COPY_TO),
        ("copy_from", _COPY_FROM),
        ("from_memory", _FROM_MEMORY),
        ("check_memory", _CHECK_MEMORY),
    ]


STRUCTS = (DLDevice, DLDataType, DLPackAdapterView, DLPackAdapterMemory, DLPackAdapterAPI)


def table() -> DLPackAdapterAPI:
    """The runtime's table, read from its capsule."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    get.restype = ctypes.c_void_p
    return DLPackAdapterAPI.from_address(get(_dlpack._C_API, CAPSULE_NAME))


def address(struct: ctypes.Structure | None) -> int | None:
    """Where ``struct`` lies, for the table's functions (None: NULL)."""
    return None if struct is None else ctypes.addressof(struct)
