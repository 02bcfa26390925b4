"""JAX functions called from torch, with torch autograd through jax.vjp."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._calls import _Arguments, _Call, _calling, _check_function, _Direction, _flatten_arguments
from ._convert import to_torch
from ._leaves import _array_to_torch, _leaf_to_jax
from ._pytree import _TORCH, _flatten, _unflatten
from ._request import _AS_IS, _Request
from ._torch import _conj_if_complex

if TYPE_CHECKING:
    import torch

# Tensors among the arguments stay tensors until it is known whether torch records gradients:
# then they become JAX arrays inside the torch.autograd.Function, or at once.
_TORCH_CALLS_JAX = _Direction(caller="torch", callee="jax", kept=(_TORCH,))


def torch_callable(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    has_aux: bool = False,
    share_outputs: bool = False,
) -> Any:
    """Make the JAX function ``fn`` callable with torch tensors, torch autograd flowing through.

    Use as ``torch_callable(fn)``, ``@torch_callable`` or ``@torch_callable(has_aux=True)``.
    Arguments and keyword arguments are any pytrees: array leaves become JAX arrays (tensors in
    place, see :func:`to_jax`), other leaves are passed as they are. The result may be any
    pytree; its array leaves come back as torch tensors. When torch records gradients and a
    floating-point tensor argument requires grad, the call is a ``torch.autograd.Function``
    whose backward runs ``jax.vjp``: gradients reach every such tensor, integer inputs get none,
    any gradient layout (non-contiguous, stride 0 from ``.sum()``) is accepted, complex
    gradients follow torch's convention. Differentiating twice raises. ``jax.jit`` the function
    yourself for speed.

    - ``has_aux=True``: ``fn`` returns ``(output, aux)``; ``aux`` is converted, not
      differentiated, and the call returns ``(output, aux)``.
    - ``share_outputs=False`` copies results and gradients into torch-owned memory, because JAX
      arrays are immutable and JAX may keep them (residuals, captured constants); ``True`` lends
      them in place: never write into those tensors.

    A tensor argument modified in place between the call and ``backward()`` makes backward
    raise (JAX kept a view of it), as torch does for its own saved tensors.
    """
    if fn is None:
        return functools.partial(torch_callable, has_aux=has_aux, share_outputs=share_outputs)
    _check_function("torch_callable", fn)
    return _calling(_call_jax_from_torch, fn, has_aux, share_outputs, "torch_callable")


class _JaxCall(_Call):
    """One call of a JAX function from torch: what forward learns and backward needs."""

    def __init__(
        self,
        fn: Callable[..., Any],
        arguments: _Arguments,
        tensor_positions: list[int],
        has_aux: bool,
        share_outputs: bool,
    ) -> None:
        super().__init__(fn, arguments)
        self.jax_leaves = arguments.leaves
        self.tensor_positions = tensor_positions
        self.has_aux = has_aux
        self.output_request = _Request(None, None, share_outputs)
        self.out_skeleton: Any = None
        self.out_meta: list[tuple[tuple[int, ...], Any]] = []
        self.aux: Any = None
        self.vjp_fn: Callable[[Any], Any] | None = None
        self.differentiated: list[int] = []
        self.input_meta: list[tuple[Any, Any]] = []

    def run(self, jax_leaves: list[Any]) -> tuple[list[Any], Any]:
        """Call the function on a full list of leaves: its output leaves (skeleton kept), aux."""
        output, aux = _split_aux(self._call_fn(jax_leaves), self.has_aux)
        self.out_skeleton, out_leaves, _ = _flatten(output)
        return out_leaves, aux


def _split_aux(result: Any, has_aux: bool) -> tuple[Any, Any]:
    if not has_aux:
        return result, None
    if not (isinstance(result, tuple | list) and len(result) == 2):
        raise TypeError("with has_aux=True the function must return a pair (output, aux)")
    return result[0], result[1]


def _call_jax_from_torch(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    has_aux: bool,
    share_outputs: bool,
    caller: str,
) -> Any:
    arguments = _flatten_arguments(_TORCH_CALLS_JAX, caller, args, kwargs)
    import torch

    jax_leaves = arguments.leaves  # the tensors among them still tensors: see _TORCH_CALLS_JAX
    tensor_positions = [i for i, kind in enumerate(arguments.kinds) if kind == _TORCH]
    tensors = [jax_leaves[i] for i in tensor_positions]
    call = _JaxCall(fn, arguments, tensor_positions, has_aux, share_outputs)
    records_grad = torch.is_grad_enabled() and any(
        t.requires_grad and (t.is_floating_point() or t.is_complex()) for t in tensors
    )
    if not records_grad:
        for position, tensor in zip(tensor_positions, tensors, strict=True):
            jax_leaves[position] = _leaf_to_jax(tensor, _TORCH, _AS_IS, arguments.x64)
        out_leaves, aux = call.run(jax_leaves)
        outputs = [_array_to_torch(leaf, call.output_request) for leaf in out_leaves]
        output = _unflatten(call.out_skeleton, outputs)
        if has_aux:
            return output, to_torch(aux, share_readonly=share_outputs)
        return output
    outputs = _jax_function_class().apply(call, *tensors)
    output = _unflatten(call.out_skeleton, list(outputs))
    return (output, call.aux) if has_aux else output


@functools.cache
def _jax_function_class() -> type[torch.autograd.Function]:
    """The torch.autograd.Function running a JAX function (defined once torch is imported)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    class JaxFunction(torch.autograd.Function):
        """Forward: the JAX function under ``jax.vjp``. Backward: the VJP it returned."""

        @staticmethod
        def forward(ctx: Any, call: _JaxCall, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
            ctx.set_materialize_grads(False)
            inputs = [_leaf_to_jax(t, _TORCH, _AS_IS, call.x64) for t in tensors]
            call.differentiated = [
                j
                for j, t in enumerate(tensors)
                if ctx.needs_input_grad[j + 1] and (t.is_floating_point() or t.is_complex())
            ]
            call.input_meta = [(t.dtype, t.device) for t in tensors]
            leaves = list(call.jax_leaves)
            for position, value in zip(call.tensor_positions, inputs, strict=True):
                leaves[position] = value

            def differentiable_part(*values: Any) -> Any:
                full = list(leaves)
                for j, value in zip(call.differentiated, values, strict=True):
                    full[call.tensor_positions[j]] = value
                out_leaves, aux = call.run(full)
                return (out_leaves, aux) if call.has_aux else out_leaves

            primals = [inputs[j] for j in call.differentiated]
            if call.has_aux:
                out_leaves, call.vjp_fn, aux = jax.vjp(differentiable_part, *primals, has_aux=True)
                call.aux = to_torch(aux, share_readonly=call.output_request.share_readonly)
            else:
                out_leaves, call.vjp_fn = jax.vjp(differentiable_part, *primals)
            call.out_meta = [(leaf.shape, leaf.dtype) for leaf in out_leaves]
            outputs = tuple(_array_to_torch(leaf, call.output_request) for leaf in out_leaves)
            ctx.mark_non_differentiable(
                *[out for out in outputs if not (out.is_floating_point() or out.is_complex())]
            )
            # Saved so that torch's version counters catch in-place writes before backward:
            # JAX's residuals may be views of these tensors.
            shared = outputs if call.output_request.share_readonly else ()
            ctx.save_for_backward(*tensors, *shared)
            ctx.call = call
            return outputs

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
            call: _JaxCall = ctx.call
            ctx.saved_tensors  # noqa: B018 - raises if a saved tensor was modified in place
            cotangents: list[Any] = []
            for grad, (shape, dtype) in zip(grads, call.out_meta, strict=True):
                if not jnp.issubdtype(dtype, jnp.inexact):
                    cotangents.append(np.zeros(shape, dtype=jax.dtypes.float0))
                elif grad is None:
                    cotangents.append(jnp.zeros(shape, dtype=dtype))
                else:
                    cotangent = _leaf_to_jax(grad, _TORCH, _AS_IS, call.x64)
                    if cotangent.dtype != dtype:
                        cotangent = cotangent.astype(dtype)
                    cotangents.append(_conj_if_complex(cotangent))
            assert call.vjp_fn is not None  # set by forward whenever backward can run
            input_grads = call.vjp_fn(cotangents)
            result: list[torch.Tensor | None] = [None] * len(call.input_meta)
            for j, grad in zip(call.differentiated, input_grads, strict=True):
                dtype, device = call.input_meta[j]
                tensor = _array_to_torch(_conj_if_complex(grad), call.output_request)
                result[j] = tensor.to(dtype=dtype, device=device)
            return (None, *result)

    return JaxFunction
