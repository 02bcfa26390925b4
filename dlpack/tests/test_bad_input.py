"""Malformed input raises the documented exception class, and never crashes the interpreter."""

import re

import pytest

from dlpack import asdlpack

from ._bad_cases import ACCEPTED, CASES, run_accepted, run_case
from ._helpers import ArrayInterface, CudaArrayInterface, cuda_iface, need, run_python


def test_all_bad_inputs_in_subprocess():
    """Runs every case (three rounds) in a fresh interpreter: a crash shows as a signal."""
    proc = run_python("-c", "import sys, dlpack.tests._bad_cases as m; sys.exit(m.main())")
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "SUMMARY" in proc.stdout, proc.stdout + proc.stderr
    assert "Fatal" not in proc.stderr


def test_the_runner_fails_on_a_wrong_answer(monkeypatch, capsys):
    """main() exits 1 when a case raises another class than its own (here a subclass: classes
    are compared exactly), so a wrong answer in any round fails the subprocess test above."""
    from . import _bad_cases

    case = ("wants-exactly-exception", (object, None), Exception)
    monkeypatch.setattr(_bad_cases, "CASES", [case])
    monkeypatch.setattr(_bad_cases, "ACCEPTED", [])
    assert _bad_cases.main(rounds=1) == 1
    assert "WRONG wants-exactly-exception: TypeError" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fields, size",
    [
        ({"shape": (3,)}, 12),
        ({"shape": (2, 3), "strides": (16, 4)}, 28),
        ({"shape": (2, 3), "strides": (-16, 4), "offset": 16}, 28),
        ({"shape": (3,), "offset": 1}, 13),
    ],
)
def test_array_interface_over_a_buffer_that_fits_exactly(fields, size):
    """The last byte the layout reaches is the buffer's last: accepted, in place (one byte
    less is refused: the *-one-byte-short cases)."""
    np = need("numpy")
    data = bytearray(range(size))
    iface = {"typestr": "<i4", "data": data, "version": 3, **fields}
    out = np.from_dlpack(asdlpack(ArrayInterface(iface)))
    ref = np.ndarray(fields["shape"], "<i4", data, fields.get("offset", 0), fields.get("strides"))
    np.testing.assert_array_equal(out, ref)
    assert out.ctypes.data == ref.ctypes.data


def test_array_interface_without_data_names_the_missing_buffer():
    with pytest.raises(TypeError, match='has no "data", so the memory is the object'):
        asdlpack(ArrayInterface({"shape": (4,), "typestr": "<i4", "version": 3}))


@pytest.mark.parametrize("name, fac, exc_class", CASES, ids=[c[0] for c in CASES])
def test_bad_input(name, fac, exc_class):
    if fac[1] is not None:
        need(fac[1])
    status, detail = run_case(name, fac, exc_class)
    if status == "skip":
        pytest.skip(detail)
    assert status == "ok", f"expected {exc_class.__name__}, got {detail}"


@pytest.mark.parametrize("name, fac", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_accepted_odd_layout(name, fac):
    """Layouts DLPack can't express (non-native byte order, strides that are not whole
    elements) are accepted, with a copy_reason, and exported as a copy holding the right values."""
    if fac[1] is not None:
        need(fac[1])
    status, detail, obj = run_accepted(name, fac)
    if status == "skip":
        pytest.skip(detail)
    assert status == "ok", detail
    assert "needs_copy=True" in repr(obj)
    assert len(obj.byte_strides) == obj.ndim
    if "stride-not-multiple" in name:
        assert obj.strides is None
    else:
        assert obj.strides is not None
    if name.startswith("cai-"):
        return
    np = need("numpy")
    value = fac[0]()
    ref = np.asarray(value)  # numpy reads these layouts itself: the reference values
    out = np.from_dlpack(asdlpack(value))
    assert out.dtype == ref.dtype.newbyteorder("=")
    assert out.shape == ref.shape
    assert out.flags.writeable
    np.testing.assert_array_equal(out, ref)
    assert not np.shares_memory(out, ref)


@pytest.mark.parametrize("value", [object(), 5, None, "abc", [1, 2]])
def test_no_protocol_message(value):
    with pytest.raises(TypeError) as info:
        asdlpack(value)
    msg = str(info.value)
    for word in ("buffer", "__array_interface__", "__cuda_array_interface__", "__dlpack__"):
        assert word in msg, f"{word!r} not in {msg!r}"


def test_asdlpack_requires_an_argument():
    with pytest.raises(TypeError):
        asdlpack()


# ---------------------------------------------------------------------------
# boundary cases that must be accepted
# ---------------------------------------------------------------------------


def _ptr_buf(n=64):
    import ctypes

    b = (ctypes.c_char * n)()
    return b, ctypes.addressof(b)


def test_null_pointer_zero_size_ok():
    obj = asdlpack(
        ArrayInterface({"shape": (0, 3), "typestr": "<f4", "data": (0, False), "version": 3})
    )
    assert obj.shape == (0, 3)
    assert obj.nbytes == 0


def test_odd_stride_on_unit_extent_ok():
    buf, ptr = _ptr_buf()
    iface = {
        "shape": (1, 3),
        "typestr": "<i4",
        "data": (ptr, False),
        "strides": (6, 4),
        "version": 3,
    }
    obj = asdlpack(ArrayInterface(iface, owner=buf))
    assert obj.shape == (1, 3)
    assert obj.strides[1] == 1


def test_big_endian_one_byte_ok():
    buf, ptr = _ptr_buf()
    for typestr in (">u1", ">i1", "|u1"):
        iface = {"shape": (4,), "typestr": typestr, "data": (ptr, False), "version": 3}
        obj = asdlpack(ArrayInterface(iface, owner=buf))
        assert obj.itemsize == 1


def test_cai_mask_none_ok():
    obj = asdlpack(CudaArrayInterface(cuda_iface(mask=None)))
    assert obj.shape == (2, 3)


def test_cai_null_pointer_zero_size_ok():
    obj = asdlpack(CudaArrayInterface(cuda_iface(shape=(0,), ptr=0)))
    assert obj.shape == (0,)


def test_big_empty_shape_does_not_overflow():
    # product is 0, so no overflow although one extent is huge
    obj = asdlpack(
        ArrayInterface({"shape": (0, 2**40), "typestr": "<f8", "data": (0, False), "version": 3})
    )
    assert obj.shape == (0, 2**40)
    assert obj.nbytes == 0


def test_bad_dlpack_arguments_on_many_objects_do_not_crash():
    obj = asdlpack(bytearray(8))
    bad = [
        ({"stream": object()}, TypeError, "stream must be int, not object"),
        ({"dl_device": (2**40, 0)}, ValueError, "dl_device type 1099511627776"),
        ({"dl_device": ("a", "b")}, TypeError, "dl_device must be int, not str"),
        ({"stream": 2**70}, ValueError, "does not fit in 64 bits"),
    ]
    for kwargs, exc_class, message in bad:
        with pytest.raises(exc_class, match=re.escape(message)):
            obj.__dlpack__(**kwargs)
