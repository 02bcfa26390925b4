"""Providers x consumers x devices: every exchange through ``asdlpack`` that can happen here.

The providers (stdlib buffers, numpy, torch, jax, cupy, numba, tensorflow, pyarrow, pillow, mlx,
paddle, and the columns of pyarrow, polars, pandas, DuckDB and nanoarrow, read through the Arrow
PyCapsule interface) and consumers (numpy, torch, jax, cupy, tensorflow, paddle, array-api-strict,
tvm-ffi; memoryview, numpy's array interface, pillow, numba; pyarrow, polars, pandas, DuckDB and
nanoarrow through the Arrow PyCapsule interface) come from ``dlpack._report``, which
``python -m dlpack`` uses too. A library or device that is not
here is a skip with its reason (a failure for a library ``DLPACK_TESTS_REQUIRE`` names); so is a
library version that lacks what an exchange needs.
"""

import warnings

import pytest

from dlpack import DLDeviceType, asdlpack
from dlpack._report import (
    DEVICES,
    PROVIDERS,
    Unavailable,
    cuda_devices,
    cupy_cuda,
    exchange,
    library,
    pairs,
    torch_cuda,
    version,
)

from ._helpers import asks_for_legacy_capsule, need, need_cuda

EXCHANGES = [(device, p, c) for device in DEVICES for p, c in pairs(device)]
SOURCES = [(device, p) for device in DEVICES for p in PROVIDERS if device in p.devices]


def _same(got, expected) -> bool:
    if isinstance(expected, list):
        return (
            isinstance(got, list)
            and len(got) == len(expected)
            and all(_same(g, e) for g, e in zip(got, expected, strict=True))
        )
    return float(got) == float(expected)


def _need_all(*names):
    __tracebackhide__ = True  # pytest reports the skip at the test's line
    for name in names:
        if name is not None:
            need(name)


def _skip_unless_cuda():
    __tracebackhide__ = True
    ok, why = cuda_devices()
    need_cuda(ok, f"needs a CUDA device: {why}")


@pytest.mark.parametrize(
    "device, provider", SOURCES, ids=[f"{device}-{p.name}" for device, p in SOURCES]
)
def test_provider_view(device, provider):
    """asdlpack sees each provider's array as it is: shape, dtype, device, memory, flags."""
    _need_all(provider.module)
    if device == "cuda":
        _skip_unless_cuda()
    try:
        sample = provider.make(device)
    except Unavailable as exc:
        pytest.skip(str(exc))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        obj = asdlpack(sample.obj)
    assert obj.dtype == sample.dtype
    size = 1
    for n in obj.shape:
        size *= n
    assert size == 6
    assert obj.nbytes == 6 * obj.itemsize
    if sample.ptr is not None:
        assert obj.data_ptr == sample.ptr, "asdlpack copied (or misread) the source"
    if sample.readonly:
        assert obj.readonly is True
    if device == "cpu":
        assert obj.device == (DLDeviceType.kDLCPU, 0)
    else:
        assert obj.device[0] in (DLDeviceType.kDLCUDA, DLDeviceType.kDLCUDAManaged)
    assert obj.__dlpack_device__() == obj.device


@pytest.mark.parametrize(
    "device, provider, consumer",
    EXCHANGES,
    ids=[f"{device}-{p.name}-{c.name}" for device, p, c in EXCHANGES],
)
def test_exchange(device, provider, consumer):
    """provider -> asdlpack -> consumer.from_dlpack: same values, and the same memory wherever
    the consumer promises not to copy, except that read-only memory goes out as a copy where
    the consumer can't be told it is read-only: in a legacy capsule, or to a consumer that
    ignores the READ_ONLY flag (``copies_read_only``: the C exchange API)."""
    _need_all(provider.module, consumer.module)
    if device == "cuda":
        _skip_unless_cuda()
    out = exchange(provider, consumer, device)
    if out.status == "skip":
        pytest.skip(out.reason)
    assert out.status != "fails", out.reason
    assert _same(out.values, out.sample.values), (out.values, out.sample.values)
    if out.sample.ptr is None:
        return  # the provider copies: no memory of its own to compare with
    if not consumer.speaks_dlpack:
        # the buffer protocol and the array interfaces say read-only themselves; Arrow memory is
        # immutable by contract (test_arrow_consumers_never_write_lent_memory)
        if out.sample.readonly and consumer.zero_copy and not consumer.speaks_arrow:
            assert _lent_read_only(out.result), f"{consumer.name} may write read-only memory"
        if consumer.zero_copy:
            assert out.status == "zero-copy", f"{consumer.name} got a copy"
        return
    if out.sample.readonly and (
        consumer.copies_read_only
        or asks_for_legacy_capsule(lambda x: consumer.consume(x, device), provider.make(device).obj)
    ):
        assert out.status == "copy", f"{consumer.name} was lent read-only memory"
    elif consumer.zero_copy:
        assert out.status == "zero-copy", f"{consumer.name} got a copy"


# What the report shows for the Arrow interface's rows and columns here (CPU): zero-copy where
# the memory is lent both ways, copy where a library makes its own.
ARROW_CELLS = {
    # columns in: asdlpack reads each library's Arrow export in place
    ("pyarrow-stream", "numpy"): "zero-copy",
    ("polars", "numpy"): "zero-copy",
    ("pandas", "torch"): "zero-copy",
    ("nanoarrow", "numpy"): "zero-copy",
    ("duckdb", "numpy"): "copy",  # a query result is a table: one rows x columns copy
    # out: 1-D and 2-D (a fixed_shape_tensor column) memory lent as it is
    ("bytes", "pyarrow"): "zero-copy",
    ("numpy", "pyarrow"): "zero-copy",
    ("bytes", "polars"): "zero-copy",
    ("torch", "polars"): "zero-copy",
    ("bytes", "nanoarrow"): "zero-copy",
    ("numpy", "nanoarrow"): "zero-copy",
    ("bytearray", "pandas"): "copy",  # pandas copies a column into its own block
    ("numpy", "pandas"): "zero-copy",  # a tensor's rows are views of it
    ("numpy", "duckdb"): "copy",
    # and round trips
    ("polars", "polars"): "zero-copy",
    ("nanoarrow", "pyarrow"): "zero-copy",
    ("duckdb", "duckdb"): "copy",
}


@pytest.mark.parametrize(
    "provider, consumer, expected",
    [(p, c, want) for (p, c), want in ARROW_CELLS.items()],
    ids=[f"{p}-{c}" for p, c in ARROW_CELLS],
)
def test_arrow_cells(provider, consumer, expected):
    from dlpack._report import CONSUMERS

    p = next(x for x in PROVIDERS if x.name == provider)
    c = next(x for x in CONSUMERS if x.name == consumer)
    _need_all(p.module, c.module, "numpy")
    out = exchange(p, c)
    if out.status == "skip":  # a version without what the exchange needs
        pytest.skip(out.reason)
    assert out.status == expected, out.reason or f"{provider} -> {consumer}: {out.status}"


def test_arrow_consumers_never_write_lent_memory():
    """asdlpack lends read-only memory to Arrow consumers (Arrow memory is immutable): polars
    copies before it writes, and pandas' rows of a tensor are read-only views."""
    pl = need("polars")
    pd = need("pandas")
    source = bytes(range(6))
    series = pl.Series(asdlpack(source))
    series[0] = 9
    assert series.to_list() == [9, 1, 2, 3, 4, 5] and source == bytes(range(6))
    if not hasattr(pd.Series, "from_arrow"):
        pytest.skip(f"{version('pandas')} has no Series.from_arrow (pandas >= 3.0)")
    rows = pd.Series.from_arrow(asdlpack(memoryview(source).cast("B", [2, 3])))
    assert [row.tolist() for row in rows] == [[0, 1, 2], [3, 4, 5]]
    assert not any(row.flags.writeable for row in rows)


def _lent_read_only(result) -> bool:
    """Whether a consumer's result refuses writes: a read-only memoryview or numpy array."""
    if isinstance(result, memoryview):
        return result.readonly
    return not result.flags.writeable


def test_exchange_table_covers_every_provider_and_consumer():
    from dlpack._report import CONSUMERS

    names = {p.name for _, p, _ in EXCHANGES}
    assert names == {p.name for p in PROVIDERS}
    assert {c.name for _, _, c in EXCHANGES} == {c.name for c in CONSUMERS}
    for _, p, c in EXCHANGES:
        assert set(p.devices) & set(c.devices)


# ---------------------------------------------------------------------------
# CUDA streams (skipped without a GPU)
# ---------------------------------------------------------------------------


def _cuda_torch():
    torch = need("torch")
    _skip_unless_cuda()
    need_cuda(torch_cuda(), f"{version('torch')} sees no CUDA device")
    return torch


def _cuda_cupy():
    cupy = need("cupy")
    _skip_unless_cuda()
    need_cuda(cupy_cuda(), f"{version('cupy')} sees no CUDA device")
    return cupy


N = 1 << 20


def test_cuda_torch_to_cupy_on_a_cupy_stream():
    """cupy passes its stream; asdlpack asks torch again with it, so torch's pending work is
    ordered before cupy reads."""
    torch = _cuda_torch()
    cupy = _cuda_cupy()
    t = torch.arange(N, device="cuda", dtype=torch.float32) * 2  # queued on torch's stream
    obj = asdlpack(t)
    with cupy.cuda.Stream(non_blocking=True) as stream:
        x = cupy.from_dlpack(obj)
        last = x[-1:] + 0
    stream.synchronize()
    assert float(last.get()[0]) == 2.0 * (N - 1)
    assert int(x.data.ptr) == t.data_ptr()


def test_cuda_cupy_cai_stream_to_torch():
    """A CUDA array interface producer names its stream; the consumer's capsule waits for it."""
    torch = _cuda_torch()
    cupy = _cuda_cupy()
    from dlpack._report._providers import _CudaArrayInterfaceOnly

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        x = cupy.arange(N, dtype=cupy.float32) * 3
        only_cai = _CudaArrayInterfaceOnly(x)  # its interface names `stream`
    obj = asdlpack(only_cai)
    named = only_cai.__cuda_array_interface__.get("stream")
    if named not in (None, 1, 2):
        assert obj.stream == named
    t = torch.from_dlpack(obj)
    assert t.data_ptr() == int(x.data.ptr)
    expected = torch.arange(N, device="cuda", dtype=torch.float32) * 3
    assert torch.equal(t, expected)


def test_cuda_cai_stream_minus_one_skips_the_wait():
    cupy = _cuda_cupy()
    from dlpack._report._providers import _CudaArrayInterfaceOnly

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        x = cupy.ones(16, dtype=cupy.float32)
        only_cai = _CudaArrayInterfaceOnly(x)
    obj = asdlpack(only_cai)
    cap = obj.__dlpack__(stream=-1, max_version=(1, 0))
    assert type(cap).__name__ == "PyCapsule"
    stream.synchronize()


def test_cuda_numba_cai_to_torch_and_jax():
    """Numba device arrays speak only the CUDA array interface."""
    _need_all("numba", "numpy")
    _skip_unless_cuda()
    from dlpack._report import CONSUMERS, PROVIDERS

    provider = next(p for p in PROVIDERS if p.name == "numba-cai")
    tried = 0
    for consumer in CONSUMERS:
        if consumer.name not in ("torch", "jax") or not library(consumer.module).ok:
            continue
        out = exchange(provider, consumer, "cuda")
        if out.status == "skip":
            continue
        tried += 1
        assert out.works, f"numba -> {consumer.name}: {out.reason}"
    if not tried:
        pytest.skip("needs torch or jax with CUDA")
