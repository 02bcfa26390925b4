"""Move pytrees of arrays between torch, JAX and numpy, and call each framework from the other.

Conversions (zero-copy wherever the consumer can take the memory, built on ``asdlpack``):

- :func:`to_torch`, :func:`to_jax`, :func:`to_numpy` convert every array leaf of a pytree
  (tuples, lists, dicts with any keys, namedtuples, dataclasses, JAX-registered nodes) and keep
  every container's exact type and every non-array leaf as it is. :func:`is_array` says which
  leaves count as arrays.

Refilling a JAX array:

- :func:`copyto_jax` copies any array into an existing JAX array's memory, through JAX's own
  buffer donation (:class:`DonationWarning` where JAX can't donate it).

Functions and autograd:

- :func:`torch_callable` makes a JAX function callable with torch tensors, torch autograd
  flowing through ``jax.vjp``; :class:`JaxModule` makes a JAX function with a parameter pytree a
  ``torch.nn.Module``.
- :func:`jax_callable` makes a torch function callable from JAX, under ``jax.jit``, ``jax.grad``
  and ``jax.vmap`` (``jax.custom_vjp`` over ``jax.pure_callback`` and ``torch.func.vjp``);
  :func:`module_to_jax` makes a torch module a pure JAX function of its parameters and buffers.

torch and JAX are imported only when a function needs them; numpy is needed only by
:func:`to_numpy` and the JAX paths. A function whose library is missing raises ImportError
naming the library and the pip command that installs it.
"""

from __future__ import annotations

from typing import Any

from ._convert import to_jax, to_numpy, to_torch
from ._jax import DtypeNarrowingWarning
from ._jax_calls_torch import jax_callable
from ._modules import module_to_jax
from ._pytree import is_array
from ._refill import DonationWarning, copyto_jax
from ._request import DeviceLike as DeviceLike
from ._torch_calls_jax import torch_callable

__all__ = [
    "DonationWarning",
    "DtypeNarrowingWarning",
    "JaxModule",  # noqa: F822 - created by the module's __getattr__, as it imports torch
    "copyto_jax",
    "is_array",
    "jax_callable",
    "module_to_jax",
    "to_jax",
    "to_numpy",
    "to_torch",
    "torch_callable",
]


def __getattr__(name: str) -> Any:
    # JaxModule subclasses torch.nn.Module: created on first use, so importing dlpack.interop
    # doesn't import torch.
    if name == "JaxModule":
        from ._modules import _jax_module_class

        cls = _jax_module_class()
        globals()["JaxModule"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
