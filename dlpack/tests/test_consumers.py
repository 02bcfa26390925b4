"""DLPackObject consumed by third-party libraries."""

import ctypes
import warnings

import pytest

from dlpack import asdlpack

from ._helpers import asks_for_legacy_capsule, need, np_data_ptr

np = need("numpy")


def _addr(buf) -> int:
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


def _sources():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    return {
        "contiguous": a,
        "strided": a[::2, 1::2],
        "fortran": np.asfortranarray(a),
        "0d": np.array(2.5, dtype=np.float64),
        "empty": np.zeros((0, 4), dtype=np.int32),
        "int64": np.arange(10, dtype=np.int64),
        "bool": np.array([True, False, True]),
        "complex": np.arange(4) * (1 + 2j),
    }


# ---------------------------------------------------------------------------
# numpy
# ---------------------------------------------------------------------------


class TestNumpy:
    @pytest.mark.parametrize("name", list(_sources()))
    def test_values(self, name):
        src = _sources()[name]
        out = np.from_dlpack(asdlpack(src))
        assert out.dtype == src.dtype
        np.testing.assert_array_equal(out, src)

    def test_shared_memory_both_ways(self):
        src = np.zeros((3, 3), dtype=np.int32)
        out = np.from_dlpack(asdlpack(src))
        assert np.shares_memory(out, src)
        out[1, 1] = 5
        assert src[1, 1] == 5
        src[2, 0] = 7
        assert out[2, 0] == 7

    def test_readonly_bytes(self):
        out = np.from_dlpack(asdlpack(b"\x01\x02\x03"))
        assert out.flags.writeable is False
        np.testing.assert_array_equal(out, [1, 2, 3])

    def test_copy_true(self):
        src = np.arange(6, dtype=np.int16)
        out = np.from_dlpack(asdlpack(src), copy=True)
        np.testing.assert_array_equal(out, src)
        assert not np.shares_memory(out, src)
        out[0] = 100
        assert src[0] == 0

    def test_copy_true_readonly_source_is_writable(self):
        src = b"\x05\x06\x07"
        out = np.from_dlpack(asdlpack(src), copy=True)
        assert out.flags.writeable
        out[0] = 1
        assert src == bytes([5, 6, 7])  # made apart from src's constant

    def test_copy_false(self):
        src = np.arange(6, dtype=np.int16)
        out = np.from_dlpack(asdlpack(src), copy=False)
        assert np.shares_memory(out, src)

    def test_device_cpu(self):
        src = np.arange(6, dtype=np.int16)
        out = np.from_dlpack(asdlpack(src), device="cpu")
        assert np.shares_memory(out, src)

    def test_consumed_twice(self):
        src = bytearray(4)
        obj = asdlpack(src)
        a = np.from_dlpack(obj)
        b = np.from_dlpack(obj)
        a[0] = 3
        assert b[0] == 3 and src[0] == 3


# ---------------------------------------------------------------------------
# torch
# ---------------------------------------------------------------------------


class TestTorch:
    @pytest.fixture(autouse=True)
    def _torch(self):
        self.torch = need("torch")

    @pytest.mark.parametrize("name", list(_sources()))
    def test_values(self, name):
        src = _sources()[name]
        t = self.torch.from_dlpack(asdlpack(src))
        assert tuple(t.shape) == src.shape
        np.testing.assert_array_equal(t.numpy(), src)
        if src.size > 1:
            assert t.data_ptr() == np_data_ptr(src)
            isz = src.dtype.itemsize
            for n, got, exp in zip(src.shape, t.stride(), src.strides, strict=True):
                if n > 1:
                    assert got * isz == exp

    def test_shared_memory_both_ways(self):
        src = bytearray(16)
        t = self.torch.from_dlpack(asdlpack(memoryview(src).cast("i")))
        assert t.dtype == self.torch.int32
        t[1] = 0x01020304
        assert src[4:8] == bytes([4, 3, 2, 1])
        src[0] = 9
        assert int(t[0]) == 9

    def test_readonly_source(self):
        src = b"\x01\x02\x03\x04"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = self.torch.from_dlpack(asdlpack(src))
        assert t.tolist() == [1, 2, 3, 4]

    def test_negative_strides_refused_by_torch(self):
        # torch has no negative strides; it refuses (DLPackObject must not crash)
        obj = asdlpack(np.arange(6.0)[::-1])
        with pytest.raises(RuntimeError):
            self.torch.from_dlpack(obj)

    def test_torch_tensor_reexported(self):
        torch = self.torch
        t = torch.arange(12, dtype=torch.float64).reshape(3, 4)
        obj = asdlpack(t)
        assert obj.shape == (3, 4)
        assert obj.strides == (4, 1)
        assert obj.dtype == "float64"
        assert obj.data_ptr == t.data_ptr()
        out = np.from_dlpack(obj)
        np.testing.assert_array_equal(out, t.numpy())
        out[0, 0] = 42
        assert float(t[0, 0]) == 42

    def test_torch_transposed_reexported(self):
        torch = self.torch
        t = torch.arange(12, dtype=torch.int32).reshape(3, 4).t()
        obj = asdlpack(t)
        assert obj.shape == (4, 3)
        assert obj.strides == (1, 4)
        np.testing.assert_array_equal(np.from_dlpack(obj), t.numpy())
        back = torch.from_dlpack(obj)
        assert back.stride() == t.stride()
        assert torch.equal(back, t)

    @pytest.mark.parametrize(
        "dtype, name",
        [
            ("bfloat16", "bfloat16"),
            ("float16", "float16"),
            ("bool", "bool"),
            ("complex64", "complex64"),
            ("uint8", "uint8"),
            ("int16", "int16"),
        ],
    )
    def test_torch_dtypes(self, dtype, name):
        torch = self.torch
        t = torch.arange(6).to(getattr(torch, dtype))
        obj = asdlpack(t)
        assert obj.dtype == name
        back = torch.from_dlpack(obj)
        assert back.dtype == t.dtype
        assert torch.equal(back, t)
        assert back.data_ptr() == t.data_ptr()

    @pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
    def test_torch_float8(self, name):
        torch = self.torch
        if not hasattr(torch, name):
            pytest.skip(f"torch has no {name}")
        t = torch.tensor([0.5, 1.0, -2.0]).to(getattr(torch, name))
        obj = asdlpack(t)
        assert obj.dtype == name
        back = torch.from_dlpack(obj)
        assert back.dtype == t.dtype
        assert torch.equal(back.float(), t.float())

    def test_torch_roundtrip_lifetime(self):
        torch = self.torch
        t = torch.from_dlpack(asdlpack(bytearray(b"\x07" * 8)))
        import gc

        gc.collect()
        assert t.tolist() == [7] * 8


# ---------------------------------------------------------------------------
# jax
# ---------------------------------------------------------------------------


class TestJax:
    @pytest.fixture(autouse=True)
    def _jax(self):
        jnp = need("jax.numpy", "jax")

        self.jnp = jnp

    @pytest.mark.parametrize("name", ["contiguous", "fortran", "0d", "empty", "int64", "bool"])
    def test_values(self, name):
        src = _sources()[name]
        out = self.jnp.from_dlpack(asdlpack(src))
        assert out.shape == src.shape
        np.testing.assert_array_equal(np.asarray(out), src)

    def test_unaligned_bytes(self):
        src = bytearray(range(17))
        out = self.jnp.from_dlpack(asdlpack(memoryview(src)[1:]))
        np.testing.assert_array_equal(np.asarray(out), np.arange(1, 17))

    def test_readonly_source(self):
        # read-only memory asked for in a legacy capsule (as jax does) comes as a copy
        src = b"\x01\x02\x03\x04"
        obj = asdlpack(src)
        out = self.jnp.from_dlpack(obj)
        np.testing.assert_array_equal(np.asarray(out), [1, 2, 3, 4])
        if asks_for_legacy_capsule(self.jnp.from_dlpack, src):
            assert out.unsafe_buffer_pointer() != obj.data_ptr

    def test_negative_strides_refused_by_jax(self):
        jax = need("jax")

        obj = asdlpack(np.arange(6.0, dtype=np.float32)[::-1])
        with pytest.raises((jax.errors.JaxRuntimeError, RuntimeError, ValueError)):
            self.jnp.from_dlpack(obj)

    def test_jax_array_reexported(self):
        j = self.jnp.arange(10, dtype=self.jnp.float32).reshape(2, 5)
        obj = asdlpack(j)
        assert obj.shape == (2, 5)
        assert obj.dtype == "float32"
        assert obj.strides == (5, 1)
        np.testing.assert_array_equal(np.from_dlpack(obj), np.asarray(j))


# ---------------------------------------------------------------------------
# array_api_strict
# ---------------------------------------------------------------------------


class TestArrayApiStrict:
    @pytest.fixture(autouse=True)
    def _xp(self):
        self.xp = need("array_api_strict")

    @pytest.mark.parametrize("name", list(_sources()))
    def test_values(self, name):
        src = _sources()[name]
        x = self.xp.from_dlpack(asdlpack(src))
        assert tuple(x.shape) == src.shape
        np.testing.assert_array_equal(np.asarray(x), src)

    def test_bytes(self):
        x = self.xp.from_dlpack(asdlpack(b"\x09\x08"))
        assert x.dtype == self.xp.uint8
        np.testing.assert_array_equal(np.asarray(x), [9, 8])


# ---------------------------------------------------------------------------
# tvm_ffi
# ---------------------------------------------------------------------------


class TestTvmFfi:
    @pytest.fixture(autouse=True)
    def _tvm(self):
        self.tvm_ffi = need("tvm_ffi")

    @pytest.mark.parametrize("name", ["contiguous", "strided", "0d", "empty", "int64", "bool"])
    def test_values(self, name):
        src = _sources()[name]
        t = self.tvm_ffi.from_dlpack(asdlpack(src))
        assert tuple(t.shape) == src.shape
        np.testing.assert_array_equal(np.from_dlpack(t), src)
        if src.size > 1:
            assert t.data_ptr() == np_data_ptr(src)

    def test_shared_memory(self):
        src = bytearray(8)
        t = self.tvm_ffi.from_dlpack(asdlpack(memoryview(src).cast("f")))
        assert str(t.dtype) == "float32"
        back = np.from_dlpack(t)
        back[1] = 1.0
        assert np.frombuffer(src, dtype=np.float32)[1] == 1.0

    def test_readonly_source(self):
        # tvm_ffi takes its tensors through the C exchange API, which can't say read-only (and
        # tvm_ffi writes through them anyway): a read-only source comes as a copy
        obj = asdlpack(b"\x01\x02")
        t = self.tvm_ffi.from_dlpack(obj)
        assert t.data_ptr() != obj.data_ptr
        np.testing.assert_array_equal(np.from_dlpack(t), [1, 2])


# ---------------------------------------------------------------------------
# pyarrow as a producer
# ---------------------------------------------------------------------------


def test_pyarrow_array():
    pa = need("pyarrow")
    arr = pa.array([1, 2, 3], type=pa.int64())
    obj = asdlpack(arr)
    assert obj.shape == (3,)
    assert obj.dtype == "int64"
    np.testing.assert_array_equal(np.from_dlpack(obj), [1, 2, 3])


def test_pyarrow_float_slice():
    pa = need("pyarrow")
    arr = pa.array([1.5, 2.5, 3.5, 4.5], type=pa.float32()).slice(1, 2)
    obj = asdlpack(arr)
    assert obj.shape == (2,)
    assert obj.dtype == "float32"
    np.testing.assert_array_equal(np.from_dlpack(obj), [2.5, 3.5])
