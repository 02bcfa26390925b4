"""What the interop tests share: the libraries, the CUDA marker, and array helpers."""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import json
import os
import warnings

import pytest

from dlpack.interop import DtypeNarrowingWarning, to_numpy

from ._helpers import need, need_cuda, run_python

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


# Scripts that run under JAX with two CPU devices, by name: test modules add theirs when they
# are imported, and the first test that asks starts one child for all of them (starting torch
# and JAX there is most of each one's time). Each prints its result last.
ON_TWO_DEVICES: dict[str, str] = {}

# Runs each script given (a JSON object, name -> code) in a namespace and with warnings filters
# of its own; prints, last, each one's traceback (None when it ran through) and output.
_RUN_EACH = """
import contextlib, io, json, sys, traceback, warnings
done = {}
for name, code in json.loads(sys.argv[1]).items():
    output = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(output):
            exec(compile(code, name, "exec"), {"__name__": "__main__"})
    except BaseException:
        done[name] = [traceback.format_exc(), output.getvalue()]
    else:
        done[name] = [None, output.getvalue()]
print(json.dumps(done))
"""


@functools.cache
def _run_on_two_devices():
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    env = {"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    return run_python("-c", _RUN_EACH, json.dumps(ON_TWO_DEVICES), env=env)


def run_on_two_devices(name: str) -> str:
    """What script ``name`` of :data:`ON_TWO_DEVICES` printed, run (beside the others) in a
    child under JAX with two CPU devices; the child's error, or the script's, fails the test."""
    done = _run_on_two_devices()
    assert done.returncode == 0, done.stderr[-3000:]
    error, output = json.loads(done.stdout.splitlines()[-1])[name]
    assert error is None, error + done.stderr[-3000:]
    return output
