"""torch functions called from JAX: jax.custom_vjp over jax.pure_callback and torch.func.vjp."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._calls import _Arguments, _Call, _calling, _check_function, _Direction, _flatten_arguments
from ._jax import (
    _X32_NARROWING,
    DtypeNarrowingWarning,
    _jax_dtype,
    _narrowing_message,
    _warn_from_caller,
)
from ._leaves import _array_to_torch, _leaf_to_jax, _leaf_to_numpy
from ._pytree import _JAX, _TORCH, _TRACER, _flatten, _leaf_paths, _unflatten
from ._request import _AS_IS, _HOST, DeviceLike, _loaded, _parse_device, _Request
from ._torch import _conj_if_complex, _torch_device, _torch_dtype

if TYPE_CHECKING:
    import torch


_VMAP_METHODS = ("sequential", "sequential_unrolled", "expand_dims", "broadcast_all")

# JAX arrays and tracers among the arguments go to jax.custom_vjp as they are.
_JAX_CALLS_TORCH = _Direction(caller="jax", callee="torch", kept=(_JAX, _TRACER))


@dataclasses.dataclass(frozen=True)
class _TorchCallOptions:
    """How a torch function runs for JAX (see :func:`jax_callable`)."""

    result_shape: Any
    device: tuple[int, int] | None
    vmap_method: str
    copy_inputs: bool
    check: Callable[[], None] | None = None  # raises before a call that can't be pure


def jax_callable(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    result_shape: Any = None,
    device: DeviceLike = None,
    vmap_method: str = "sequential",
    copy_inputs: bool = False,
) -> Any:
    """Make the torch function ``fn`` callable from JAX, also under jit, grad and vmap.

    Use as ``jax_callable(fn)``, ``@jax_callable`` or ``@jax_callable(device="cuda")``.
    Arguments are any pytrees; array leaves reach ``fn`` as torch tensors (JAX's memory lent in
    place), other leaves as they are. The result may be any pytree of tensors and other values;
    its tensors come back as JAX arrays (copies: JAX arrays are immutable). Called with
    concrete arrays, ``fn`` runs at once; under a JAX transformation it runs in
    ``jax.pure_callback``. It is a ``jax.custom_vjp`` whose backward pass calls
    ``torch.func.vjp`` (recomputing the forward pass, so ``fn`` must be deterministic), only
    for the floating-point inputs JAX differentiates; integer inputs get no gradient.

    - ``result_shape``: the output's shapes and dtypes for tracing (a pytree of
      ``jax.ShapeDtypeStruct`` or arrays, or a function of the call's arguments returning one).
      By default they are found by running ``fn`` on torch fake tensors (no computation);
      where that fails, tracing raises TypeError asking for ``result_shape``.
    - ``device``: where ``fn`` computes (e.g. ``"cuda"``); default the CPU.
    - ``vmap_method``: passed to ``jax.pure_callback``. ``"sequential"`` (default) calls ``fn``
      once per batch element, which is always right; ``"expand_dims"`` or ``"broadcast_all"``
      call it once on the batch, which is right only if ``fn`` treats a leading dimension as a
      batch.
    - ``copy_inputs=True`` hands ``fn`` copies; by default, a function writing into its
      arguments raises RuntimeError (torch's version counters tell), and the JAX array it was
      lent then holds what was written.
    """
    if fn is None:
        return functools.partial(
            jax_callable,
            result_shape=result_shape,
            device=device,
            vmap_method=vmap_method,
            copy_inputs=copy_inputs,
        )
    _check_function("jax_callable", fn)
    options = _torch_call_options(result_shape, device, vmap_method, copy_inputs)
    return _torch_function_for_jax(fn, options)


def _torch_call_options(
    result_shape: Any,
    device: DeviceLike,
    vmap_method: str,
    copy_inputs: bool,
    check: Callable[[], None] | None = None,
) -> _TorchCallOptions:
    if vmap_method not in _VMAP_METHODS:
        raise ValueError(f"vmap_method must be one of {_VMAP_METHODS}, not {vmap_method!r}")
    if type(copy_inputs) is not bool:
        raise TypeError("copy_inputs must be True or False")
    return _TorchCallOptions(result_shape, _parse_device(device), vmap_method, copy_inputs, check)


def _torch_function_for_jax(fn: Callable[..., Any], options: _TorchCallOptions) -> Any:
    return _calling(_call_torch_from_jax, fn, options)


def _call_torch_from_jax(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    options: _TorchCallOptions,
) -> Any:
    arguments = _flatten_arguments(_JAX_CALLS_TORCH, "jax_callable", args, kwargs)
    import jax

    arrays = arguments.leaves
    run = _TorchRun(fn, arguments, options, args, kwargs)
    if not arrays:  # nothing to trace or differentiate
        outputs = run.primal([])
        return _unflatten(run.out_skeleton, outputs)

    @jax.custom_vjp
    def torch_function(*values: Any) -> list[Any]:
        return run.primal(list(values))

    torch_function.defvjp(run.forward_rule, run.backward_rule, symbolic_zeros=True)
    outputs = torch_function(*arrays)
    return _unflatten(run.out_skeleton, list(outputs))


class _TorchRun(_Call):
    """One call of a torch function from JAX: the primal, its VJP rules and the host callbacks."""

    def __init__(
        self,
        fn: Callable[..., Any],
        arguments: _Arguments,
        options: _TorchCallOptions,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        super().__init__(fn, arguments)
        self.options = options
        self.args = args
        self.kwargs = kwargs
        self.out_skeleton: Any = None
        self.out_specs: list[Any] = []  # jax.ShapeDtypeStruct of each output array, as JAX has it
        self.perturbed: list[bool] | None = None
        # JAX's memory is lent to the function (read-only sources shared): it must not write.
        self.input_request = _Request(
            options.device or _HOST, True if options.copy_inputs else None, True
        )

    # -- the JAX side ------------------------------------------------------------------------

    def primal(self, values: list[Any]) -> list[Any]:
        """The outputs' arrays: computed now for concrete inputs, else by a host callback."""
        import jax

        if any(isinstance(value, jax.core.Tracer) for value in values):
            self._trace_output_specs(values)
            outputs = jax.pure_callback(
                self._host_forward,
                self.out_specs,
                *values,
                vmap_method=self.options.vmap_method,
            )
            return list(outputs)
        out_skeleton, leaves, kinds = self._run_forward(values)
        # JAX owns its results: copies, placed on the inputs' device.
        target = _parse_device(next(iter(values[0].devices()))) if values else None
        request = _Request(target, True, False)
        outputs = [
            _leaf_to_jax(leaf, kind, request, self.x64)
            for leaf, kind in zip(leaves, kinds, strict=True)
        ]
        self.out_skeleton = out_skeleton
        self.out_specs = [_shape_dtype_struct(output.shape, output.dtype) for output in outputs]
        if self.options.result_shape is not None:
            # Called eagerly, the outputs must be what tracing would have declared.
            declared_skeleton, declared = self._declared_specs(warn=False)
            self._check_outputs(
                [(tuple(output.shape), _dtype_name(output.dtype)) for output in outputs],
                declared,
                declared_skeleton,
            )
        return outputs

    def forward_rule(self, *primals: Any) -> tuple[list[Any], list[Any]]:
        """custom_vjp's forward: the outputs, with the inputs kept as residuals."""
        values = [primal.value for primal in primals]
        perturbed = [bool(primal.perturbed) for primal in primals]
        if self.perturbed is not None:  # traced again (remat, nested transforms): union
            perturbed = [a or b for a, b in zip(self.perturbed, perturbed, strict=True)]
        self.perturbed = perturbed
        return self.primal(values), values

    def backward_rule(self, values: list[Any], cotangents: list[Any]) -> tuple[Any, ...]:
        """custom_vjp's backward: torch.func.vjp for the perturbed floating-point inputs."""
        import jax
        import jax.numpy as jnp
        from jax.custom_derivatives import SymbolicZero

        perturbed = self.perturbed or [True] * len(values)
        wanted = [
            i
            for i, value in enumerate(values)
            if perturbed[i] and jnp.issubdtype(value.dtype, jnp.inexact)
        ]
        live = [
            i
            for i, spec in enumerate(self.out_specs)
            if jnp.issubdtype(spec.dtype, jnp.inexact)
            and not isinstance(cotangents[i], SymbolicZero)
        ]
        grads: list[Any] = [None] * len(values)
        if not wanted or not live:
            return tuple(grads)
        operands = [*values, *(cotangents[i] for i in live)]
        if any(isinstance(operand, jax.core.Tracer) for operand in operands):
            computed = jax.pure_callback(
                functools.partial(self._host_backward, wanted, live),
                [_shape_dtype_struct(values[i].shape, values[i].dtype) for i in wanted],
                *operands,
                vmap_method=self.options.vmap_method,
            )
        else:
            target = _parse_device(next(iter(values[0].devices())))
            request = _Request(target, True, False)
            computed = [
                _leaf_to_jax(grad, _TORCH, request, self.x64)
                for grad in self._torch_vjp(wanted, live, operands)
            ]
        for i, grad in zip(wanted, computed, strict=True):
            grads[i] = grad
        return tuple(grads)

    def _trace_output_specs(self, values: list[Any]) -> None:
        """Shapes and dtypes of the outputs, for pure_callback: given, or found with torch."""
        if self.options.result_shape is None:
            shapes = self._infer_output_shapes(values)
            self.out_skeleton, self.out_specs = self._specs_of(shapes, warn=True)
        else:
            self.out_skeleton, self.out_specs = self._declared_specs(warn=True)

    def _declared_specs(self, warn: bool) -> tuple[Any, list[Any]]:
        """The skeleton and the specs ``result_shape`` declares for this call."""
        shapes = self.options.result_shape
        if callable(shapes):
            shapes = shapes(*self.args, **self.kwargs)
        return self._specs_of(shapes, warn)

    def _specs_of(self, shapes: Any, warn: bool) -> tuple[Any, list[Any]]:
        """The skeleton of a tree of shapes and dtypes, and its leaves as JAX will hold them
        (64-bit types narrowed without x64, with a warning when ``warn``)."""
        skeleton, leaves, _ = _flatten(shapes)
        specs = []
        for leaf in leaves:
            name = _dtype_name(leaf.dtype)
            narrowed = None if self.x64 else _X32_NARROWING.get(name)
            if narrowed is not None:
                if warn:
                    _warn_from_caller(_narrowing_message(name, narrowed), DtypeNarrowingWarning)
                name = narrowed
            specs.append(_shape_dtype_struct(tuple(leaf.shape), name))
        return skeleton, specs

    def _check_outputs(
        self, returned: list[tuple[tuple[int, ...], str]], specs: list[Any], skeleton: Any
    ) -> None:
        """RuntimeError (as jax.pure_callback raises) unless the outputs returned are the
        arrays ``specs`` declares: their number, and each one's shape and dtype."""
        name = getattr(self.fn, "__name__", repr(self.fn))
        if len(returned) != len(specs):
            raise RuntimeError(
                f"the torch function {name} returned {len(returned)} arrays, but result_shape "
                f"declares {len(specs)}"
            )
        for index, ((shape, dtype), spec) in enumerate(zip(returned, specs, strict=True)):
            declared = _dtype_name(spec.dtype)
            if shape == tuple(spec.shape) and dtype == declared:
                continue
            path = _leaf_paths(skeleton)[index]
            raise RuntimeError(
                f"the torch function {name} returned {dtype} of shape {shape} as output "
                f"{path}, but result_shape declares {declared} of shape {tuple(spec.shape)} "
                "(nothing is cast or reshaped: fix the function or result_shape)"
            )

    def _infer_output_shapes(self, values: list[Any]) -> Any:
        """Run the function on torch fake tensors: shapes and dtypes, no computation.

        No fallback on real values: an output whose shape depends on values (``x[x > 0]``)
        would get the shape of whatever values were tried, silently.
        """
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode

        device = _torch_device(self.options.device or _HOST)
        try:
            with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
                fakes = [
                    torch.empty(
                        value.shape, dtype=_torch_dtype(_dtype_name(value.dtype)), device=device
                    )
                    for value in values
                ]
                return self._call(fakes)
        except Exception as error:
            raise TypeError(
                f"can't find the output shapes of {getattr(self.fn, '__name__', self.fn)} for "
                f"tracing by running it on torch fake tensors ({error!r}); pass result_shape= "
                "to jax_callable (outputs whose shapes depend on values can't be traced at all)"
            ) from error

    # -- the torch side (runs in host callbacks, or at once for concrete arrays) --------------

    def _call(self, tensors: list[Any]) -> Any:
        if self.options.check is not None:
            self.options.check()
        return self._call_fn(tensors)

    def _torch_inputs(self, arrays: list[Any] | tuple[Any, ...]) -> list[torch.Tensor]:
        return [_array_to_torch(array, self.input_request) for array in arrays]

    def _check_untouched(self, tensors: list[torch.Tensor], versions: list[int]) -> None:
        if self.options.copy_inputs:
            return  # the function had copies, to write into as it likes
        for index, (tensor, version) in enumerate(zip(tensors, versions, strict=True)):
            if tensor._version != version:
                raise RuntimeError(
                    f"the torch function wrote into its array argument #{index} in place; its "
                    "memory belongs to a JAX array, which now holds what was written. Pass "
                    "copy_inputs=True for functions that write into their arguments"
                )

    def _run_forward(self, values: list[Any] | tuple[Any, ...]) -> tuple[Any, list[Any], list[Any]]:
        import torch

        tensors = self._torch_inputs(values)
        versions = [tensor._version for tensor in tensors]
        with torch.no_grad():
            result = self._call(tensors)
        self._check_untouched(tensors, versions)
        return _flatten(result)

    def _host_forward(self, *values: Any) -> list[Any]:
        """pure_callback's forward: host arrays matching the traced output specs."""
        _, leaves, kinds = self._run_forward(values)
        arrays = [
            _leaf_to_numpy(leaf, kind, _AS_IS) for leaf, kind in zip(leaves, kinds, strict=True)
        ]
        # Without x64, 64-bit results narrow to what JAX holds (tracing warned); nothing else
        # is cast.
        returned = [(array.shape, self._as_held(_dtype_name(array.dtype))) for array in arrays]
        self._check_outputs(returned, self.out_specs, self.out_skeleton)
        return [
            array if array.dtype == spec.dtype else array.astype(spec.dtype)
            for array, spec in zip(arrays, self.out_specs, strict=True)
        ]

    def _as_held(self, name: str) -> str:
        """The dtype JAX holds for arrays of dtype ``name`` (64-bit types narrowed without x64)."""
        return name if self.x64 else _X32_NARROWING.get(name, name)

    def _host_backward(self, wanted: list[int], live: list[int], *operands: Any) -> list[Any]:
        """pure_callback's backward: host arrays of the wanted inputs' gradients."""
        grads = self._torch_vjp(wanted, live, list(operands))
        return [
            _host_result(grad, _shape_dtype_struct(operands[i].shape, operands[i].dtype))
            for i, grad in zip(wanted, grads, strict=True)
        ]

    def _torch_vjp(self, wanted: list[int], live: list[int], operands: list[Any]) -> list[Any]:
        """Gradients of the wanted inputs for the live outputs' cotangents (torch.func.vjp)."""
        import torch

        count = len(operands) - len(live)
        tensors = self._torch_inputs(operands[:count])
        cotangents = [_conj_if_complex(tensor) for tensor in self._torch_inputs(operands[count:])]
        versions = [tensor._version for tensor in tensors]
        expected = [_torch_dtype(_dtype_name(self.out_specs[i].dtype)) for i in live]

        def live_outputs(*differentiated: torch.Tensor) -> tuple[torch.Tensor, ...]:
            full = list(tensors)
            for i, tensor in zip(wanted, differentiated, strict=True):
                full[i] = tensor
            _, leaves, _ = _flatten(self._call(full))
            outputs = [leaves[i] for i in live]
            return tuple(
                out if out.dtype == dtype else out.to(dtype)
                for out, dtype in zip(outputs, expected, strict=True)
            )

        vjp_fn = torch.func.vjp(live_outputs, *[tensors[i] for i in wanted])[1]
        grads = vjp_fn(tuple(cotangents))
        self._check_untouched(tensors, versions)
        return [
            torch.zeros_like(tensors[i]) if grad is None else _conj_if_complex(grad)
            for i, grad in zip(wanted, grads, strict=True)
        ]


def _dtype_name(dtype: Any) -> str:
    """The name DLPackObject.dtype uses for a torch, numpy or JAX dtype."""
    torch = _loaded("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    import jax.numpy as jnp

    return jnp.dtype(dtype).name


def _shape_dtype_struct(shape: tuple[int, ...], dtype: Any) -> Any:
    import jax

    return jax.ShapeDtypeStruct(tuple(shape), _jax_dtype(_dtype_name(dtype)))


def _host_result(grad: Any, spec: Any) -> Any:
    """A gradient as the host array pure_callback expects (its input's shape and dtype)."""
    array = _leaf_to_numpy(grad, _TORCH, _AS_IS)
    if array.shape != spec.shape:
        raise RuntimeError(
            f"the torch function returned shape {array.shape} where tracing found {spec.shape}"
        )
    return array if array.dtype == spec.dtype else array.astype(spec.dtype)
