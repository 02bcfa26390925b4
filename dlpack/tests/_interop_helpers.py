"""What the interop tests share: the libraries, the CUDA marker, and array helpers."""

from __future__ import annotations

import collections
import importlib

import pytest

from dlpack.interop import (
    to_numpy,
)

from ._helpers import need

np = need("numpy")
torch = need("torch")
jax = need("jax")
jnp = jax.numpy
check_grads = importlib.import_module("jax.test_util").check_grads


HAS_CUDA = torch.cuda.is_available() and any(d.platform == "gpu" for d in jax.devices())
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device in torch and JAX")


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


Pair = collections.namedtuple("Pair", "first second")
