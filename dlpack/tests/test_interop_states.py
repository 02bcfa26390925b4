"""dlpack.interop against real torch and JAX when a JAX array's memory is gone (deleted, donated)
or spread over several devices (sharded, replicated), and when torch, JAX or ml_dtypes is
missing."""

from __future__ import annotations

import json
import textwrap

import pytest

from dlpack import interop

from ._helpers import need, run_python
from ._interop_helpers import ON_TWO_DEVICES, run_on_two_devices

np = need("numpy")
torch = need("torch")
jax = need("jax")
jnp = jax.numpy

GONE = r"this JAX array was deleted or donated \(array\.delete\(\), or passed to a jax\.jit"


def deleted():
    array = jnp.arange(4.0)
    array.delete()
    return array


def donated():
    array = jnp.arange(4.0)
    jax.jit(lambda x: x + 1, donate_argnums=0)(array)
    # Otherwise JAX kept the buffer (it warns) and nothing here would be tested.
    assert array.is_deleted(), "JAX did not take the donated buffer"
    return array


# Every way a JAX array reaches torch or numpy through dlpack.interop.
CONVERSIONS = {
    "to_torch": interop.to_torch,
    "to_torch in a tree": lambda a: interop.to_torch({"k": [a]}),
    "to_torch copy=True": lambda a: interop.to_torch(a, copy=True),
    "to_torch share_readonly": lambda a: interop.to_torch(a, share_readonly=True),
    "to_torch device=cpu": lambda a: interop.to_torch(a, device="cpu"),
    "to_numpy": interop.to_numpy,
    "jax_callable argument": lambda a: interop.jax_callable(lambda x: x + 1)(a),
    "JaxModule params": lambda a: interop.JaxModule(lambda p, x: x, {"w": a}),
    "JaxModule shared params": lambda a: interop.JaxModule(
        lambda p, x: x, {"w": a}, copy_params=False
    ),
}


@pytest.mark.parametrize("make", [deleted, donated])
@pytest.mark.parametrize("convert", CONVERSIONS.values(), ids=CONVERSIONS.keys())
def test_a_deleted_or_donated_array_is_a_buffer_error_naming_it(make, convert):
    # jaxlib's own error would be a RuntimeError ("Array has been deleted").
    with pytest.raises(BufferError, match=GONE) as raised:
        convert(make())
    assert type(raised.value) is BufferError


# Run in a child: the device count must be set before JAX is imported. Prints, for every
# conversion of a sharded and a replicated array, the exception's class and message.
SHARDED = """
import json
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from dlpack import interop

CONVERSIONS = {
    "to_torch": interop.to_torch,
    "to_torch copy=True": lambda a: interop.to_torch(a, copy=True),
    "to_numpy": interop.to_numpy,
    "jax_callable argument": lambda a: interop.jax_callable(lambda x: x + 1)(a),
    "JaxModule params": lambda a: interop.JaxModule(lambda p, x: x, {"w": a}),
}
assert len(jax.devices()) == 2, jax.devices()
mesh = Mesh(np.array(jax.devices()), ("x",))
arrays = {
    "sharded": jax.device_put(jnp.arange(8.0), NamedSharding(mesh, PartitionSpec("x"))),
    "replicated": jax.device_put(jnp.arange(8.0), NamedSharding(mesh, PartitionSpec())),
}
raised = {}
for kind, array in arrays.items():
    for name, convert in CONVERSIONS.items():
        try:
            convert(array)
        except Exception as exc:
            raised[f"{kind} {name}"] = [type(exc).__name__, str(exc)]
        else:
            raised[f"{kind} {name}"] = None
# What the messages advise.
gathered = interop.to_torch(jax.device_put(arrays["sharded"], jax.devices()[0]))
shards = [interop.to_torch(shard.data) for shard in arrays["sharded"].addressable_shards]
first = interop.to_torch(arrays["replicated"].addressable_shards[0].data)
print(json.dumps({
    "raised": raised,
    "gathered": gathered.tolist(),
    "shards": [shard.tolist() for shard in shards],
    "first": first.tolist(),
}))
"""


ON_TWO_DEVICES["states: sharded and replicated"] = SHARDED


def test_sharded_and_replicated_arrays_are_buffer_errors_with_advice_that_works():
    result = json.loads(run_on_two_devices("states: sharded and replicated").splitlines()[-1])
    said = {
        "sharded": "this JAX array is sharded over 2 devices; DLPack describes one buffer",
        "replicated": "this JAX array is replicated on 2 devices; DLPack describes one buffer",
    }
    assert len(result["raised"]) == 10
    for case, error in result["raised"].items():
        assert error is not None, f"{case} converted"
        kind = case.split()[0]
        assert error[0] == "BufferError" and said[kind] in error[1], (case, error)
    values = [float(v) for v in range(8)]
    assert result["gathered"] == values
    assert result["shards"] == [values[:4], values[4:]]
    assert result["first"] == values


# Run in a child with one library made missing (a finder that refuses it, as an environment
# without it would), before anything imports it. Prints each call's exception class and message.
MISSING = """
import json, sys

BLOCKED = {blocked!r}


class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)


sys.meta_path.insert(0, Missing())
import numpy as np
from dlpack import interop

CALLS = {{
    "to_torch": lambda: interop.to_torch(np.ones(2)),
    "to_jax": lambda: interop.to_jax(np.ones(2)),
    "JaxModule": lambda: interop.JaxModule,
    "jax_callable": lambda: interop.jax_callable(lambda x: x)(np.ones(2)),
    "torch_callable": lambda: interop.torch_callable(lambda x: x)(np.ones(2)),
}}
if BLOCKED != "torch":
    import torch

    CALLS["module_to_jax"] = lambda: interop.module_to_jax(torch.nn.Linear(2, 2))
    CALLS["to_numpy bfloat16"] = lambda: interop.to_numpy(torch.ones(2, dtype=torch.bfloat16))
raised = {{}}
for name, call in CALLS.items():
    try:
        call()
    except Exception as exc:
        raised[name] = [type(exc).__name__, str(exc)]
    else:
        raised[name] = None
print(json.dumps(raised))
"""


def not_installed(what, module):
    message = f"needs {module}, which is not installed: pip install {module}"
    return ["ImportError", f"dlpack.interop.{what} {message}"]


def jax_broken(what):
    # JAX needs ml_dtypes: without it, JAX is installed but fails to import.
    message = "needs jax, which failed to import (No module named 'ml_dtypes'): pip install jax"
    return ["ImportError", f"dlpack.interop.{what} {message}"]


WITHOUT = {
    "torch": {
        "to_torch": not_installed("to_torch", "torch"),
        "to_jax": None,
        "JaxModule": not_installed("JaxModule", "torch"),
        "jax_callable": not_installed("jax_callable", "torch"),
        "torch_callable": not_installed("torch_callable", "torch"),
    },
    "jax": {
        "to_torch": None,
        "to_jax": not_installed("to_jax", "jax"),
        "JaxModule": None,
        "jax_callable": not_installed("jax_callable", "jax"),
        "torch_callable": not_installed("torch_callable", "jax"),
        "module_to_jax": not_installed("module_to_jax", "jax"),
        "to_numpy bfloat16": None,
    },
    "ml_dtypes": {
        "to_torch": None,
        "to_jax": jax_broken("to_jax"),
        "JaxModule": None,
        "jax_callable": jax_broken("jax_callable"),
        "torch_callable": jax_broken("torch_callable"),
        "module_to_jax": jax_broken("module_to_jax"),
        "to_numpy bfloat16": [
            "BufferError",
            "numpy reads bfloat16 only through ml_dtypes, which is not installed: "
            "pip install ml-dtypes",
        ],
    },
}


@pytest.mark.parametrize("blocked", WITHOUT)
def test_a_missing_library_is_named_with_how_to_install_it(blocked):
    done = run_python("-c", textwrap.dedent(MISSING.format(blocked=blocked)))
    assert done.returncode == 0, done.stderr[-3000:]
    raised = json.loads(done.stdout.splitlines()[-1])
    # None: the call needs only libraries that are there, and runs.
    assert raised == WITHOUT[blocked]
