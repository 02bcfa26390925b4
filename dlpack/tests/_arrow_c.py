"""The Arrow C data, stream and device interfaces' structs in ctypes, as a C consumer or a
producer sees them (``arrow/c/abi.h``): to drive our exports as C code does, and to hand our
import structs that lie."""

from __future__ import annotations

import ctypes


class ArrowSchema(ctypes.Structure):
    pass


ArrowSchema._fields_ = [
    ("format", ctypes.c_void_p),
    ("name", ctypes.c_void_p),
    ("metadata", ctypes.c_void_p),
    ("flags", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("children", ctypes.c_void_p),
    ("dictionary", ctypes.c_void_p),
    ("release", ctypes.c_void_p),
    ("private", ctypes.c_void_p),
]


class ArrowArray(ctypes.Structure):
    _fields_ = [
        *[(name, ctypes.c_int64) for name in ("length", "null_count", "offset")],
        *[(name, ctypes.c_int64) for name in ("n_buffers", "n_children")],
        ("buffers", ctypes.POINTER(ctypes.c_void_p)),
        *[(name, ctypes.c_void_p) for name in ("children", "dictionary", "release", "private")],
    ]


class ArrowArrayStream(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_void_p)
        for name in ("get_schema", "get_next", "get_last_error", "release", "private")
    ]


class ArrowDeviceArray(ctypes.Structure):
    _fields_ = [
        ("array", ArrowArray),
        ("device_id", ctypes.c_int64),
        ("device_type", ctypes.c_int32),
        ("sync_event", ctypes.c_void_p),
        ("reserved", ctypes.c_int64 * 3),
    ]


class ArrowDeviceArrayStream(ctypes.Structure):
    _fields_ = [
        ("device_type", ctypes.c_int32),
        *[
            (name, ctypes.c_void_p)
            for name in ("get_schema", "get_next", "get_last_error", "release", "private")
        ],
    ]


GET_NEXT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
GET_LAST_ERROR = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)
RELEASE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
capsule_pointer.restype = ctypes.c_void_p
capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

new_capsule = ctypes.pythonapi.PyCapsule_New
new_capsule.restype = ctypes.py_object
new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def schema_in(capsule) -> ArrowSchema:
    """The ``ArrowSchema`` an ``arrow_schema`` capsule holds, in place (writes change it)."""
    return ArrowSchema.from_address(capsule_pointer(capsule, b"arrow_schema"))


def array_in(capsule) -> ArrowArray:
    """The ``ArrowArray`` an ``arrow_array`` capsule holds, in place."""
    return ArrowArray.from_address(capsule_pointer(capsule, b"arrow_array"))
