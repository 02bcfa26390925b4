"""Fuzzing the Arrow import: hypothesis builds ``ArrowSchema`` / ``ArrowArray`` trees from
scratch in ctypes (formats valid and not, child counts that match or don't, NULL pointers,
released structs, lengths, offsets and null counts in and far out of range) and hands them to
``asdlpack`` as capsules. Every buffer holds 2 KiB, more than any small length and offset
reach, so a read out of bounds can only come from a claim the import failed to check; huge
claims must be refused.

Each example must give a ValueError, TypeError, BufferError or MemoryError, or an object
whose values are the buffer's (for arrays of numbers), and release each struct handed over
exactly once, never a child. ``test_arrow_hostile`` runs this in a child process:
``python -m dlpack.tests._arrow_fuzz EXAMPLES`` prints the number of examples it tried.
"""

from __future__ import annotations

import ctypes
import gc
import sys

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlpack import asdlpack

from ._arrow_c import RELEASE, ArrowArray, ArrowSchema, new_capsule

BUFFER_BYTES = 2048
NUMBERS = {"c": "int8", "C": "uint8", "s": "int16", "i": "int32", "l": "int64", "e": "float16"}
NUMBERS |= {"f": "float32", "g": "float64"}
FORMATS = [*NUMBERS, "b", "+w:2", "+w:0", "+w:-1", "+w:x", "+s", "+l", "+m", "+r", "u", "w:4"]
FORMATS += ["n", "tsu:", "", "\udcff", None]
HUGE = 2**62


class Made:
    """What one example made: the structs and buffers it must keep alive, and how often each
    struct was released."""

    def __init__(self):
        self.keep: list[object] = []
        self.released: dict[int, int] = {}

    def c_string(self, text):
        if text is None:
            return None
        raw = text.encode("utf-8", "surrogateescape")
        self.keep.append(ctypes.create_string_buffer(raw))
        return ctypes.addressof(self.keep[-1])

    def pointers(self, addresses):
        table = (ctypes.c_void_p * max(len(addresses), 1))(*addresses)
        self.keep.append(table)
        return ctypes.addressof(table)

    def make_live(self, struct):
        """Give ``struct`` a release that counts its calls by the struct's first address (its
        private data: consumers move structs before releasing them)."""
        struct_type = type(struct)

        @RELEASE
        def release(address):
            moved = struct_type.from_address(address)
            self.released[moved.private] = self.released.get(moved.private, 0) + 1
            moved.release = None

        self.keep.append(release)
        struct.private = ctypes.addressof(struct)
        struct.release = ctypes.cast(release, ctypes.c_void_p).value


def rarely(value, usual):
    """``usual`` nine times in ten, else ``value``: mostly sound structs, each field sometimes
    a lie."""
    return st.sampled_from([usual] * 9 + [value])


@st.composite
def schemas(draw, depth=0):
    """A schema tree: mostly one the import reads (numbers, fixed-size lists, tables), with
    any field sometimes wrong."""
    sound = draw(st.integers(0, 3)) > 0
    leaf = draw(st.sampled_from([*NUMBERS, "b"]))
    nested = ["+w:2", "+w:0", "+s"] if depth < 2 else []
    fmt = draw(st.sampled_from([leaf, *nested] if sound else FORMATS))
    if fmt in ("+w:2", "+w:0"):
        children = [draw(schemas(depth + 1))]
    elif fmt == "+s":
        children = [draw(schemas(depth + 2)) for _ in range(draw(st.integers(1, 3)))]
    else:
        children = draw(st.lists(schemas(depth + 1), max_size=2)) if depth < 2 and not sound else []
    return {
        "format": fmt,
        "name": draw(rarely("\udcff", None)),
        "children": children,
        "n_children": draw(rarely(draw(st.sampled_from([-1, 0, 3])), None)),
        "children_null": draw(rarely(True, False)),
        "live": draw(rarely(False, True)),
    }


@st.composite
def arrays(draw, schema, needed=None):
    """An array for ``schema``: its buffers and children as the type has them, long enough,
    mostly; each field sometimes a lie."""
    fmt = schema["format"] or ""
    small = st.integers(0, 5)
    length = draw(small) if needed is None else needed + draw(st.integers(0, 2))
    length = draw(rarely(draw(st.sampled_from([-1, HUGE])), length))
    offset = draw(rarely(draw(st.sampled_from([-1, HUGE, 3])), 0))
    end = max(length, 0) + max(offset, 0)
    if fmt.startswith("+w:") and fmt[3:].isdigit():
        sizes = [end * int(fmt[3:])]
    elif fmt == "+s":
        sizes = [end] * len(schema["children"])
    else:
        sizes = []
    buffers = ["bits" if draw(st.booleans()) else "null"]
    if not fmt.startswith("+"):
        buffers.append("data")
    if draw(st.integers(0, 9)) == 0:
        buffers = draw(st.lists(st.sampled_from(["data", "bits", "null"]), max_size=3))
    count = len(schema["children"])
    sizes = [*sizes, *[0] * count][:count]  # a wrong type's extra children: any length
    children = [
        draw(arrays(child, min(size, 40)))
        for child, size in zip(schema["children"], sizes, strict=True)
    ]
    return {
        "length": length,
        "offset": offset,
        "null_count": draw(rarely(draw(st.sampled_from([-1, 1, -2])), 0)),
        "buffers": buffers,
        "n_buffers": draw(rarely(draw(st.sampled_from([-1, 0, 1, 3])), None)),
        "buffers_null": draw(rarely(True, False)),
        "children": children,
        "n_children": draw(rarely(draw(st.sampled_from([-1, 0, 1])), None)),
        "live": draw(rarely(False, True)),
        "seed": draw(st.integers(0, 255)),
    }


@st.composite
def pairs(draw):
    schema = draw(schemas())
    return schema, draw(arrays(schema))


def build_schema(spec, made):
    schema = ArrowSchema()
    made.keep.append(schema)
    children = [build_schema(child, made) for child in spec["children"]]
    schema.format = made.c_string(spec["format"])
    schema.name = made.c_string(spec["name"])
    n = spec["n_children"]
    schema.n_children = len(children) if n is None else min(n, len(children))
    addresses = [ctypes.addressof(child) for child in children]
    schema.children = None if spec["children_null"] and not addresses else made.pointers(addresses)
    if spec["live"]:
        made.make_live(schema)
    return schema


def build_array(spec, made):
    array = ArrowArray()
    made.keep.append(array)
    children = [build_array(child, made)[0] for child in spec["children"]]
    for name in ("length", "offset", "null_count"):
        setattr(array, name, spec[name])
    rng = np.random.default_rng(spec["seed"])
    buffers = []
    for kind in spec["buffers"]:
        if kind == "null":
            buffers.append(None)
            continue
        data = rng.integers(0, 256, BUFFER_BYTES, dtype=np.uint8)
        if kind == "bits":
            data[:] = 0xFF  # all valid
        made.keep.append(data)
        buffers.append(data.ctypes.data)
    n = spec["n_buffers"]
    array.n_buffers = len(buffers) if n is None else min(n, len(buffers))
    if not spec["buffers_null"]:
        array.buffers = ctypes.cast(made.pointers(buffers), ctypes.POINTER(ctypes.c_void_p))
    n = spec["n_children"]
    array.n_children = len(children) if n is None else min(n, len(children))
    array.children = made.pointers([ctypes.addressof(child) for child in children])
    if spec["live"]:
        made.make_live(array)
    return array, buffers


class Pair:
    def __init__(self, schema, array):
        self.capsules = (
            new_capsule(ctypes.addressof(schema), b"arrow_schema", None),
            new_capsule(ctypes.addressof(array), b"arrow_array", None),
        )

    def __arrow_c_array__(self, requested_schema=None):
        return self.capsules


EXAMPLES = [0]
OUTCOMES: dict[str, int] = {}


def check(schema_spec, array_spec):
    EXAMPLES[0] += 1
    made = Made()
    schema = build_schema(schema_spec, made)
    array, buffers = build_array(array_spec, made)
    top = {ctypes.addressof(schema): schema_spec["live"], ctypes.addressof(array): None}
    top[ctypes.addressof(array)] = array_spec["live"]
    try:
        obj = asdlpack(Pair(schema, array))
    except (ValueError, TypeError, BufferError, MemoryError) as exc:
        obj, outcome = None, type(exc).__name__
    else:
        outcome = "read"
    OUTCOMES[outcome] = OUTCOMES.get(outcome, 0) + 1
    if obj is not None:
        length, offset = array_spec["length"], array_spec["offset"]  # the struct was moved
        # Rows of no elements (a fixed-size list of size 0) reach no memory, however many.
        if np.prod(obj.shape, dtype=object) > 0:
            assert 0 <= length < HUGE and 0 <= offset < HUGE, (length, offset)
        assert obj.shape[0] == length, (obj.shape, length)
        dtype = NUMBERS.get(schema_spec["format"] or "")
        if dtype is not None and not schema_spec["children"] and obj.copy_reason is None:
            itemsize = np.dtype(dtype).itemsize
            raw = np.zeros(0, np.uint8)  # a NULL values buffer, for no elements
            if buffers[1] is not None:
                raw = np.frombuffer(
                    (ctypes.c_uint8 * BUFFER_BYTES).from_address(buffers[1]), np.uint8
                )
            expected = raw[offset * itemsize : (offset + length) * itemsize].view(dtype)
            assert np.from_dlpack(obj).tobytes() == expected.tobytes()
        del obj
        gc.collect()
    for address, count in made.released.items():
        if address in top:
            assert count == 1, "a struct handed over was released more than once"
        else:
            assert count == 0, "a child struct was released by the consumer"
    for address, live in top.items():
        assert made.released.get(address, 0) == (1 if live else 0), "a struct was not released"


def main(examples: int) -> int:
    run = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )(given(pairs())(lambda pair: check(*pair)))
    # what the imports made out of the collector's sight: each example's collection walks only
    # what the examples made
    gc.collect()
    gc.freeze()
    run()
    seen = ", ".join(f"{n} {name}" for name, n in sorted(OUTCOMES.items()))
    print(f"fuzzed {EXAMPLES[0]} examples: {seen}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 300))
