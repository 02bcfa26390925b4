"""torch modules as pure JAX functions (module_to_jax), and JAX functions with parameters as
torch modules (JaxModule)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ._calls import _check_function
from ._convert import to_jax
from ._jax_calls_torch import _torch_call_options, _torch_function_for_jax
from ._leaves import _leaf_to_torch
from ._pytree import _flatten, _unflatten
from ._request import DeviceLike, _check_copy_argument, _Request, _require
from ._torch_calls_jax import _call_jax_from_torch

if TYPE_CHECKING:
    import jax
    import torch


def module_to_jax(
    module: torch.nn.Module,
    *,
    copy: bool = True,
    device: DeviceLike = None,
    vmap_method: str = "sequential",
    copy_inputs: bool = False,
) -> tuple[Callable[..., Any], dict[str, jax.Array]]:
    """A torch module as a pure JAX function: ``apply, state = module_to_jax(module)``.

    ``state`` is a dict of the module's parameters and buffers by their names (as in
    ``module.state_dict()``), as JAX arrays; ``apply(state, *args, **kwargs)`` runs the module
    with them (``torch.func.functional_call``) through :func:`jax_callable`, so it works under
    ``jax.jit``, ``jax.grad`` (with respect to the state and the inputs) and ``jax.vmap``. A
    ``state`` with only some of the names uses the module's own tensors for the others.
    Buffers are constants of the function, as in torch: their gradients are zero.

    The module must compute a pure function: Dropout (p > 0) or BatchNorm tracking running
    statistics in training mode raise ValueError, at wrapping and at each call; ``module.eval()``
    first. (BatchNorm in eval mode, and every module without such state, work.)

    - ``copy=True`` (default) makes ``state`` a snapshot; ``False`` shares the module's memory,
      so later in-place updates of the module (an optimiser step) show through.
    - ``device``: where the module computes (default: where its first parameter or buffer is).
    - ``vmap_method``, ``copy_inputs``: as for :func:`jax_callable`.
    """
    _require("torch", "module_to_jax")
    _require("jax", "module_to_jax")
    import torch

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module_to_jax needs a torch.nn.Module, not {type(module).__name__}")
    _check_copy_argument(copy)
    _check_pure_module(module)
    tensors: dict[str, torch.Tensor] = dict(module.named_parameters())
    tensors.update(module.named_buffers())
    state = to_jax(tensors, copy=copy)
    if device is None:
        first = next(iter(tensors.values()), None)
        device = first.device if first is not None else "cpu"

    def run_module(state: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        return torch.func.functional_call(module, state, args, kwargs)

    options = _torch_call_options(
        None, device, vmap_method, copy_inputs, functools.partial(_check_pure_module, module)
    )
    run_for_jax = _torch_function_for_jax(run_module, options)
    buffer_names = frozenset(dict(module.named_buffers()))

    def apply(state: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        import jax

        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict of arrays by name, not {type(state).__name__}")
        # Buffers are constants of the function, as in torch, where they never get gradients
        # (and some ops, such as batch norm's running statistics, can't give them any).
        constants = {
            name: jax.lax.stop_gradient(value) if name in buffer_names else value
            for name, value in state.items()
        }
        return run_for_jax(constants, *args, **kwargs)

    apply.__name__ = apply.__qualname__ = f"{type(module).__name__}_as_jax"
    return apply, state


def _check_pure_module(module: torch.nn.Module) -> None:
    """Refuse modules whose forward pass is not a function of parameters, buffers and inputs."""
    import torch

    for name, sub in module.named_modules():
        if not sub.training:
            continue
        what = f"{name or 'the module'} ({type(sub).__name__}) in training mode"
        if isinstance(sub, torch.nn.modules.dropout._DropoutNd) and sub.p > 0:
            raise ValueError(
                f"{what} draws random numbers, so the backward pass (which recomputes the "
                "forward pass) would see other values; call module.eval() first"
            )
        if isinstance(sub, torch.nn.modules.batchnorm._NormBase) and sub.track_running_stats:
            raise ValueError(
                f"{what} updates its running statistics in place, which a JAX function can't; "
                "call module.eval() first"
            )


_jax_module: type | None = None
# functools.cache would let two threads asking at once each define a class (the definition runs
# Python code, so another thread may run meanwhile, with or without a GIL): JaxModule must be one.
_jax_module_lock = threading.Lock()


def _jax_module_class() -> type:
    """The JaxModule class (a torch.nn.Module, so it is defined once torch is imported), the
    same for every caller."""
    global _jax_module
    with _jax_module_lock:
        if _jax_module is None:
            _jax_module = _define_jax_module()
        return _jax_module


def _define_jax_module() -> type:
    _require("torch", "JaxModule")
    import torch

    class JaxModule(torch.nn.Module):
        """A JAX function with a parameter pytree, as a ``torch.nn.Module``.

        ``JaxModule(fn, params)`` holds ``params`` (any pytree of arrays) as torch parameters
        (floating-point and complex leaves, in ``self.params``) and buffers (other array
        leaves); ``module(*args, **kwargs)`` computes ``fn(params, *args, **kwargs)`` through
        :func:`torch_callable`, so gradients reach the parameters and the inputs.

        - ``copy_params=True`` (default) copies ``params``: an optimiser step updates the
          module's tensors, never the caller's (immutable) JAX arrays. ``False`` shares them,
          and the optimiser then writes into the JAX arrays' memory.
        - ``has_aux=True``: ``fn`` returns ``(output, aux)`` and so does the module.
        - ``share_outputs``: as for :func:`torch_callable`.

        ``params_tree()`` gives the current parameters in ``params``' structure (torch),
        ``jax_params()`` a JAX copy of them.
        """

        def __init__(
            self,
            fn: Callable[..., Any],
            params: Any,
            *,
            has_aux: bool = False,
            copy_params: bool = True,
            share_outputs: bool = False,
        ) -> None:
            super().__init__()
            _check_function("JaxModule", fn)
            if type(copy_params) is not bool:
                raise TypeError("copy_params must be True or False")
            skeleton, leaves, kinds = _flatten(params)
            request = _Request(None, True if copy_params else None, not copy_params)
            parameters: list[torch.nn.Parameter] = []
            self._skeleton = skeleton
            # a parameter's index in self.params, or a buffer's name
            self._leaf_places: list[int | str] = []
            for index, (leaf, kind) in enumerate(zip(leaves, kinds, strict=True)):
                tensor = _leaf_to_torch(leaf, kind, request)
                if tensor.is_floating_point() or tensor.is_complex():
                    self._leaf_places.append(len(parameters))
                    parameters.append(torch.nn.Parameter(tensor))
                else:
                    name = f"leaf_{index}"
                    self.register_buffer(name, tensor)
                    self._leaf_places.append(name)
            self.params = torch.nn.ParameterList(parameters)
            self.fn = fn
            self.has_aux = has_aux
            self.share_outputs = share_outputs

        def params_tree(self) -> Any:
            """The current parameters and buffers, in the structure ``params`` had."""
            values = [
                self.params[place] if isinstance(place, int) else getattr(self, place)
                for place in self._leaf_places
            ]
            return _unflatten(self._skeleton, values)

        def jax_params(self) -> Any:
            """A JAX copy of :meth:`params_tree` (to hand the trained values back to JAX)."""
            return to_jax(self.params_tree(), copy=True)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            arguments = (self.params_tree(), *args)
            return _call_jax_from_torch(
                self.fn, arguments, kwargs, self.has_aux, self.share_outputs, "JaxModule"
            )

        def extra_repr(self) -> str:
            return f"fn={getattr(self.fn, '__name__', self.fn)!s}, has_aux={self.has_aux}"

    # Where pickle finds the class: dlpack.interop.JaxModule (through the package's __getattr__).
    JaxModule.__module__ = __name__.rpartition(".")[0]
    JaxModule.__qualname__ = "JaxModule"
    return JaxModule
