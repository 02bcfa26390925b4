"""dlpack.interop.copyto_jax: refilling a JAX array in its own memory through JAX's buffer
donation, from torch, numpy and JAX sources in any layout, with copyto's checks; what it does
where JAX can't donate; memory over a refill and over a loop; compilation once per shape."""

from __future__ import annotations

import json
import logging
import os
import warnings

import pytest

from dlpack import asdlpack, copyto
from dlpack.interop import DonationWarning, copyto_jax

from ._helpers import need, run_python
from ._interop_helpers import ON_TWO_DEVICES, aligned_numpy, jax_ptr, needs_cuda, run_on_two_devices

np = need("numpy")
torch = need("torch")
jax = need("jax")
jnp = jax.numpy


def _refilled(dst, src):
    """copyto_jax(dst, src), checked to have written into dst's buffer and deleted dst, with no
    warning."""
    before = jax_ptr(dst)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DonationWarning)
        out = copyto_jax(dst, src)
    assert jax_ptr(out) == before
    assert dst.is_deleted()
    assert out.shape == dst.shape and out.dtype == dst.dtype
    return out


def _expected(src, shape):
    """The source's values as the source library gives them, broadcast as numpy does."""
    values = src.detach().cpu().numpy() if isinstance(src, torch.Tensor) else np.asarray(src)
    extra = max(values.ndim - len(shape), 0)
    return np.broadcast_to(values.reshape(values.shape[extra:]), shape)


# name -> (dst shape, source made by its own library)
SOURCES = {
    "torch": ((3, 4), lambda: torch.arange(12, dtype=torch.float32).reshape(3, 4)),
    "torch transposed": ((3, 4), lambda: torch.arange(12, dtype=torch.float32).reshape(4, 3).T),
    "torch broadcast row": ((3, 4), lambda: torch.arange(4, dtype=torch.float32).expand(3, 4)),
    "torch broadcast column": ((3, 4), lambda: torch.arange(3.0).reshape(3, 1).expand(3, 4)),
    "torch row (fewer dimensions)": ((3, 4), lambda: torch.arange(4, dtype=torch.float32)),
    "torch flipped": ((3, 4), lambda: torch.arange(12.0).reshape(3, 4).flip(1)),
    "torch requiring grad": ((3, 4), lambda: torch.ones(3, 4, requires_grad=True)),
    "numpy": ((3, 4), lambda: np.arange(12, dtype=np.float32).reshape(3, 4)),
    "numpy aligned": ((3, 4), lambda: aligned_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))),
    "numpy transposed": ((3, 4), lambda: np.arange(12, dtype=np.float32).reshape(4, 3).T),
    "numpy aligned transposed": (
        (3, 4),
        lambda: aligned_numpy(np.arange(12, dtype=np.float32).reshape(4, 3)).T,
    ),
    "numpy slice with gaps": (
        (3, 4),
        lambda: np.arange(24, dtype=np.float32).reshape(3, 8)[:, ::2],
    ),
    "numpy negative strides": ((3, 4), lambda: np.arange(12, dtype=np.float32).reshape(3, 4)[::-1]),
    "numpy broadcast_to": ((3, 4), lambda: np.broadcast_to(np.arange(4, dtype=np.float32), (3, 4))),
    "numpy leading ones": ((3, 4), lambda: np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)),
    "numpy scalar array": ((3, 4), lambda: np.array(7, dtype=np.float32)),
    "numpy big-endian": ((3, 4), lambda: np.arange(12, dtype=">f4").reshape(3, 4)),
    "numpy big-endian transposed": ((3, 4), lambda: np.arange(12, dtype=">f4").reshape(4, 3).T),
    "numpy read-only": (
        (3, 4),
        lambda: np.frombuffer(np.arange(12, dtype=np.float32).tobytes(), np.float32).reshape(3, 4),
    ),
    "numpy unaligned": (
        (3, 4),
        lambda: np.frombuffer(
            bytearray(b"\0" + np.arange(12, dtype=np.float32).tobytes()), np.float32, offset=1
        ).reshape(3, 4),
    ),
    "numpy masked array, nothing masked": (
        (3, 4),
        lambda: np.ma.masked_array(np.arange(12, dtype=np.float32).reshape(3, 4), mask=False),
    ),
    "DLPackObject": ((3, 4), lambda: asdlpack(np.arange(12, dtype=np.float32).reshape(3, 4))),
    "memoryview": (
        (3, 4),
        lambda: memoryview(np.arange(12, dtype=np.float32).tobytes()).cast("f", [3, 4]),
    ),
    "JAX": ((3, 4), lambda: jnp.arange(12, dtype=jnp.float32).reshape(3, 4)),
    "JAX broadcast row": ((3, 4), lambda: jnp.arange(4, dtype=jnp.float32)),
    "empty": ((0, 4), lambda: torch.zeros(0, 4)),
}


@pytest.mark.parametrize("name", list(SOURCES))
def test_values_land_in_dst_buffer(name):
    shape, make = SOURCES[name]
    src = make()
    expected = _expected(src, shape)
    dst = jnp.full(shape, -1.0, dtype=jnp.float32)
    if 0 in shape:  # no buffer to keep
        out = copyto_jax(dst, src)
        assert out.shape == shape and dst.is_deleted()
        return
    out = _refilled(dst, src)
    np.testing.assert_array_equal(np.asarray(out), expected)


def test_a_second_refill_of_the_result_and_the_source_read_at_the_call():
    src = torch.arange(6, dtype=torch.float32)
    dst = _refilled(jnp.zeros(6, jnp.float32), src)
    src += 10  # after the call: the refilled array keeps the values it was given
    assert np.asarray(dst).tolist() == list(range(6))
    dst = _refilled(dst, src)
    assert np.asarray(dst).tolist() == [float(v) for v in range(10, 16)]


@pytest.mark.parametrize(
    "dtype", ["bool", "int8", "uint8", "int16", "int32", "float16", "float32", "complex64"]
)
def test_dtypes(dtype):
    values = np.arange(10).reshape(2, 5) % 3
    src = torch.from_numpy(values.astype(dtype))
    out = _refilled(jnp.zeros((2, 5), dtype), src)
    np.testing.assert_array_equal(np.asarray(out), values.astype(dtype))


def test_bfloat16_from_torch():
    src = torch.arange(8, dtype=torch.float32).to(torch.bfloat16)
    out = _refilled(jnp.zeros(8, jnp.bfloat16), src)
    assert np.asarray(out).astype(np.float32).tolist() == list(range(8))


def test_64_bit_types(x64):
    src = np.arange(6, dtype=np.float64).reshape(2, 3) / 3
    out = _refilled(jnp.zeros((2, 3), jnp.float64), src)
    np.testing.assert_array_equal(np.asarray(out), src)
    out = _refilled(jnp.zeros(4, jnp.int64), torch.tensor([1, -2, 3, 2**40]))
    assert np.asarray(out).tolist() == [1, -2, 3, 2**40]


def test_byte_order_converts_element_types_do_not():
    """copyto's rules: the byte order is the copy's to convert; a different element type is a
    TypeError, with copyto's message."""
    dst = jnp.zeros(3, jnp.float32)
    out = _refilled(dst, np.array([1.5, -2.0, 3.25], dtype=">f4"))
    assert np.asarray(out).tolist() == [1.5, -2.0, 3.25]
    for src in (np.ones(3, np.float64), torch.ones(3, dtype=torch.int32), jnp.ones(3, jnp.int32)):
        with pytest.raises(TypeError) as theirs:
            copyto(np.zeros(3, np.float32), src)
        with pytest.raises(TypeError, match="needs equal dtypes: the destination holds float32"):
            copyto_jax(out, src)
        with pytest.raises(TypeError) as ours:
            copyto_jax(out, src)
        assert str(ours.value) == str(theirs.value).replace("copyto", "copyto_jax")
    assert not out.is_deleted()
    assert np.asarray(out).tolist() == [1.5, -2.0, 3.25]


@pytest.mark.parametrize(
    "src_shape", [(4, 3), (3,), (2, 3, 4), (3, 5), (0,)], ids=lambda s: str(list(s))
)
def test_shapes_that_do_not_broadcast_are_copytos_value_error(src_shape):
    dst = jnp.zeros((3, 4), jnp.float32)
    src = np.zeros(src_shape, np.float32)
    with pytest.raises(ValueError) as theirs:
        copyto(np.zeros((3, 4), np.float32), src)
    with pytest.raises(ValueError) as ours:
        copyto_jax(dst, src)
    assert str(ours.value) == str(theirs.value)
    assert not dst.is_deleted()


def test_copying_an_array_onto_itself_changes_nothing():
    dst = jnp.arange(4.0)
    assert copyto_jax(dst, dst) is dst
    assert not dst.is_deleted()
    assert copyto_jax(dst, jax.device_put(dst, next(iter(dst.devices())))) is dst


def test_jax_source_on_another_device_is_moved_to_dsts():
    """A committed destination and a source committed elsewhere: the source moves (a JAX
    array on the GPU, where there is one; the CPU's otherwise), dst is refilled in place."""
    cpu = jax.devices("cpu")[0]
    dst = jax.device_put(jnp.zeros(4, jnp.float32), cpu)
    others = [d for d in jax.devices() if d != cpu]
    src = jax.device_put(jnp.arange(4.0, dtype=jnp.float32), others[0] if others else cpu)
    out = _refilled(dst, src)
    assert out.devices() == {cpu}
    assert np.asarray(out).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_destinations_that_are_not_refillable():
    with pytest.raises(TypeError, match="refills JAX arrays, not ndarray; dlpack.copyto"):
        copyto_jax(np.zeros(3), np.ones(3))
    dst = jnp.zeros(3)
    copyto_jax(dst, np.zeros(3, dst.dtype))
    with pytest.raises(BufferError, match="dst was deleted or donated"):
        copyto_jax(dst, np.zeros(3, dst.dtype))
    src = jnp.ones(3)
    src.delete()
    fresh = jnp.zeros(3)
    with pytest.raises(BufferError, match="src was deleted or donated"):
        copyto_jax(fresh, src)
    assert not fresh.is_deleted()


def test_tracers_are_type_errors_naming_what_to_write():
    @jax.jit
    def inside(d, s):
        return copyto_jax(d, s)

    with pytest.raises(TypeError, match=r"tracer as dst.*dst\.at\[\.\.\.\]\.set\(src\)"):
        inside(jnp.zeros(3), jnp.ones(3))

    concrete = jnp.zeros(3)

    @jax.jit
    def source_traced(s):
        return copyto_jax(concrete, s)

    with pytest.raises(TypeError, match="tracer as src"):
        source_traced(jnp.ones(3))
    assert not concrete.is_deleted()


def test_copyto_names_copyto_jax_for_jax_destinations():
    dst = jnp.zeros(4, jnp.float32)
    with pytest.raises(ValueError, match=r"immutable.*dlpack\.interop\.copyto_jax"):
        copyto(dst, np.ones(4, np.float32))
    assert np.asarray(dst).tolist() == [0.0] * 4


@needs_cuda
class TestCuda:
    """A JAX array on the GPU refilled from torch CUDA memory (read in place, or broadcast in
    the compiled function) and from host memory (moved by JAX); a CPU one from CUDA memory."""

    def test_gpu_destination(self):
        gpu = next(d for d in jax.devices() if d.platform == "gpu")
        dst = jax.device_put(jnp.zeros((64, 32), jnp.float32), gpu)
        sources = [
            torch.arange(2048.0, device="cuda").reshape(64, 32),
            torch.arange(2048.0, device="cuda").reshape(32, 64).T,
            torch.arange(32.0, device="cuda").expand(64, 32),
            torch.arange(2048.0).reshape(64, 32),
            np.arange(2048, dtype=np.float32).reshape(32, 64).T,
        ]
        for src in sources:
            dst = _refilled(dst, src)
            assert dst.devices() == {gpu}
            np.testing.assert_array_equal(np.asarray(dst), _expected(src, (64, 32)))

    def test_cpu_destination_from_cuda_memory(self):
        dst = jax.device_put(jnp.zeros((8, 4), jnp.float32), jax.devices("cpu")[0])
        src = torch.arange(32.0, device="cuda").reshape(8, 4)
        out = _refilled(dst, src)
        np.testing.assert_array_equal(np.asarray(out), src.cpu().numpy())


# ---------------------------------------------------------------------------------------------
# where JAX can't donate: a new array, dst unchanged, a warning naming why
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("holder", ["numpy", "torch"])
def test_dst_referenced_elsewhere_warns_and_leaves_dst_as_it_was(holder):
    dst = jnp.arange(4.0, dtype=jnp.float32)
    held = np.asarray(dst) if holder == "numpy" else torch.from_dlpack(dst)
    src = torch.full((4,), 9.0)
    with pytest.warns(DonationWarning, match=r"something else refers to it.*np\.asarray") as caught:
        out = copyto_jax(dst, src)
    assert caught[0].filename == __file__  # the warning points at the caller's line
    assert jax_ptr(out) != jax_ptr(dst)
    assert not dst.is_deleted()
    assert np.asarray(dst).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert held.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert np.asarray(out).tolist() == [9.0] * 4
    with warnings.catch_warnings():
        warnings.simplefilter("error", DonationWarning)
        with pytest.raises(DonationWarning):
            copyto_jax(dst, src)
    assert not dst.is_deleted()
    del held
    _refilled(dst, src)


@pytest.mark.parametrize("make", ["to_jax", "jnp.from_dlpack"])
def test_dst_in_memory_jax_did_not_allocate_warns(make):
    """A JAX array reading a torch tensor's memory in place: JAX deletes it but won't write
    into memory it borrowed. A copy JAX makes (jnp.array) is its own."""
    from dlpack.interop import to_jax

    tensor = torch.zeros(64)
    borrowed = to_jax(tensor) if make == "to_jax" else jnp.from_dlpack(tensor)
    assert jax_ptr(borrowed) == tensor.data_ptr()
    with pytest.warns(DonationWarning, match=r"memory JAX did not allocate.*jnp\.array\(x\)"):
        out = copyto_jax(borrowed, torch.ones(64))
    assert np.asarray(out).tolist() == [1.0] * 64
    assert tensor.tolist() == [0.0] * 64
    _refilled(jnp.array(to_jax(tensor)), torch.ones(64))


# A sharded and a replicated destination over two CPU devices, refilled shard by shard;
# prints, per case, whether every shard kept its buffer, whether dst was deleted, the values.
SHARDED = """
import json, warnings
import jax, jax.numpy as jnp, numpy as np, torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from dlpack.interop import copyto_jax

warnings.simplefilter("error")
mesh = Mesh(np.array(jax.devices()), ("x",))

def buffers(a):
    return sorted((s.device.id, s.data.unsafe_buffer_pointer()) for s in a.addressable_shards)

sources = {
    "torch": torch.arange(32.0).reshape(8, 4),
    "torch row": torch.arange(4.0),
    "numpy transposed": np.arange(32, dtype=np.float32).reshape(4, 8).T,
    "JAX": jnp.arange(32, dtype=jnp.float32).reshape(8, 4),
    "JAX row": jnp.arange(4, dtype=jnp.float32),
}
out = {}
for spec in ("sharded", "replicated"):
    sharding = NamedSharding(mesh, P("x") if spec == "sharded" else P())
    dst = jax.device_put(jnp.zeros((8, 4), jnp.float32), sharding)
    start = buffers(dst)
    for name, src in sources.items():
        new = copyto_jax(dst, src)
        out[f"{spec} {name}"] = [
            buffers(new) == start, dst.is_deleted(), new.sharding == sharding,
            np.asarray(new).tolist() == np.broadcast_to(np.asarray(src), (8, 4)).tolist(),
        ]
        dst = new
# a destination committed to the second device, a JAX source committed to the first
dst = jax.device_put(jnp.zeros(4, jnp.float32), jax.devices()[1])
before = dst.unsafe_buffer_pointer()
new = copyto_jax(dst, jax.device_put(jnp.arange(4, dtype=jnp.float32), jax.devices()[0]))
out["committed to device 1, source on device 0"] = [
    new.unsafe_buffer_pointer() == before, dst.is_deleted(), new.devices() == {jax.devices()[1]},
    np.asarray(new).tolist() == [0.0, 1.0, 2.0, 3.0],
]
# an uncommitted destination on the second device (made under jax.default_device)
with jax.default_device(jax.devices()[1]):
    dst = jnp.zeros(4, jnp.float32)
before = dst.unsafe_buffer_pointer()
new = copyto_jax(dst, np.arange(4, dtype=np.float32))
out["uncommitted on device 1"] = [
    new.unsafe_buffer_pointer() == before, dst.is_deleted(), new.devices() == {jax.devices()[1]},
    np.asarray(new).tolist() == [0.0, 1.0, 2.0, 3.0],
]
print(json.dumps(out))
"""


ON_TWO_DEVICES["copyto_jax: sharded and replicated"] = SHARDED


def test_sharded_and_replicated_destinations_are_refilled_shard_by_shard():
    result = json.loads(run_on_two_devices("copyto_jax: sharded and replicated").splitlines()[-1])
    assert len(result) == 12
    for case, (kept, deleted, placed, values) in result.items():
        assert kept and deleted and placed and values, case


# ---------------------------------------------------------------------------------------------
# memory and compilation
# ---------------------------------------------------------------------------------------------

# The peak resident memory one process adds while it refills a 64 MiB JAX array from a torch
# tensor, three times (compilation included), and the growth over 1,000 refills of 1 MiB
# after 100 settled it, in MiB.
MEMORY = """
import gc, json
import jax.numpy as jnp, torch
from dlpack.interop import copyto_jax

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024

src = torch.ones(16 << 20)
dst = jnp.zeros(16 << 20, jnp.float32).block_until_ready()
gc.collect()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the high-water mark starts again from what is resident now
start = status("VmRSS")
for _ in range(3):
    dst = copyto_jax(dst, src)
peak = status("VmHWM") - start
assert float(dst[-1]) == 1.0
del dst, src

src = torch.arange(1 << 18, dtype=torch.float32)
small = jnp.zeros(1 << 18, jnp.float32)
for _ in range(100):
    small = copyto_jax(small, src)
gc.collect()
settled = status("VmRSS")
for i in range(1000):
    src[0] = i
    small = copyto_jax(small, src)
gc.collect()
assert float(small[0]) == 999.0
print(json.dumps({"peak": peak, "growth": status("VmRSS") - settled}))
"""


@pytest.mark.skipif(
    not os.access("/proc/self/clear_refs", os.W_OK), reason="needs /proc/self/clear_refs"
)
def test_no_buffer_of_dsts_size_and_no_growth_over_a_loop():
    """A refill that copied the source first would add 64 MiB to the peak; one leaked buffer
    per refill of the loop, 1 GiB."""
    done = run_python("-c", MEMORY, env={"JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["peak"] < 16, result
    assert result["growth"] < 16, result


def test_compiles_once_per_shape(caplog):
    def compiles(action):
        caplog.clear()
        with caplog.at_level(logging.WARNING), jax.log_compiles(True):
            action()
        return sum("Compiling jit(_refill)" in r.getMessage() for r in caplog.records)

    state = {"a": jnp.zeros(37, jnp.float32), "b": jnp.zeros((5, 37), jnp.float32)}

    def refill(key, src, times=1):
        for _ in range(times):
            state[key] = copyto_jax(state[key], src)

    row = torch.arange(37, dtype=torch.float32)
    assert compiles(lambda: refill("a", row, 50)) == 1
    assert compiles(lambda: refill("a", row * 2, 50)) == 0
    assert compiles(lambda: refill("b", row, 20)) == 1  # another destination shape
    assert compiles(lambda: refill("b", torch.ones(5, 37), 20)) == 1  # another source shape
    assert compiles(lambda: refill("a", np.arange(37, dtype=np.float32), 20)) == 0
    assert compiles(lambda: refill("b", row.expand(5, 37))) == 0  # broadcast: cut to the row
    assert compiles(lambda: refill("b", row.reshape(1, 1, 37))) == 0
