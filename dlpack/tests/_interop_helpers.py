"""What the interop tests share: the libraries, the CUDA marker, and array helpers."""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import warnings

import pytest

from dlpack.interop import DtypeNarrowingWarning, to_numpy

from ._helpers import need, need_cuda

np = need("numpy")
torch = need("torch")
jax = need("jax")
jnp = jax.numpy
check_grads = importlib.import_module("jax.test_util").check_grads


HAS_CUDA = torch.cuda.is_available() and any(d.platform == "gpu" for d in jax.devices())


def needs_cuda(test):
    """Skips ``test`` (a function, or each test of a class) without a CUDA device that torch
    and JAX both see (a failure where DLPACK_TESTS_REQUIRE names cuda)."""
    if isinstance(test, type):
        for name, value in list(vars(test).items()):
            if name.startswith("test") and callable(value):
                setattr(test, name, needs_cuda(value))
        return test

    @functools.wraps(test)
    def run(*args, **kwargs):
        need_cuda(HAS_CUDA, "needs a CUDA device in torch and JAX")
        return test(*args, **kwargs)

    return run


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


def held(name: str) -> str:
    """The dtype JAX holds for values of dtype ``name`` in the mode it is in (64-bit types become
    32-bit without jax_enable_x64), as JAX itself says."""
    return jax.dtypes.canonicalize_dtype(name).name


def narrowing(match: str):
    """Expect what converting a 64-bit type to JAX warns in the mode JAX is in: a
    DtypeNarrowingWarning matching ``match`` without jax_enable_x64, none with it."""
    if not jax.config.jax_enable_x64:
        return pytest.warns(DtypeNarrowingWarning, match=match)
    return _no_narrowing()


@contextlib.contextmanager
def _no_narrowing():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DtypeNarrowingWarning)
        yield


def assert_same_values(a, b):
    np.testing.assert_array_equal(to_numpy(a), to_numpy(b))


Pair = collections.namedtuple("Pair", "first second")
