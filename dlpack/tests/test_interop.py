"""dlpack.interop against real torch and JAX: pytree conversions, copies, dtypes, devices, and the
function and module wrappers with gradients checked against each framework's own autodiff."""

from __future__ import annotations

import collections
import copy
import dataclasses
import importlib
import pickle
import types
import warnings

import pytest

from dlpack import asdlpack, interop
from dlpack.interop import (
    DtypeNarrowingWarning,
    is_array,
    jax_callable,
    module_to_jax,
    to_jax,
    to_numpy,
    to_torch,
    torch_callable,
)

from ._helpers import need

np = need("numpy")
torch = need("torch")
jax = need("jax")
jnp = jax.numpy
check_grads = importlib.import_module("jax.test_util").check_grads

HAS_CUDA = torch.cuda.is_available() and any(d.platform == "gpu" for d in jax.devices())
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device in torch and JAX")


@pytest.fixture
def x64():
    """Run a test with JAX's 64-bit types enabled."""
    with jax.enable_x64(True):
        yield


def jax_ptr(array) -> int:
    return array.unsafe_buffer_pointer()


def aligned_numpy(values, alignment: int = 64):
    """A writable numpy copy of ``values`` whose data starts at an ``alignment`` boundary."""
    values = np.asarray(values)
    raw = np.empty(values.nbytes + alignment, dtype=np.uint8)
    start = -raw.ctypes.data % alignment
    out = raw[start : start + values.nbytes].view(values.dtype).reshape(values.shape)
    out[...] = values
    return out


def assert_same_values(a, b):
    np.testing.assert_array_equal(to_numpy(a), to_numpy(b))


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


Pair = collections.namedtuple("Pair", "first second")


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

DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
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
        assert not jax.config.jax_enable_x64
        source = _tensor_of(wide)
        with pytest.warns(DtypeNarrowingWarning, match=f"{wide} became {narrow}") as record:
            out = to_jax({"x": source})["x"]
        assert record[0].filename == __file__  # points at the caller
        assert out.dtype == jnp.dtype(narrow)
        np.testing.assert_array_equal(np.asarray(out), source.numpy().astype(narrow))
        with pytest.raises(BufferError, match="jax_enable_x64"):
            to_jax(source, copy=False)

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


# ---------------------------------------------------------------------------------------------
# JAX functions from torch, torch autograd through jax.vjp
# ---------------------------------------------------------------------------------------------


class TestTorchCallable:
    def test_pytree_args_kwargs_and_outputs(self):
        @torch_callable
        def f(x, params, *, scale, label):
            assert label == "static"  # non-array leaves arrive as they are
            return {"y": jnp.sin(x) * params["w"] * scale, "count": params["n"] + 1}, label

        x = torch.randn(4, 3, requires_grad=True)
        w = torch.randn(3, requires_grad=True)
        n = torch.arange(3, dtype=torch.int32)
        out, label = f(x, {"w": w, "n": n}, scale=torch.tensor(2.0), label="static")
        assert label == "static" and out["count"].tolist() == [1, 2, 3]
        assert not out["count"].requires_grad
        out["y"].sum().backward()
        torch.testing.assert_close(x.grad, 2 * torch.cos(x) * w)
        torch.testing.assert_close(w.grad, 2 * torch.sin(x).sum(0))

    def test_integer_inputs_get_no_gradient(self):
        f = torch_callable(lambda x, idx: x[idx].sum())
        x = torch.randn(5, requires_grad=True)
        f(x, torch.tensor([0, 0, 3], dtype=torch.int32)).backward()
        assert x.grad.tolist() == pytest.approx([2.0, 0, 0, 1.0, 0])

    def test_gradcheck_float64(self, x64):
        f = torch_callable(lambda a, b: (jnp.tanh(a) @ b, jnp.exp(b).sum()))
        a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
        b = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(f, (a, b))

    def test_gradcheck_complex(self, x64):
        f = torch_callable(lambda z, r: jnp.sin(z) * jnp.conj(z) * r)
        z = torch.randn(3, dtype=torch.complex128, requires_grad=True)
        r = torch.randn(3, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(f, (z, r))

    def test_gradients_match_jax_grad(self):
        def loss(w, x):
            return jnp.sum(jnp.tanh(x @ w) ** 2)

        w, x = np.random.default_rng(0).standard_normal((2, 3, 3)).astype(np.float32)
        tw = torch.tensor(w, requires_grad=True)
        torch_callable(loss)(tw, torch.tensor(x)).backward()
        np.testing.assert_allclose(tw.grad.numpy(), jax.grad(loss)(w, x), rtol=1e-5)

    @pytest.mark.parametrize(
        "grad_output",
        [
            lambda: torch.ones(1).expand(3, 4),  # stride 0, as .sum() gives
            lambda: torch.arange(24.0).reshape(3, 8)[:, ::2],  # gaps
            lambda: torch.arange(12.0).reshape(4, 3).T,  # transposed
        ],
        ids=["stride0", "slice", "transposed"],
    )
    def test_any_gradient_layout(self, grad_output):
        f = torch_callable(lambda x: x * 3.0)
        x = torch.randn(3, 4, requires_grad=True)
        g = grad_output()
        f(x).backward(g)
        torch.testing.assert_close(x.grad, 3.0 * g)

    def test_has_aux(self):
        f = torch_callable(lambda x: (jnp.sum(x**2), {"mean": jnp.mean(x)}), has_aux=True)
        x = torch.arange(4.0, requires_grad=True)
        loss, aux = f(x)
        assert float(aux["mean"]) == 1.5 and not aux["mean"].requires_grad
        loss.backward()
        torch.testing.assert_close(x.grad, 2 * x.detach())

    def test_without_gradients_runs_plainly(self):
        f = torch_callable(lambda x: x + 1)
        with torch.no_grad():
            out = f(torch.ones(2, requires_grad=True))
        assert not out.requires_grad and out.tolist() == [2.0, 2.0]

    def test_outputs_are_copies_unless_shared(self):
        constant = jnp.arange(4.0)
        f = torch_callable(lambda x: constant)
        out = f(torch.ones(1))
        out.add_(10)  # must not reach JAX's immutable array
        assert constant.tolist() == [0.0, 1.0, 2.0, 3.0]
        shared = torch_callable(lambda x: constant, share_outputs=True)(torch.ones(1))
        assert shared.data_ptr() == jax_ptr(constant)

    def test_in_place_write_to_an_input_before_backward_raises(self):
        f = torch_callable(lambda x: jnp.sin(x))
        x = torch.randn(3, requires_grad=True)
        y = x * 1.0
        out = f(y)
        y.add_(1)  # JAX's residual is a view of y
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()

    def test_differentiating_twice_raises(self):
        f = torch_callable(lambda x: x**3)
        x = torch.randn(2, requires_grad=True)
        (g,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
        with pytest.raises(RuntimeError):
            g.sum().backward()

    def test_float64_without_x64_keeps_the_input_dtype_for_gradients(self):
        f = torch_callable(lambda x: x * 2)
        x = torch.ones(3, dtype=torch.float64, requires_grad=True)
        with pytest.warns(DtypeNarrowingWarning):
            out = f(x)
        assert out.dtype == torch.float32
        out.sum().backward()
        assert x.grad.dtype == torch.float64 and x.grad.tolist() == [2.0, 2.0, 2.0]


class TestJaxModule:
    @staticmethod
    def linear(params, x):
        return x @ params["w"] + params["b"]

    def params(self):
        key = jax.random.key(0)
        return {"w": jax.random.normal(key, (3, 2)), "b": jnp.zeros(2)}

    def test_optimiser_step_leaves_the_callers_jax_params_alone(self):
        params = self.params()
        before = np.asarray(params["w"]).copy()
        module = interop.JaxModule(self.linear, params)
        optimiser = torch.optim.SGD(module.parameters(), lr=0.5)
        module(torch.randn(4, 3)).sum().backward()  # stride-0 gradient
        optimiser.step()
        np.testing.assert_array_equal(np.asarray(params["w"]), before)
        assert not np.array_equal(module.jax_params()["w"], before)

    def test_shared_params_on_request(self):
        params = self.params()
        module = interop.JaxModule(self.linear, params, copy_params=False)
        assert module.params_tree()["w"].data_ptr() == jax_ptr(params["w"])

    def test_structure_buffers_and_state_dict(self):
        params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2), "step": jnp.array(3)}
        module = interop.JaxModule(lambda p, x: x @ p["w"] + p["b"] * p["step"], params)
        assert [name for name, _ in module.named_parameters()] == ["params.0", "params.1"]
        tree = module.params_tree()
        assert list(tree) == ["w", "b", "step"] and not tree["step"].is_floating_point()
        assert set(module.state_dict()) == {"params.0", "params.1", "leaf_2"}
        assert isinstance(module, torch.nn.Module) and "fn=<lambda>" in repr(module)

    def test_gradients_match_jax_and_training_converges(self):
        params = self.params()
        x = torch.randn(16, 3)
        target = x @ torch.tensor([[1.0, -1.0], [0.5, 2.0], [0.0, 1.0]])
        module = interop.JaxModule(self.linear, params)
        loss = torch.nn.functional.mse_loss(module(x), target)
        loss.backward()

        def jax_loss(p):
            return jnp.mean((self.linear(p, to_jax(x)) - to_jax(target)) ** 2)

        expected = jax.grad(jax_loss)(params)
        np.testing.assert_allclose(module.params[0].grad.numpy(), expected["w"], rtol=1e-5)
        optimiser = torch.optim.Adam(module.parameters(), lr=0.1)
        for _ in range(60):
            optimiser.zero_grad()
            last = torch.nn.functional.mse_loss(module(x), target)
            last.backward()
            optimiser.step()
        assert last.item() < 0.05 * loss.item()

    def test_deepcopy_and_pickle(self):
        module = interop.JaxModule(self.linear, self.params())
        x = torch.randn(2, 3)
        for clone in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
            assert type(clone) is type(module)
            torch.testing.assert_close(clone(x), module(x))

    def test_has_aux(self):
        def fn(p, x):
            y = x @ p["w"]
            return y.sum(), {"y": y}

        module = interop.JaxModule(fn, self.params(), has_aux=True)
        loss, aux = module(torch.ones(2, 3))
        assert aux["y"].shape == (2, 2)
        loss.backward()
        assert module.params[0].grad.shape == (3, 2)


# ---------------------------------------------------------------------------------------------
# torch functions from JAX: eager, jit, grad, vmap
# ---------------------------------------------------------------------------------------------


@jax_callable
def torch_sin_product(x, y):
    return torch.sin(x) * y**2


class TestJaxCallable:
    x = jnp.linspace(0.0, 1.0, 5)
    y = jnp.linspace(1.0, 2.0, 5)

    def expected(self, x, y):
        return jnp.sin(x) * y**2

    def test_eager_and_jit(self):
        expected = self.expected(self.x, self.y)
        np.testing.assert_allclose(torch_sin_product(self.x, self.y), expected, rtol=1e-6)
        np.testing.assert_allclose(jax.jit(torch_sin_product)(self.x, self.y), expected, rtol=1e-6)

    def test_grad_eager_and_jit(self):
        def loss(fn):
            return lambda x, y: jnp.sum(fn(x, y) ** 2)

        expected = jax.grad(loss(self.expected), argnums=(0, 1))(self.x, self.y)
        for got in (
            jax.grad(loss(torch_sin_product), argnums=(0, 1))(self.x, self.y),
            jax.jit(jax.grad(loss(torch_sin_product), argnums=(0, 1)))(self.x, self.y),
        ):
            for g, e in zip(got, expected, strict=True):
                np.testing.assert_allclose(g, e, rtol=1e-5)

    def test_check_grads(self, x64):
        x, y = self.x.astype(jnp.float64), self.y.astype(jnp.float64)
        check_grads(torch_sin_product, (x, y), order=1, modes=["rev"])
        check_grads(jax.jit(torch_sin_product), (x, y), order=1, modes=["rev"])

    def test_vmap(self):
        xs = jnp.stack([self.x, 2 * self.x])
        out = jax.vmap(torch_sin_product, in_axes=(0, None))(xs, self.y)
        np.testing.assert_allclose(out, self.expected(xs, self.y), rtol=1e-6)
        grads = jax.vmap(jax.grad(lambda x: torch_sin_product(x, self.y).sum()))(xs)
        np.testing.assert_allclose(grads, jnp.cos(xs) * self.y**2, rtol=1e-5)

    def test_pytrees_static_leaves_and_integer_inputs(self):
        @jax_callable
        def f(inputs, *, power, index):
            x = inputs["x"] ** power
            return {"picked": x[index], "n": index.numel()}, "tag"

        inputs = {"x": self.x}
        index = jnp.array([0, 2, 2])

        def loss(inputs):
            (out, tag) = f(inputs, power=3, index=index)
            assert tag == "tag" and out["n"] == 3
            return out["picked"].sum()

        grad = jax.jit(jax.grad(loss))(inputs)["x"]
        expected = np.zeros(5, dtype=np.float32)
        expected[[0, 2]] = [1, 2]
        np.testing.assert_allclose(grad, expected * 3 * np.asarray(self.x) ** 2, rtol=1e-6)

    def test_several_outputs_with_an_integer_one(self):
        f = jax_callable(lambda x: (x * 2, torch.argmax(x)))

        def loss(x):
            doubled, index = f(x)
            return doubled[index]

        with pytest.warns(DtypeNarrowingWarning, match="int64"):  # torch's argmax is int64
            assert jax.jit(jax.grad(loss))(self.x).tolist() == [0, 0, 0, 0, 2.0]

    def test_result_shape(self):
        f = jax_callable(
            lambda x: torch.nn.functional.pad(x, (1, 1)),
            result_shape=jax.ShapeDtypeStruct((7,), jnp.float32),
        )
        assert jax.jit(f)(self.x).shape == (7,)
        g = jax_callable(
            lambda x: x[:2], result_shape=lambda x: jax.ShapeDtypeStruct((2,), x.dtype)
        )
        assert jax.jit(g)(self.x).tolist() == self.x[:2].tolist()

    def test_value_dependent_shapes_are_refused_under_jit(self):
        f = jax_callable(lambda x: x[x > 0.5])
        assert f(self.x).shape == (2,)  # eager: fine
        with pytest.raises(TypeError, match="result_shape"):
            jax.jit(f)(self.x)

    def test_writing_into_an_input_raises_unless_copied(self):
        def scale_in_place(x):
            return x.mul_(2)

        with pytest.raises(RuntimeError, match="copy_inputs=True"):
            jax_callable(scale_in_place)(jnp.ones(3))
        safe = jnp.ones(3)
        out = jax.jit(jax_callable(scale_in_place, copy_inputs=True))(safe)
        assert out.tolist() == [2.0] * 3 and safe.tolist() == [1.0] * 3

    def test_float64_outputs_without_x64_narrow_with_a_warning(self):
        f = jax_callable(lambda x: x.double())
        with pytest.warns(DtypeNarrowingWarning):
            out = jax.jit(f)(self.x)
        assert out.dtype == jnp.float32

    def test_complex_gradients_follow_jax(self):
        z = jnp.array([1 + 2j, -0.5 + 1j], dtype=jnp.complex64)

        def loss(fn):
            return lambda z: jnp.sum(jnp.abs(fn(z)) ** 2)

        ours = jax.grad(loss(jax_callable(torch.sin)))(z)
        np.testing.assert_allclose(ours, jax.grad(loss(jnp.sin))(z), rtol=1e-5)

    def test_bad_options(self):
        with pytest.raises(ValueError, match="vmap_method"):
            jax_callable(torch.sin, vmap_method="legacy")
        with pytest.raises(TypeError, match="wraps a function"):
            jax_callable(3)


class TestModuleToJax:
    def test_linear_values_and_gradients_match_torch(self):
        torch.manual_seed(0)
        module = torch.nn.Linear(3, 2)
        apply, state = module_to_jax(module)
        assert list(state) == ["weight", "bias"]
        x = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
        tx = torch.tensor(x, requires_grad=True)
        (module(tx) ** 2).sum().backward()

        def loss(state, x):
            return jnp.sum(apply(state, x) ** 2)

        for grad_fn in (jax.grad(loss, argnums=(0, 1)), jax.jit(jax.grad(loss, argnums=(0, 1)))):
            grad_state, grad_x = grad_fn(state, x)
            np.testing.assert_allclose(grad_state["weight"], module.weight.grad, rtol=1e-5)
            np.testing.assert_allclose(grad_state["bias"], module.bias.grad, rtol=1e-5)
            np.testing.assert_allclose(grad_x, tx.grad, rtol=1e-5)

    def test_batchnorm_in_eval_mode(self):
        torch.manual_seed(0)
        module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
        module.train()
        module(torch.randn(32, 3))  # running statistics away from their defaults
        module.eval()
        with pytest.warns(DtypeNarrowingWarning, match="int64"):  # num_batches_tracked
            apply, state = module_to_jax(module)
        assert "1.running_mean" in state and "1.running_var" in state
        x = jnp.ones((2, 3))
        expected = module(torch.ones(2, 3)).detach().numpy()
        np.testing.assert_allclose(apply(state, x), expected, rtol=1e-5)
        np.testing.assert_allclose(jax.jit(apply)(state, x), expected, rtol=1e-5)
        grads = jax.jit(jax.grad(lambda s: apply(s, x).sum(), allow_int=True))(state)
        assert grads["0.weight"].shape == (4, 3)
        assert not np.any(grads["1.running_mean"])  # buffers are constants, as in torch

    def test_impure_training_modes_are_refused(self):
        with pytest.raises(ValueError, match="running statistics"):
            module_to_jax(torch.nn.BatchNorm1d(3))
        dropout = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
        with pytest.raises(ValueError, match="random numbers"):
            module_to_jax(dropout)
        apply, state = module_to_jax(dropout.eval())
        dropout.train()  # switched back after wrapping: refused at the call
        with pytest.raises(ValueError, match="random numbers"):
            apply(state, jnp.ones((1, 2)))

    def test_vmap_over_inputs_and_over_stacked_states(self):
        module = torch.nn.Linear(3, 2)
        apply, state = module_to_jax(module)
        xs = jnp.arange(12.0).reshape(4, 3)
        per_example = jax.vmap(apply, in_axes=(None, 0))(state, xs)
        expected = module(to_torch(xs)).detach()
        np.testing.assert_allclose(per_example, expected, rtol=1e-6)
        stacked = jax.tree.map(lambda v: jnp.stack([v, 2 * v]), state)
        ensemble = jax.jit(jax.vmap(apply, in_axes=(0, None)))(stacked, xs)
        np.testing.assert_allclose(ensemble[1], 2 * per_example, rtol=1e-6)

    def test_state_is_a_snapshot_unless_shared(self):
        module = torch.nn.Linear(2, 2)
        _, snapshot = module_to_jax(module)
        _, shared = module_to_jax(module, copy=False)
        with torch.no_grad():
            module.weight.add_(1.0)
        np.testing.assert_array_equal(shared["weight"], module.weight.detach())
        assert not np.array_equal(snapshot["weight"], module.weight.detach())

    def test_not_a_module(self):
        with pytest.raises(TypeError, match="torch.nn.Module"):
            module_to_jax(lambda x: x)


# ---------------------------------------------------------------------------------------------
# Parity with torch-jax-interop on the cases it gets right
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tji():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return need("torch_jax_interop", "torch-jax-interop")


class TestParityWithTorchJaxInterop:
    def test_single_arrays_and_string_keyed_dicts(self, tji):
        tree = {"x": torch.randn(5), "y": torch.arange(5, dtype=torch.int32)}
        theirs, ours = tji.torch_to_jax(tree), to_jax(tree)
        for key in tree:
            np.testing.assert_array_equal(theirs[key], ours[key])
            assert theirs[key].dtype == ours[key].dtype
        back_theirs, back_ours = tji.jax_to_torch(theirs), to_torch(ours)
        for key in tree:
            assert torch.equal(back_theirs[key], back_ours[key])

    def test_wrapped_jax_function_gradients(self, tji):
        def fn(params, x):
            return jnp.tanh(x @ params["w"] + params["b"])

        params = {"w": jax.random.normal(jax.random.key(1), (3, 2)), "b": jnp.ones(2)}
        x = torch.randn(4, 3)
        theirs = tji.WrappedJaxFunction(fn, params, clone_params=True)
        ours = interop.JaxModule(fn, params)
        out_theirs, out_ours = theirs(x), ours(x)
        torch.testing.assert_close(out_theirs, out_ours)
        (out_theirs**2).mean().backward()  # not .sum(): its stride-0 gradient crashes theirs
        (out_ours**2).mean().backward()
        # Theirs holds the leaves in JAX's order (sorted keys), ours in the dict's order.
        theirs_by_name = jax.tree.unflatten(jax.tree.structure(params), list(theirs.parameters()))
        for name, p_ours in ours.params_tree().items():
            torch.testing.assert_close(theirs_by_name[name].grad, p_ours.grad)

    def test_torch_module_to_jax_gradients(self, tji):
        module = torch.nn.Linear(3, 2)
        fn_theirs, params_theirs = tji.torch_module_to_jax(module, example_output=torch.zeros(4, 2))
        apply, state = module_to_jax(module)
        x = jnp.ones((4, 3))
        np.testing.assert_allclose(fn_theirs(params_theirs, x), apply(state, x), rtol=1e-6)
        grads_theirs = jax.jit(jax.grad(lambda p: fn_theirs(p, x).sum()))(params_theirs)
        grads_ours = jax.jit(jax.grad(lambda s: apply(s, x).sum()))(state)
        np.testing.assert_allclose(grads_theirs[0], grads_ours["weight"], rtol=1e-6)
        np.testing.assert_allclose(grads_theirs[1], grads_ours["bias"], rtol=1e-6)

    def test_namedtuples(self, tji):
        pair = Pair(torch.ones(2), torch.arange(3, dtype=torch.int32))
        theirs, ours = tji.torch_to_jax(pair), to_jax(pair)
        assert type(theirs) is type(ours) is Pair
        check = np.testing.assert_array_equal
        check(theirs.first, ours.first)
        check(theirs.second, ours.second)

    def test_function_decorators_without_tracing(self, tji):
        def jax_fn(x):
            return jnp.sin(x) + 1

        def torch_fn(x):
            return torch.cos(x) * 2

        x = torch.linspace(0, 1, 5)
        torch.testing.assert_close(tji.jax_to_torch(jax_fn)(x), torch_callable(jax_fn)(x))
        xj = jnp.linspace(0, 1, 5)
        np.testing.assert_allclose(tji.torch_to_jax(torch_fn)(xj), jax_callable(torch_fn)(xj))
