"""dlpack.interop against real torch and JAX: pytree conversions, copies, dtypes and devices."""

from __future__ import annotations

import collections
import dataclasses
import importlib
import types
import warnings

import pytest

from dlpack import asdlpack
from dlpack.interop import (
    DtypeNarrowingWarning,
    is_array,
    module_to_jax,
    to_jax,
    to_numpy,
    to_torch,
    torch_callable,
)

from ._helpers import NUMPY_NATIVE_DTYPES, need, run_python
from ._interop_helpers import (
    Pair,
    aligned_numpy,
    assert_same_values,
    jax,
    jax_ptr,
    jnp,
    needs_cuda,
    np,
    torch,
)

# ---------------------------------------------------------------------------------------------
# Containers keep their types; leaves are classified as documented
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Inner:
    weight: object
    note: str = "kept"


@dataclasses.dataclass(frozen=True, slots=True)
class Outer:
    inner: Inner
    bias: object
    steps: int = 3


class TestContainers:
    def test_tuples_of_one_and_two_arrays_stay_tuples_of_arrays(self):
        t1, t2 = torch.arange(3.0), torch.arange(4.0)
        one = to_jax((t1,))
        assert type(one) is tuple and len(one) == 1 and one[0].shape == (3,)
        two = to_torch(to_jax((t1, t2)))
        assert type(two) is tuple and [t.shape for t in two] == [(3,), (4,)]

    def test_dict_keeps_key_types_and_order(self):
        tree = {2: torch.ones(1), "b": torch.zeros(2), (1, "x"): torch.ones(3), 0.5: None}
        out = to_jax(tree)
        assert list(out) == list(tree)
        assert all(isinstance(out[k], jax.Array) for k in list(tree)[:3]) and out[0.5] is None

    def test_namedtuple_stays_that_namedtuple(self):
        out = to_jax(Pair(torch.ones(2), 7))
        assert type(out) is Pair and isinstance(out.first, jax.Array) and out.second == 7

    def test_nested_dataclasses_become_new_instances_of_their_classes(self):
        weight = torch.arange(6.0).reshape(2, 3)
        tree = Outer(Inner(weight), torch.ones(3))
        out = to_jax(tree)
        assert type(out) is Outer and type(out.inner) is Inner
        assert out is not tree and out.inner is not tree.inner
        assert out.inner.note == "kept" and out.steps == 3
        assert jax_ptr(out.inner.weight) == weight.data_ptr()  # converted in place, not copied
        assert isinstance(tree.inner.weight, torch.Tensor)  # the original is untouched

    def test_dataclass_post_init_is_not_run_again(self):
        calls = []

        @dataclasses.dataclass
        class Logged:
            x: object

            def __post_init__(self):
                calls.append(1)

        to_jax(Logged(torch.ones(1)))
        assert calls == [1]

    def test_dict_subclasses(self):
        ordered = collections.OrderedDict([("z", torch.ones(1)), ("a", torch.zeros(1))])
        out = to_jax(ordered)
        assert type(out) is collections.OrderedDict and list(out) == ["z", "a"]
        default = collections.defaultdict(list, {"z": torch.ones(1), "a": torch.ones(2)})
        out = to_jax(default)
        assert type(out) is collections.defaultdict and out.default_factory is list
        assert list(out) == ["z", "a"] and isinstance(out["a"], jax.Array)

    def test_non_array_leaves_are_kept(self):
        size = torch.Size([2, 3])
        tree = [None, 1, 2.5, 3j, True, "s", b"b", bytearray(b"x"), size, torch.float32]
        out = to_jax(tree)
        assert type(out) is list and all(a is b for a, b in zip(out, tree, strict=True))
        assert to_torch(size) is size

    def test_numpy_scalars_are_arrays(self):
        out = to_torch({"lr": np.float32(0.5)})
        assert isinstance(out["lr"], torch.Tensor) and out["lr"].shape == ()
        assert to_numpy(np.float32(0.5)).dtype == np.float32

    def test_jax_registered_nodes(self):
        @jax.tree_util.register_pytree_node_class
        class Box:
            def __init__(self, content, label):
                self.content, self.label = content, label

            def tree_flatten(self):
                return (self.content,), self.label

            @classmethod
            def tree_unflatten(cls, label, children):
                return cls(children[0], label)

        out = to_torch(Box(jnp.ones(2), "L"))
        assert type(out) is Box and isinstance(out.content, torch.Tensor) and out.label == "L"

    def test_sequence_and_mapping_subclasses(self):
        class Tagged(list):
            tag = "t"

        out = to_jax(Tagged([torch.ones(1)]))
        assert type(out) is Tagged and isinstance(out[0], jax.Array)
        proxy = types.MappingProxyType({"a": torch.ones(1)})
        out = to_jax(proxy)
        assert type(out) is types.MappingProxyType and isinstance(out["a"], jax.Array)

    def test_unrebuildable_container_raises(self):
        class Frozen(tuple):
            def __new__(cls, a, b):
                return super().__new__(cls, (a, b))

        with pytest.raises(TypeError, match="can't rebuild"):
            to_jax(Frozen(torch.ones(1), 2))
        unchanged = Frozen(1, 2)
        assert to_jax(unchanged) is unchanged  # no arrays: nothing to rebuild

    def test_is_array(self):
        arrays = [torch.ones(1), jnp.ones(1), np.ones(1), np.float32(1), asdlpack(b"ab")]
        kept = [b"ab", bytearray(2), memoryview(b"a"), 1.0, "s", None, torch.Size([1]), [1]]
        assert all(is_array(a) for a in arrays)
        assert not any(is_array(k) for k in kept)

    def test_round_trip_of_a_mixed_tree(self, x64):
        tree = {"w": [torch.randn(3, 2), (torch.arange(4), Pair(torch.ones(()), "s"))]}
        back = to_torch(to_jax(tree))
        assert back["w"][1][1].second == "s"
        for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(back), strict=True):
            if isinstance(a, torch.Tensor):
                assert torch.equal(a, b) and a.dtype == b.dtype


# ---------------------------------------------------------------------------------------------
# Zero-copy where the consumer can take the memory, exactly one copy where it can't
# ---------------------------------------------------------------------------------------------


class TestToJaxCopies:
    def test_contiguous_and_transposed_tensors_are_shared(self):
        t = torch.arange(12.0).reshape(3, 4)
        assert jax_ptr(to_jax(t)) == t.data_ptr()
        transposed = to_jax(t.T)
        assert jax_ptr(transposed) == t.data_ptr()
        assert_same_values(transposed, t.T)

    @pytest.mark.parametrize(
        "make",
        [
            lambda t: t[:, ::2],  # gaps
            lambda t: t[:1].expand(5, 4),  # stride 0
            lambda t: t.reshape(-1)[1:],  # 4 bytes past an aligned start
            lambda t: t.reshape(-1)[3:7],
        ],
        ids=["slice", "broadcast", "unaligned", "unaligned-slice"],
    )
    def test_layouts_xla_cannot_read_are_copied_once(self, make):
        base = torch.arange(48.0).reshape(12, 4)
        source = make(base)
        out = to_jax(source)
        assert_same_values(out, source)
        assert jax_ptr(out) != source.data_ptr()
        with pytest.raises(BufferError, match="copy=False"):
            to_jax(source, copy=False)

    def test_negative_strides(self):
        source = np.arange(10.0, dtype=np.float32)[::-1]
        np.testing.assert_array_equal(np.asarray(to_jax(source)), source)

    def test_non_native_byte_order(self):
        source = np.arange(6, dtype=">i4" if np.little_endian else "<i4")
        np.testing.assert_array_equal(np.asarray(to_jax(source)), source)
        assert to_torch(source).tolist() == source.tolist()
        with pytest.raises(BufferError):
            to_jax(source, copy=False)

    def test_conjugate_and_negative_bits_are_materialised(self):
        z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
        np.testing.assert_array_equal(np.asarray(to_jax(z.conj())), z.conj().resolve_conj())
        negative = z.conj().imag
        assert negative.is_neg()
        np.testing.assert_array_equal(np.asarray(to_jax(negative)), [-2.0, 1.0])
        with pytest.raises(BufferError, match="conjugate or negative"):
            to_jax(z.conj(), copy=False)

    def test_tensors_requiring_grad_are_detached_in_place(self):
        t = torch.ones(16, requires_grad=True)
        assert jax_ptr(to_jax(t)) == t.data_ptr()

    def test_copy_true_always_copies(self):
        t = torch.ones(16)
        out = to_jax(t, copy=True)
        assert jax_ptr(out) != t.data_ptr()
        t.add_(1)
        assert float(out[0]) == 1.0

    def test_shared_memory_shows_later_writes(self):
        t = torch.zeros(16)
        out = to_jax(t)
        t.add_(2)
        assert float(out[3]) == 2.0

    def test_readonly_host_memory_is_copied(self):
        source = aligned_numpy(np.arange(16, dtype=np.float32))
        source.flags.writeable = False
        out = to_jax(source)
        np.testing.assert_array_equal(np.asarray(out), source)
        assert jax_ptr(out) != source.ctypes.data
        with pytest.raises(BufferError, match="read-only"):
            to_jax(source, copy=False)

    def test_aligned_writable_numpy_is_shared(self):
        source = aligned_numpy(np.arange(16, dtype=np.float32))
        assert jax_ptr(to_jax(source)) == source.ctypes.data

    def test_jax_arrays_stay_themselves(self):
        a = jnp.ones(4)
        assert to_jax(a) is a
        copied = to_jax(a, copy=True)
        assert copied is not a and jax_ptr(copied) != jax_ptr(a)


class TestToTorchCopies:
    def test_jax_arrays_are_copied_unless_shared(self):
        a = jnp.arange(16.0)
        copied = to_torch(a)
        assert copied.data_ptr() != jax_ptr(a)
        copied.add_(1)  # writing the copy leaves the immutable JAX array alone
        assert float(a[0]) == 0.0
        shared = to_torch(a, share_readonly=True)
        assert shared.data_ptr() == jax_ptr(a)
        with pytest.raises(BufferError, match="share_readonly"):
            to_torch(a, copy=False)
        assert to_torch(a, copy=False, share_readonly=True).data_ptr() == jax_ptr(a)

    def test_readonly_sources_are_copied_unless_shared(self):
        readonly = np.arange(8, dtype=np.int32)
        readonly.flags.writeable = False
        assert to_torch(readonly).data_ptr() != readonly.ctypes.data
        assert to_torch(readonly, share_readonly=True).data_ptr() == readonly.ctypes.data
        from_bytes = to_torch(asdlpack(b"\x01\x02"))
        assert from_bytes.tolist() == [1, 2] and from_bytes.dtype == torch.uint8

    def test_writable_numpy_is_shared(self):
        source = np.arange(8.0)
        out = to_torch(source)
        assert out.data_ptr() == source.ctypes.data
        out[0] = 5
        assert source[0] == 5

    def test_negative_strides_are_copied(self):
        source = np.arange(10)[::-2]
        out = to_torch(source)
        assert out.tolist() == source.tolist()
        with pytest.raises(BufferError, match="negative strides"):
            to_torch(source, copy=False)

    def test_broadcast_numpy_is_shared_with_stride_zero(self):
        source = np.broadcast_to(np.arange(3.0), (4, 3))
        out = to_torch(source, share_readonly=True)  # numpy marks broadcasts read-only
        assert out.stride() == (0, 1) and out.data_ptr() == source.ctypes.data

    def test_torch_tensors_stay_themselves(self):
        t = torch.ones(3, requires_grad=True)
        assert to_torch(t) is t and to_torch(t, device="cpu") is t
        copied = to_torch(t, copy=True)
        assert copied is not t and copied.data_ptr() != t.data_ptr()
        assert copied.requires_grad  # a torch operation, kept in the graph


class TestToNumpy:
    def test_jax_arrays_come_back_read_only_in_place(self):
        a = jnp.arange(16.0)
        out = to_numpy(a)
        assert out.ctypes.data == jax_ptr(a) and not out.flags.writeable
        assert to_numpy(a, copy=True).flags.writeable

    def test_torch_tensors_come_back_writable_in_place(self):
        t = torch.arange(6.0).reshape(2, 3).T
        out = to_numpy(t)
        assert out.ctypes.data == t.data_ptr() and out.flags.writeable
        np.testing.assert_array_equal(out, t.numpy())

    @pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
    def test_ml_dtypes(self, dtype):
        ml_dtypes = need("ml_dtypes")
        t = torch.arange(-3, 5, dtype=torch.float32).to(getattr(torch, dtype))[::2]
        out = to_numpy(t)
        assert out.dtype == getattr(ml_dtypes, dtype) and out.ctypes.data == t.data_ptr()
        np.testing.assert_array_equal(out.astype(np.float32), t.float().numpy())

    def test_numpy_stays_itself_and_cuda_is_refused(self):
        a = np.ones(3)
        assert to_numpy(a) is a and to_numpy(a, copy=True) is not a
        with pytest.raises(ValueError, match="CPU"):
            to_numpy(a, device="cuda")


class TestJaxInternals:
    def test_results_still_being_computed_are_waited_for(self):
        x = jnp.ones((600, 600))
        product = jax.jit(lambda x: (x @ x) @ x)
        product(x).block_until_ready()  # compiled: the calls below only dispatch
        for share in (True, False):
            assert bool((to_torch(product(x), share_readonly=share) == 600.0**2).all())
        assert bool((to_numpy(product(x)) == 600.0**2).all())

    def test_public_api_when_jaxlib_entry_points_are_unavailable(self, monkeypatch):
        jaxlib = importlib.import_module("dlpack.interop._jax")._Jaxlib
        monkeypatch.setattr(jaxlib, "checked", True)
        monkeypatch.setattr(jaxlib, "import_capsule", None)
        monkeypatch.setattr(jaxlib, "export_capsule", None)
        t = torch.arange(16.0)
        a = to_jax(t)
        assert jax_ptr(a) == t.data_ptr()
        assert to_torch(a, share_readonly=True).data_ptr() == t.data_ptr()
        assert_same_values(to_jax(t[::2]), t[::2])


# ---------------------------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------------------------

# numpy's own types, and those of ml_dtypes that torch has too
DTYPES = [
    *NUMPY_NATIVE_DTYPES,
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
]


def _tensor_of(dtype: str):
    values = torch.arange(1, 9, dtype=torch.float32).reshape(2, 4)
    if dtype == "bool":
        return values > 4
    if dtype.startswith("complex"):
        return (values + 1j * values).to(getattr(torch, dtype))
    return values.to(getattr(torch, dtype))


def _bits(tensor):
    """The raw bytes of a tensor, to compare values of types torch can't compare (float8)."""
    return tensor.contiguous().view(-1).view(torch.uint8).tolist()


class TestDtypes:
    @pytest.mark.parametrize("dtype", DTYPES)
    def test_torch_jax_torch(self, dtype, x64):
        if not hasattr(torch, dtype) or not hasattr(jnp, dtype):
            pytest.skip(f"{dtype} missing in torch or JAX")
        source = _tensor_of(dtype)
        a = to_jax(source)
        assert a.dtype == jnp.dtype(dtype) and jax_ptr(a) == source.data_ptr()
        back = to_torch(a)
        assert back.dtype == source.dtype and _bits(back) == _bits(source)

    @pytest.mark.parametrize(
        ("wide", "narrow"),
        [
            ("float64", "float32"),
            ("int64", "int32"),
            ("uint64", "uint32"),
            ("complex128", "complex64"),
        ],
    )
    def test_64_bit_types_without_x64_warn_and_narrow(self, wide, narrow):
        source = _tensor_of(wide)
        # Narrowing happens only with x64 off: set here, so that it is tested in either mode.
        with jax.enable_x64(False):
            with pytest.warns(DtypeNarrowingWarning, match=f"{wide} became {narrow}") as record:
                out = to_jax({"x": source})["x"]
            assert record[0].filename == __file__  # points at the caller
            assert out.dtype == jnp.dtype(narrow)
            np.testing.assert_array_equal(np.asarray(out), source.numpy().astype(narrow))
            with pytest.raises(BufferError, match="jax_enable_x64"):
                to_jax(source, copy=False)

    @pytest.mark.parametrize("wide", ["float64", "int64", "uint64", "complex128"])
    def test_64_bit_types_with_x64_stay_in_place(self, wide, x64):
        source = _tensor_of(wide)
        with warnings.catch_warnings():
            warnings.simplefilter("error", DtypeNarrowingWarning)
            out = to_jax(source, copy=False)
        assert out.dtype == jnp.dtype(wide) and jax_ptr(out) == source.data_ptr()

    @pytest.mark.parametrize("wide", ["float64", "int64", "complex128"])
    def test_64_bit_copies_with_x64_stay_64_bit(self, wide, x64):
        # Sources JAX can't take in place (strided, read-only through numpy) are copied: the
        # copy keeps the type when JAX holds 64-bit types.
        strided = _tensor_of(wide)[:, ::2]
        read_only = to_numpy(_tensor_of(wide)).copy()
        read_only.flags.writeable = False
        for source, expected in ((strided, strided.numpy()), (read_only, read_only)):
            with warnings.catch_warnings():
                warnings.simplefilter("error", DtypeNarrowingWarning)
                out = to_jax(source)
            assert out.dtype == jnp.dtype(wide)
            np.testing.assert_array_equal(np.asarray(out), expected)

    def test_types_torch_lacks(self):
        if not hasattr(jnp, "float8_e3m4"):
            pytest.skip("this JAX has no float8_e3m4")
        with pytest.raises(BufferError, match="torch has no float8_e3m4"):
            to_torch(jnp.zeros(2, dtype=jnp.float8_e3m4))


# ---------------------------------------------------------------------------------------------
# Devices and arguments
# ---------------------------------------------------------------------------------------------


class TestDevices:
    @pytest.mark.parametrize(
        "device",
        ["cpu", "CPU:0", torch.device("cpu"), (1, 0), "jax-cpu"],
    )
    def test_cpu_spellings(self, device):
        if device == "jax-cpu":
            device = jax.devices("cpu")[0]
        t = torch.ones(4)
        assert to_torch(jnp.ones(2), device=device).device.type == "cpu"
        assert jax_ptr(to_jax(t, device=device)) == t.data_ptr()
        assert to_numpy(t, device=device).ctypes.data == t.data_ptr()

    def test_bad_device_arguments(self):
        with pytest.raises(TypeError, match="device must be"):
            to_jax(torch.ones(1), device=0)
        with pytest.raises(ValueError, match="expected 'cpu'"):
            to_torch(np.ones(1), device="tpu")
        with pytest.raises(ValueError, match="number"):
            to_torch(np.ones(1), device="cuda:x")

    def test_bad_flags(self):
        with pytest.raises(TypeError, match="copy must be"):
            to_jax(torch.ones(1), copy="yes")
        with pytest.raises(TypeError, match="share_readonly"):
            to_torch(jnp.ones(1), share_readonly=1)

    @pytest.mark.parametrize(
        ("device", "name"),
        [
            (torch.device("cuda", 1), "cuda:1"),
            ("gpu:1", "cuda:1"),
            ((2, 3), "cuda:3"),
            ((13, 0), "DLPack device (13, 0)"),
        ],
    )
    def test_a_refused_move_names_the_device_asked_for(self, device, name):
        # a move is a copy, which copy=False refuses before any device is reached
        said = f"this array needs a copy (a move from cpu to {name}), and copy=False forbids it"
        with pytest.raises(BufferError) as refused:
            to_torch(np.ones(2, dtype=np.float32), device=device, copy=False)
        assert str(refused.value) == said

    def test_a_bare_cuda_is_read_where_torch_was_never_imported(self):
        """'cuda' without an index is torch's current device only where torch is imported: in a
        process that never imported it, the device is read all the same (CUDA device 0) and
        to_numpy refuses it by name."""
        code = (
            "import sys\n"
            "import numpy as np\n"
            "from dlpack import interop\n"
            "try:\n"
            "    interop.to_numpy(np.ones(2), device='cuda')\n"
            "except ValueError as exc:\n"
            "    print(exc)\n"
            "print('torch' in sys.modules)\n"
        )
        done = run_python("-c", code)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            "numpy arrays live on the CPU; device='cuda' can't be served",
            "False",
        ]

    @pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
    def test_cuda_request_without_gpu_raises_clearly(self):
        with pytest.raises((BufferError, RuntimeError)):
            to_torch(np.ones(2), device="cuda:0")

    @needs_cuda
    def test_moves_between_cpu_and_cuda(self):
        host = torch.arange(12.0).reshape(3, 4)
        on_gpu = to_torch(host.T, device="cuda")
        assert on_gpu.is_cuda and torch.equal(on_gpu.cpu(), host.T)
        a = to_jax(host[:, ::2], device="cuda:0")
        assert next(iter(a.devices())).platform == "gpu"
        np.testing.assert_array_equal(np.asarray(a), host[:, ::2].numpy())
        back = to_jax(on_gpu, device="cpu")
        np.testing.assert_array_equal(np.asarray(back), host.T.numpy())
        np.testing.assert_array_equal(to_numpy(on_gpu), host.T.numpy())
        with pytest.raises(BufferError, match="copy=False"):
            to_torch(host, device="cuda", copy=False)

    @needs_cuda
    def test_cuda_tensors_reach_jax_in_place(self):
        t = torch.arange(64.0, device="cuda")
        a = to_jax(t)
        assert jax_ptr(a) == t.data_ptr()
        assert to_torch(a, share_readonly=True).data_ptr() == t.data_ptr()


@needs_cuda
class TestWrappersOnCuda:
    def test_torch_callable_on_cuda_tensors(self):
        f = torch_callable(lambda x: jnp.sin(x) * 2)
        x = torch.randn(4, 3, device="cuda", requires_grad=True)
        out = f(x)
        assert out.is_cuda
        out.sum().backward()
        torch.testing.assert_close(x.grad, 2 * torch.cos(x.detach()))

    def test_module_to_jax_on_cuda(self):
        module = torch.nn.Linear(3, 2).cuda()
        apply, state = module_to_jax(module)
        x = np.ones((4, 3), dtype=np.float32)
        expected = module(torch.ones(4, 3, device="cuda")).detach().cpu().numpy()
        np.testing.assert_allclose(jax.jit(apply)(state, x), expected, rtol=1e-5)
        grads = jax.jit(jax.grad(lambda s: apply(s, x).sum()))(state)
        np.testing.assert_allclose(grads["bias"], [4.0, 4.0])


class TestTracers:
    def test_converting_a_tracer_explains_pure_callback(self):
        with pytest.raises(TypeError, match="pure_callback"):
            jax.jit(lambda x: to_torch(x))(jnp.ones(2))
        with pytest.raises(TypeError, match="jax_callable"):
            jax.grad(lambda x: to_numpy(x).sum())(1.0)

    def test_to_jax_keeps_tracers(self):
        assert jax.jit(lambda x: to_jax({"x": x})["x"] * 2)(jnp.ones(2)).tolist() == [2.0, 2.0]
