"""Arrow C structs that lie, handed to ``asdlpack`` and to our exports' ``requested_schema``:
released structs, lengths and offsets out of range, missing buffers and children, formats that
aren't UTF-8, and a stream that never ends. Each must be a ValueError or TypeError (a
MemoryError for the stream), never a crash or a Rust panic.

``test_arrow_hostile`` runs this module in a child process (``python -m
dlpack.tests._arrow_hostile_cases``), which prints one JSON line per case as it goes, so that a
crash fails the cases from the one that crashed on, not the test run.
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

from ._arrow_c import RELEASE, ArrowArray, ArrowSchema, array_in, schema_in

# name -> (the exception's type name, a fragment of its message, the call)
CASES: dict[str, tuple[str, str, Callable[[], object]]] = {}


def case(name: str, raises: str, match: str):
    def register(call):
        CASES[name] = (raises, match, call)
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


@case("a schema whose child is its own child", "ValueError", "nests deeper than 64")
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


def main(names: list[str]) -> int:
    for name in names or list(CASES):
        raises, _, call = CASES[name]
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
