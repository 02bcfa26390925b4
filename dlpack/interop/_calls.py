"""What calling a function of one framework from the other does the same way in both directions
(torch functions from JAX in :mod:`._jax_calls_torch`, JAX functions from torch in
:mod:`._torch_calls_jax`): wrapping the function, turning a call's arguments into JAX leaves,
and calling the function on leaves in the arguments' structure."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

from ._jax import _x64_enabled
from ._leaves import _leaf_to_jax
from ._pytree import _flatten, _unflatten
from ._request import _AS_IS, _require


@dataclasses.dataclass(frozen=True)
class _Direction:
    """Code of ``caller`` calling a function of ``callee`` (``"torch"`` or ``"jax"``)."""

    caller: str
    callee: str
    # Leaf kinds the arguments' JAX leaves keep as they are (every other array leaf is converted).
    kept: tuple[int, ...]


def _check_function(public: str, fn: Any) -> None:
    if not callable(fn):
        raise TypeError(f"{public} wraps a function, not {type(fn).__name__}")


def _calling(call: Callable[..., Any], fn: Callable[..., Any], *options: Any) -> Callable[..., Any]:
    """``fn`` wrapped so that each call runs ``call(fn, args, kwargs, *options)``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return call(fn, args, kwargs, *options)

    return wrapper


class _Arguments(NamedTuple):
    """A call's arguments flattened (see :func:`_flatten_arguments`)."""

    skeleton: Any
    leaves: list[Any]  # JAX arrays, but for the kinds the direction keeps
    kinds: list[int]
    x64: bool


def _flatten_arguments(
    direction: _Direction, public: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> _Arguments:
    """The arguments of a call of ``public``, their array leaves as JAX arrays."""
    # The caller's library is the one named when both are missing.
    _require(direction.caller, public)
    _require(direction.callee, public)
    skeleton, leaves, kinds = _flatten((args, kwargs))
    x64 = _x64_enabled()
    jax_leaves = [
        leaf if kind in direction.kept else _leaf_to_jax(leaf, kind, _AS_IS, x64)
        for leaf, kind in zip(leaves, kinds, strict=True)
    ]
    return _Arguments(skeleton, jax_leaves, kinds, x64)


class _Call:
    """One call of a function of the other framework: the function, the skeleton of its
    arguments, and whether JAX holds 64-bit types."""

    def __init__(self, fn: Callable[..., Any], arguments: _Arguments) -> None:
        self.fn = fn
        self.skeleton = arguments.skeleton
        self.x64 = arguments.x64

    def _call_fn(self, leaves: list[Any]) -> Any:
        """The function called on ``leaves`` put back in its arguments' structure."""
        args, kwargs = _unflatten(self.skeleton, leaves)
        return self.fn(*args, **kwargs)
