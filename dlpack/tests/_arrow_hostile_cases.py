"""Arrow C structs that lie, handed to ``asdlpack`` and to our exports' ``requested_schema``:
released structs, lengths and offsets out of range (to the largest an int64 holds), missing
buffers and children, formats that aren't UTF-8, schemas whose nodes are shared, and streams
that never end or claim more memory than there is. Each must be a ValueError or TypeError (a
MemoryError for the streams), never a crash or a Rust panic.

``test_arrow_hostile`` runs this module in a child process (``python -m
dlpack.tests._arrow_hostile_cases [NAMES]``), which prints one JSON line per case as it goes,
so that a crash fails the cases from the one that crashed on, not the test run. The cases of
``SHARED`` run in a child of their own, under a time limit: walked node by node, such a schema
never ends.
"""

from __future__ import annotations

import ctypes
import json
import resource
import sys
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from dlpack import asdlpack

from ._arrow_c import (
    GET_NEXT,
    RELEASE,
    ArrowArray,
    ArrowArrayStream,
    ArrowSchema,
    array_in,
    new_capsule,
    schema_in,
)

# name -> (the exception's type name, or None for a call that must return, a fragment of its
# message, the call)
Case = tuple[str | None, str, Callable[[], object]]
CASES: dict[str, Case] = {}
SHARED: dict[str, Case] = {}


def case(name: str, raises: str | None, match: str, group: dict[str, Case] = CASES):
    def register(call):
        group[name] = (raises, match, call)
        return call

    return register


class Pair:
    """An object whose ``__arrow_c_array__`` returns the capsules it was given, as they are."""

    def __init__(self, capsules, keep=()):
        self.capsules, self.keep = capsules, keep

    def __arrow_c_array__(self, requested_schema=None):
        return self.capsules


def _marks_released(struct_type):
    # The producer's own release would follow the lies (a NULL children pointer...): edited
    # structs are leaked instead, and marked released, as a release must.
    @RELEASE
    def release(address):
        struct_type.from_address(address).release = None

    return release


_RELEASES = {struct: _marks_released(struct) for struct in (ArrowSchema, ArrowArray)}


def edited(source, schema=None, array=None) -> Pair:
    """``source``'s exported capsules with fields of its schema and array overwritten (bytes
    values become C strings, kept alive with the pair), and a release that only marks them
    released."""
    capsules = source.__arrow_c_array__()
    keep = []
    for struct, fields in ((schema_in(capsules[0]), schema), (array_in(capsules[1]), array)):
        struct.release = ctypes.cast(_RELEASES[type(struct)], ctypes.c_void_p).value
        for name, value in (fields or {}).items():
            if isinstance(value, bytes):
                keep.append(ctypes.create_string_buffer(value))
                value = ctypes.addressof(keep[-1])
            setattr(struct, name, value)
    pair = Pair(capsules, keep)
    # Never dropped: a capsule whose release is a ctypes callback must not be destroyed while
    # the error it caused is being raised (the callback would run with the exception set).
    _KEPT.append(pair)
    return pair


_KEPT: list[Pair] = []


def imported_elsewhere(source) -> Pair:
    """``source``'s capsules after another consumer (pyarrow) imported them: released."""
    capsules = source.__arrow_c_array__()
    pa.Array._import_from_c_capsule(*capsules)
    return Pair(capsules)


NUMBERS = pa.array([1.0, 2.0, 3.0])
WITH_NULLS = pa.array([1.0, None, 3.0])
LISTS = pa.array([[1, 2], [3, 4]], pa.list_(pa.int64(), 2))

# 1. Released structs.
case("released array and schema", "ValueError", "is released")(
    lambda: asdlpack(imported_elsewhere(NUMBERS))
)
case("released array only", "ValueError", "Arrow array is released")(
    lambda: asdlpack(edited(NUMBERS, array={"release": None}))
)
case("released schema only", "ValueError", "Arrow schema is released")(
    lambda: asdlpack(edited(NUMBERS, schema={"release": None}))
)


@case("the same capsules read twice", "ValueError", "is released")
def _twice():
    pair = Pair(NUMBERS.__arrow_c_array__())
    assert np.from_dlpack(asdlpack(pair)).tolist() == [1.0, 2.0, 3.0]
    asdlpack(pair)


# 2. Lengths and offsets that lie, with and without a validity bitmap.
for _source, _label in ((WITH_NULLS, "with a bitmap"), (NUMBERS, "without a bitmap")):
    for _field, _value, _match in (
        ("length", -1, r"length \(-1\)"),
        ("offset", -5, r"offset \(-5\)"),
        ("offset", 2**62, "reach past the memory"),
        ("length", 2**62, "reach past the memory"),
        ("offset", 2**63 - 1, "reach past the memory"),
        ("length", 2**63 - 1, "reach past the memory"),
        ("null_count", -2, r"null count \(-2\)"),
    ):
        case(f"{_field} {_value} {_label}", "ValueError", _match)(
            lambda s=_source, f=_field, v=_value: asdlpack(edited(s, array={f: v}))
        )
    # Each alone stays inside an i64; their sum, where the array ends, does not.
    case(
        f"offset + length past 2**63 {_label}",
        "ValueError",
        r"length \(4611686018427387904\) and offset",
    )(lambda s=_source: asdlpack(edited(s, array={"offset": 2**62, "length": 2**62})))
case("nulls said, no bitmap", "ValueError", "no validity bitmap")(
    lambda: asdlpack(edited(NUMBERS, array={"null_count": 1}))
)

# 3. Malformed structs: buffers, children, formats.
for _n in (0, 1, 3):
    case(f"n_buffers {_n}", "ValueError", f"it has {_n} buffers")(
        lambda n=_n: asdlpack(edited(NUMBERS, array={"n_buffers": n}))
    )
case("buffers pointer NULL", "ValueError", "buffers pointer is NULL")(
    lambda: asdlpack(edited(NUMBERS, array={"buffers": None}))
)
case("children said, none given", "ValueError", "children pointer is NULL")(
    lambda: asdlpack(edited(LISTS, array={"children": None}))
)
case("a list array without its child", "ValueError", "0 children")(
    lambda: asdlpack(edited(LISTS, array={"n_children": 0}))
)
case("a list child too short", "ValueError", "child 0 has 4 elements")(
    lambda: asdlpack(edited(LISTS, array={"length": 3}))
)
for _format, _source in (
    ("+w:2", LISTS),
    ("+l", pa.array([[1, 2]])),
    ("+m", pa.array([[(1, 2)]], pa.map_(pa.int64(), pa.int64()))),
):
    case(f"{_format} schema without children", "ValueError", "needs 1 child type")(
        lambda s=_source: asdlpack(edited(s, schema={"n_children": 0}))
    )
case("+r schema with one child", "ValueError", "needs 2 child type")(
    lambda: asdlpack(
        edited(pa.RunEndEncodedArray.from_arrays([2], [1.0]), schema={"n_children": 1})
    )
)
case("w:-1", "TypeError", r"FixedSizeBinary\(-1\)")(
    lambda: asdlpack(edited(pa.array([b"ab"], pa.binary(2)), schema={"format": b"w:-1"}))
)
case("+w:-1", "ValueError", r"negative size \(-1\)")(
    lambda: asdlpack(edited(LISTS, schema={"format": b"+w:-1"}))
)
case("format not UTF-8", "ValueError", "format is not UTF-8")(
    lambda: asdlpack(edited(NUMBERS, schema={"format": b"\xff\xfe"}))
)
case("name not UTF-8", "ValueError", "name is not UTF-8")(
    lambda: asdlpack(edited(NUMBERS, schema={"name": b"\xff"}))
)
case("format NULL", "ValueError", "format is NULL")(
    lambda: asdlpack(edited(NUMBERS, schema={"format": None}))
)
case("negative children", "ValueError", "number of children is negative")(
    lambda: asdlpack(edited(NUMBERS, schema={"n_children": -1}))
)


@case("a schema whose child is its own child", "ValueError", "child 0 is a schema already in")
def _cycle():
    pair = edited(LISTS)
    children = ctypes.cast(schema_in(pair.capsules[0]).children, ctypes.POINTER(ctypes.c_void_p))
    child = ArrowSchema.from_address(children[0])
    child.n_children, child.children = 1, ctypes.cast(children, ctypes.c_void_p).value
    asdlpack(pair)


# ... and the same schemas as a consumer's requested_schema, to each of our export methods.
_OURS = asdlpack(np.arange(6.0).reshape(2, 3))
for _method in (
    "__arrow_c_array__",
    "__arrow_c_stream__",
    "__arrow_c_device_array__",
    "__arrow_c_device_stream__",
):
    for _label, _make, _match in (
        ("released", lambda: imported_elsewhere(NUMBERS), "is released"),
        ("+w:3 without its child", lambda: edited(LISTS, schema={"n_children": 0}), "needs 1"),
        ("format not UTF-8", lambda: edited(NUMBERS, schema={"format": b"\xff"}), "UTF-8"),
        ("format NULL", lambda: edited(NUMBERS, schema={"format": None}), "format is NULL"),
    ):
        case(f"requested_schema {_label} to {_method}", "ValueError", _match)(
            lambda m=_method, make=_make: getattr(_OURS, m)(make().capsules[0])
        )


# 4. A stream that never ends, under an address-space limit: a MemoryError naming what was
# read, long before the producer (pyarrow, which holds every batch) runs out.
@case("a stream that never ends", "MemoryError", "arrays read so far hold")
def _endless():
    schema = pa.schema([("a", pa.float64())])
    batch = pa.record_batch([pa.array(np.ones(1 << 20))], schema=schema)  # 8 MiB

    def forever():
        while True:
            yield pa.record_batch([pa.array(np.ones(1 << 20))], schema=schema)

    reader = pa.RecordBatchReader.from_batches(schema, forever())
    del batch
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (1 << 30), hard))
    try:
        asdlpack(reader)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


# 5. Structs made here, field by field: schemas whose nodes are shared, and sizes that sum
# past 2**64.
_HELD: list[object] = []  # everything made below, alive as long as the process


def _held(obj):
    _HELD.append(obj)
    return obj


def _pointers(addresses) -> int:
    return ctypes.addressof(_held((ctypes.c_void_p * max(len(addresses), 1))(*addresses)))


def _schema(fmt: bytes, children=(), dictionary=None) -> ArrowSchema:
    schema = _held(ArrowSchema())
    schema.format = ctypes.addressof(_held(ctypes.create_string_buffer(fmt)))
    schema.n_children = len(children)
    schema.children = _pointers([ctypes.addressof(child) for child in children])
    schema.dictionary = None if dictionary is None else ctypes.addressof(dictionary)
    schema.release = ctypes.cast(_RELEASES[ArrowSchema], ctypes.c_void_p).value
    return schema


def _array(length: int, buffers, children=()) -> ArrowArray:
    array = _held(ArrowArray())
    array.length, array.offset, array.null_count = length, 0, 0
    array.n_buffers = len(buffers)
    array.buffers = ctypes.cast(_pointers(buffers), ctypes.POINTER(ctypes.c_void_p))
    array.n_children = len(children)
    array.children = _pointers([ctypes.addressof(child) for child in children])
    array.release = ctypes.cast(_RELEASES[ArrowArray], ctypes.c_void_p).value
    return array


def _schema_capsule(schema: ArrowSchema):
    return _held(new_capsule(ctypes.addressof(schema), b"arrow_schema", None))


def _pair(schema: ArrowSchema, array: ArrowArray) -> Pair:
    capsule = _held(new_capsule(ctypes.addressof(array), b"arrow_array", None))
    return _held(Pair((_schema_capsule(schema), capsule)))


class _Stream:
    """A raw ``arrow_array_stream`` capsule of ``schema`` and then ``array``, once: each moved
    out as the interface moves structs (a byte copy; the copies' release only marks them)."""

    def __init__(self, schema: ArrowSchema, array: ArrowArray | None):
        self.schema, self.array = schema, array

        @GET_NEXT
        def get_schema(_stream, out):
            ctypes.memmove(out, ctypes.addressof(self.schema), ctypes.sizeof(ArrowSchema))
            return 0

        @GET_NEXT
        def get_next(_stream, out):
            if self.array is None:
                ctypes.memset(out, 0, ctypes.sizeof(ArrowArray))  # released: the end
            else:
                ctypes.memmove(out, ctypes.addressof(self.array), ctypes.sizeof(ArrowArray))
                self.array = None
            return 0

        @RELEASE
        def release(address):
            ArrowArrayStream.from_address(address).release = None

        self.callbacks = (get_schema, get_next, release)
        stream = ArrowArrayStream()
        stream.get_schema, stream.get_next = (
            ctypes.cast(f, ctypes.c_void_p).value for f in self.callbacks[:2]
        )
        stream.release = ctypes.cast(release, ctypes.c_void_p).value
        self.struct = stream
        self.capsule = new_capsule(ctypes.addressof(stream), b"arrow_array_stream", None)
        _held(self)


def _shared(depth: int, *, dictionary: bool = False) -> ArrowSchema:
    """A schema ``depth`` levels deep whose every node has two edges to one node below (two
    children, or a child that is also its dictionary): ``depth`` structs standing for a tree of
    2**depth leaves."""
    node = _schema(b"g")
    for _ in range(depth):
        if dictionary:
            node = _schema(b"+w:1", [node], dictionary=node)
        else:
            node = _schema(b"+s", [node, node])
    return node


for _label, _dictionary, _match in (
    ("two children", False, "child 1 is a schema already in the tree"),
    ("a child that is its dictionary", True, "dictionary is a schema already in the tree"),
):
    for _depth in (20, 40):
        _name = f"{_depth} levels of {_label}"
        case(f"{_name}, imported", "ValueError", _match, SHARED)(
            lambda d=_depth, x=_dictionary: asdlpack(
                _held(
                    Pair(
                        (_schema_capsule(_shared(d, dictionary=x)), NUMBERS.__arrow_c_array__()[1])
                    )
                )
            )
        )
        case(f"{_name}, a stream's schema", "ValueError", _match, SHARED)(
            lambda d=_depth, x=_dictionary: asdlpack(
                _Stream(_shared(d, dictionary=x), None).capsule
            )
        )
        for _method in ("__arrow_c_array__", "__arrow_c_stream__"):
            case(f"{_name}, requested of {_method}", "ValueError", _match, SHARED)(
                lambda d=_depth, x=_dictionary, m=_method: getattr(_OURS, m)(
                    _schema_capsule(_shared(d, dictionary=x))
                )
            )


# 6. Sizes whose sum passes 2**64: lists of no elements (size 0) at 20 levels, each level's
# length the largest an int64 holds and no validity bitmaps, which spans no memory and reads
# fine ...
@case("fixed-size lists of size 0, 20 levels of 2**63 - 1 rows", None, "")
def _empty_levels():
    levels = 20
    schema, array = _schema(b"g"), _array(0, [None, None])
    for _ in range(levels):
        schema, array = _schema(b"+w:0", [schema]), _array(2**63 - 1, [None], [array])
    obj = asdlpack(_pair(schema, array))
    assert obj.shape == (2**63 - 1, *[0] * levels), obj.shape


# ... and a stream's table of 600 columns of int8, each claiming 2**55 bytes of one small
# buffer (an address range that can exist): together past 2**64, more than any process holds.
@case(
    "a stream whose table's columns claim 600 * 2**55 bytes",
    "MemoryError",
    "arrays read so far hold",
)
def _huge_columns():
    columns, rows = 600, 2**55
    data = _held(np.zeros(64, np.int8))
    schema = _schema(b"+s", [_schema(b"c") for _ in range(columns)])
    leaves = [_array(rows, [None, data.ctypes.data]) for _ in range(columns)]
    asdlpack(_Stream(schema, _array(rows, [None], leaves)).capsule)


def main(names: list[str]) -> int:
    for name in names or list(CASES):
        raises, _, call = CASES.get(name) or SHARED[name]
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - PanicException is a BaseException
            outcome = {"raised": type(exc).__name__, "message": str(exc)}
        else:
            outcome = {"raised": None, "message": ""}
        print(json.dumps({"case": name, **outcome}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
