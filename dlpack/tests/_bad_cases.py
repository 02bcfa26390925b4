"""Malformed inputs for asdlpack and the exception class each must raise (CASES), and odd but
valid layouts it must accept and export as copies (ACCEPTED).

Used in-process by test_bad_input.py and, as a crash canary, by running ``main()`` in a subprocess.
"""

from __future__ import annotations

import array
import ctypes
import sys

from ._helpers import ArrayInterface, CudaArrayInterface, cuda_iface

CASES: list[tuple[str, object, type[BaseException]]] = []
# Memory DLPack can't express directly (non-native byte order, byte strides that are not whole
# elements): accepted by the copy engine; exporting it makes a copy.
ACCEPTED: list[tuple[str, object]] = []

_KEEP = []  # buffers that fake pointers point into; never freed


def _buf(n=256):
    b = (ctypes.c_char * n).from_buffer_copy(bytes(i % 251 for i in range(n)))
    _KEEP.append(b)
    return b


def case(name, exc, needs=None):
    def deco(fn):
        CASES.append((name, (fn, needs), exc))
        return fn

    return deco


def accepted(name, needs=None):
    def deco(fn):
        ACCEPTED.append((name, (fn, needs)))
        return fn

    return deco


def _iface(**changes):
    buf = _buf()
    d = {"shape": (4,), "typestr": "<i4", "data": (ctypes.addressof(buf), False), "version": 3}
    for k, v in changes.items():
        if v is _DROP:
            d.pop(k)
        else:
            d[k] = v
    return ArrayInterface(d, owner=buf)


def _cai(**changes):
    d = cuda_iface(shape=(4,), typestr="<f4")
    for k, v in changes.items():
        if v is _DROP:
            d.pop(k)
        else:
            d[k] = v
    return CudaArrayInterface(d)


_DROP = object()

# --------------------------------------------------------------------------- array interface
# missing keys / wrong values -> ValueError
case("ai-missing-shape", ValueError)(lambda: _iface(shape=_DROP))
case("ai-missing-typestr", ValueError)(lambda: _iface(typestr=_DROP))
case("ai-missing-version", ValueError)(lambda: _iface(version=_DROP))
case("ai-missing-data-no-buffer", TypeError)(lambda: _iface(data=_DROP))
case("ai-version-2", ValueError)(lambda: _iface(version=2))
case("ai-version-0", ValueError)(lambda: _iface(version=0))
case("ai-negative-extent", ValueError)(lambda: _iface(shape=(-1,)))
case("ai-negative-extent-2d", ValueError)(lambda: _iface(shape=(2, -3)))
case("ai-shape-overflow", ValueError)(lambda: _iface(shape=(2**40, 2**40)))
case("ai-shape-overflow-bytes", ValueError)(lambda: _iface(shape=(2**62,)))
case("ai-shape-overflow-int64", ValueError)(lambda: _iface(shape=(2**63,)))
case("ai-strides-wrong-length", ValueError)(lambda: _iface(strides=(4, 4)))
case("ai-strides-overflow", ValueError)(lambda: _iface(strides=(2**62,)))
case("ai-null-data-nonzero-size", ValueError)(lambda: _iface(data=(0, False)))
case("ai-bad-typestr-x9", ValueError)(lambda: _iface(typestr="x9"))
case("ai-bad-typestr-empty", ValueError)(lambda: _iface(typestr=""))
case("ai-bad-typestr-nosize", ValueError)(lambda: _iface(typestr="<f"))
case("ai-bad-typestr-size-nan", ValueError)(lambda: _iface(typestr="<iq"))
# 3 int32 in 11 bytes: one byte short (the exact fit is test_bad_input's)
case("ai-buffer-one-byte-short", ValueError)(
    lambda: ArrayInterface({"shape": (3,), "typestr": "<i4", "data": bytearray(11), "version": 3})
)
case("ai-buffer-strided-one-byte-short", ValueError)(
    lambda: ArrayInterface(
        {"shape": (2, 3), "strides": (16, 4), "typestr": "<i4", "data": bytearray(27), "version": 3}
    )
)
case("ai-buffer-offset-one-byte-short", ValueError)(
    lambda: ArrayInterface(
        {"shape": (3,), "typestr": "<i4", "data": bytearray(12), "offset": 1, "version": 3}
    )
)
case("ai-buffer-too-small", ValueError)(
    lambda: ArrayInterface({"shape": (100,), "typestr": "<i4", "data": bytearray(8), "version": 3})
)
# wrong types -> TypeError
case("ai-not-a-dict", TypeError)(lambda: ArrayInterface(5))
case("ai-none", TypeError)(lambda: ArrayInterface(None))
case("ai-shape-list", TypeError)(lambda: _iface(shape=[4]))
case("ai-shape-int", TypeError)(lambda: _iface(shape=4))
case("ai-shape-str-entry", TypeError)(lambda: _iface(shape=("a",)))
case("ai-shape-float-entry", TypeError)(lambda: _iface(shape=(4.0,)))
case("ai-strides-list", TypeError)(lambda: _iface(strides=[4]))
case("ai-strides-str-entry", TypeError)(lambda: _iface(strides=("4",)))
case("ai-typestr-int", TypeError)(lambda: _iface(typestr=4))
case("ai-typestr-none", ValueError)(lambda: _iface(typestr=None))
case("ai-version-str", TypeError)(lambda: _iface(version="3"))
case("ai-data-str", TypeError)(lambda: _iface(data="abc"))
case("ai-data-int", TypeError)(lambda: _iface(data=123))
case("ai-data-ptr-str", TypeError)(lambda: _iface(data=("x", False)))
case("ai-data-1-tuple", ValueError)(lambda: _iface(data=(ctypes.addressof(_buf()),)))
# memory DLPack can't express -> BufferError
case("ai-object", BufferError)(lambda: _iface(typestr="|O8"))
case("ai-unicode", BufferError)(lambda: _iface(typestr="<U1"))
case("ai-bytes-string", BufferError)(lambda: _iface(typestr="|S4"))
case("ai-datetime", BufferError)(lambda: _iface(typestr="<M8[s]"))
case("ai-timedelta", BufferError)(lambda: _iface(typestr="<m8[s]"))
case("ai-void", BufferError)(lambda: _iface(typestr="|V4"))
case("ai-structured", BufferError)(
    lambda: _iface(typestr="|V8", descr=[("a", "<i4"), ("b", "<f4")])
)
case("ai-long-double", BufferError)(lambda: _iface(typestr="<f16"))
accepted("ai-big-endian-int")(lambda: _iface(typestr=">i4"))
accepted("ai-big-endian-float")(lambda: _iface(typestr=">f8"))
accepted("ai-big-endian-complex")(lambda: _iface(typestr=">c8"))
accepted("ai-stride-not-multiple")(lambda: _iface(shape=(3,), strides=(6,)))
accepted("ai-stride-not-multiple-2d")(lambda: _iface(shape=(2, 2), strides=(8, 2)))

# --------------------------------------------------------------------------- CUDA array interface
case("cai-mask", BufferError)(lambda: _cai(mask=object()))
case("cai-stream-0", ValueError)(lambda: _cai(stream=0))
case("cai-missing-version", ValueError)(lambda: _cai(version=_DROP))
case("cai-missing-shape", ValueError)(lambda: _cai(shape=_DROP))
case("cai-missing-typestr", ValueError)(lambda: _cai(typestr=_DROP))
case("cai-missing-data", ValueError)(lambda: _cai(data=_DROP))
case("cai-version-0", ValueError)(lambda: _cai(version=0))
case("cai-negative-extent", ValueError)(lambda: _cai(shape=(-2,)))
case("cai-shape-overflow", ValueError)(lambda: _cai(shape=(2**40, 2**40)))
case("cai-null-data-nonzero-size", ValueError)(lambda: _cai(data=(0, False)))
case("cai-bad-typestr", ValueError)(lambda: _cai(typestr="x9"))
case("cai-strides-wrong-length", ValueError)(lambda: _cai(strides=(4, 4)))
case("cai-stream-str", TypeError)(lambda: _cai(stream="x"))
case("cai-shape-list", TypeError)(lambda: _cai(shape=[4]))
case("cai-data-int", TypeError)(lambda: _cai(data=123))
case("cai-not-a-dict", TypeError)(lambda: CudaArrayInterface(7))
accepted("cai-big-endian")(lambda: _cai(typestr=">f4"))
case("cai-object", BufferError)(lambda: _cai(typestr="|O8"))
accepted("cai-stride-not-multiple")(lambda: _cai(shape=(3,), strides=(6,)))

# --------------------------------------------------------------------------- buffer protocol


class _BEStruct(ctypes.Structure):
    _fields_ = [("a", ctypes.c_int32), ("b", ctypes.c_float)]


case("buf-char-format", BufferError)(lambda: (ctypes.c_char * 4)())
case("buf-struct-format", BufferError)(lambda: (_BEStruct * 2)())
accepted("buf-big-endian-u16")(lambda: (ctypes.c_uint16.__ctype_be__ * 3)(1, 2, 0x1234))
accepted("buf-big-endian-double")(lambda: (ctypes.c_double.__ctype_be__ * 3)(1.5, -2.0, 1e300))
case("buf-array-wchar", BufferError)(lambda: array.array("w" if "w" in array.typecodes else "u"))
case("buf-long-double", BufferError, needs="numpy")(
    lambda: memoryview(__import__("numpy").zeros(2, dtype="g"))
)
accepted("buf-numpy-big-endian", needs="numpy")(
    lambda: memoryview(__import__("numpy").arange(-2, 4, dtype=">i4"))
)
case("buf-numpy-structured", BufferError, needs="numpy")(
    lambda: memoryview(__import__("numpy").zeros(2, dtype=[("a", "<i4"), ("b", "<f4")]))
)
case("buf-numpy-bytes", BufferError, needs="numpy")(
    lambda: memoryview(__import__("numpy").zeros(2, dtype="S3"))
)


def _misaligned_strides():
    np = __import__("numpy")
    base = np.arange(16, dtype=np.int32)
    return np.lib.stride_tricks.as_strided(base, shape=(3,), strides=(6,))


accepted("buf-stride-not-multiple", needs="numpy")(lambda: memoryview(_misaligned_strides()))

# --------------------------------------------------------------------------- numpy arrays
for _name, _dt in [
    ("datetime", "M8[s]"),
    ("timedelta", "m8[ms]"),
    ("unicode", "U3"),
    ("bytes", "S3"),
    ("object", "O"),
    ("structured", [("a", "<i4"), ("b", "<f8")]),
    ("long-double", "g"),
    ("void", "V3"),
]:
    case(f"np-{_name}", BufferError, needs="numpy")(
        lambda _dt=_dt: __import__("numpy").zeros(3, dtype=_dt)
    )
for _name, _dt in [("big-endian-int", ">i4"), ("big-endian-float", ">f8")]:
    accepted(f"np-{_name}", needs="numpy")(
        lambda _dt=_dt: __import__("numpy").arange(-1, 5, dtype=_dt).reshape(2, 3)
    )
accepted("np-stride-not-multiple", needs="numpy")(_misaligned_strides)

# --------------------------------------------------------------------------- no protocol at all
for _name, _val in [
    ("object", object()),
    ("int", 5),
    ("none", None),
    ("str", "abc"),
    ("float", 1.5),
    ("list", [1, 2, 3]),
    ("dict", {}),
]:
    case(f"none-{_name}", TypeError)(lambda _val=_val: _val)

# --------------------------------------------------------------------------- capsules / producers

_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_FOREIGN = b"some.other.capsule"


def _foreign_capsule():
    return _PyCapsule_New(ctypes.addressof(_buf()), _FOREIGN, None)


class _ReturnsNonCapsule:
    def __dlpack__(self, **kwargs):
        return 42

    def __dlpack_device__(self):
        return (1, 0)


class _ReturnsForeignCapsule:
    def __dlpack__(self, **kwargs):
        return _foreign_capsule()

    def __dlpack_device__(self):
        return (1, 0)


def _used_capsule():
    from dlpack import asdlpack

    cap = asdlpack(bytearray(4)).__dlpack__(max_version=(1, 0))
    asdlpack(cap)
    return cap


def _used_legacy_capsule():
    from dlpack import asdlpack

    cap = asdlpack(bytearray(4)).__dlpack__()
    asdlpack(cap)
    return cap


case("capsule-foreign-name", TypeError)(_foreign_capsule)
case("capsule-used", ValueError)(_used_capsule)
case("capsule-used-legacy", ValueError)(_used_legacy_capsule)
case("producer-returns-int", TypeError)(_ReturnsNonCapsule)
case("producer-returns-foreign-capsule", TypeError)(_ReturnsForeignCapsule)


def available(needs) -> bool:
    """Whether the library a case needs imports here (as the report imports it: after the crash
    probe, so a library that crashes the interpreter is not tried)."""
    from dlpack._report import library

    return needs is None or library(needs).ok


def run_case(name, factory_and_needs, exc_class):
    """Returns (status, detail): status is 'ok' (exactly exc_class was raised), 'wrong' (another
    class, a subclass, or no exception), 'skip'."""
    from dlpack import asdlpack

    factory, needs = factory_and_needs
    if not available(needs):
        return "skip", f"needs {needs}"
    value = factory()
    try:
        obj = asdlpack(value)
    except BaseException as exc:
        if type(exc) is exc_class:
            return "ok", ""
        return "wrong", f"{type(exc).__name__}: {exc}"
    return "wrong", f"no exception (got {obj!r})"


def run_accepted(name, factory_and_needs):
    """An odd layout: asdlpack accepts it and says why it needs a copy; on the CPU, exports copy
    (copy=None, copy=True) or raise BufferError (copy=False). Returns (status, detail, obj)."""
    from dlpack import asdlpack

    factory, needs = factory_and_needs
    if not available(needs):
        return "skip", f"needs {needs}", None
    value = factory()
    try:
        obj = asdlpack(value)
    except BaseException as exc:
        return "wrong", f"asdlpack raised {type(exc).__name__}: {exc}", None
    if not (isinstance(obj.copy_reason, str) and obj.copy_reason):
        return "wrong", f"copy_reason is {obj.copy_reason!r}", obj
    if name.startswith("cai-"):  # metadata only: no CUDA memory behind the fake pointer
        return "ok", "", obj
    for max_version in (None, (1, 3)):
        for copy in (None, True):
            try:
                obj.__dlpack__(max_version=max_version, copy=copy)
            except BaseException as exc:
                return "wrong", f"copy={copy} raised {type(exc).__name__}: {exc}", obj
        try:
            obj.__dlpack__(max_version=max_version, copy=False)
        except BufferError:
            pass
        except BaseException as exc:
            return "wrong", f"copy=False raised {type(exc).__name__}: {exc}", obj
        else:
            return "wrong", "copy=False exported memory that needs a copy", obj
    return "ok", "", obj


def main(rounds: int = 3) -> int:
    """Runs every case `rounds` times; the exit status is 1 when any round got a wrong answer
    (a later round can differ from the first: state left behind by earlier cases)."""
    counts = {"ok": 0, "wrong": 0, "skip": 0}
    for _ in range(rounds):
        for name, fac, exc_class in CASES:
            status, detail = run_case(name, fac, exc_class)
            counts[status] += 1
            if status == "wrong":
                print(f"WRONG {name}: {detail}")
        for name, fac in ACCEPTED:
            status, detail, _ = run_accepted(name, fac)
            counts[status] += 1
            if status == "wrong":
                print(f"WRONG {name}: {detail}")
    print("SUMMARY", " ".join(f"{k}={v}" for k, v in counts.items()))
    sys.stdout.flush()
    return 1 if counts["wrong"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
