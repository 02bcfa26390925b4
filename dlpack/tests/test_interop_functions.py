"""dlpack.interop's function and module wrappers against real torch and JAX, with gradients
checked against each framework's own autodiff, and parity with torch-jax-interop."""

from __future__ import annotations

import copy
import importlib
import pickle
import warnings

import pytest

from dlpack import interop
from dlpack.interop import (
    jax_callable,
    module_to_jax,
    to_jax,
    to_torch,
    torch_callable,
)

from ._helpers import need
from ._interop_helpers import Pair, held, jax_ptr, narrowing

np = need("numpy")
torch = need("torch")
jax = need("jax")
jnp = jax.numpy
check_grads = importlib.import_module("jax.test_util").check_grads


# ---------------------------------------------------------------------------------------------
# JAX functions from torch, torch autograd through jax.vjp
# ---------------------------------------------------------------------------------------------


class TestTorchCallable:
    def test_pytree_args_kwargs_and_outputs(self):
        @torch_callable
        def f(x, params, *, scale, label):
            assert label == "static"  # non-array leaves arrive as they are
            return {"y": jnp.sin(x) * params["w"] * scale, "count": params["n"] + 1}, label

        x = torch.randn(4, 3, requires_grad=True)
        w = torch.randn(3, requires_grad=True)
        n = torch.arange(3, dtype=torch.int32)
        out, label = f(x, {"w": w, "n": n}, scale=torch.tensor(2.0), label="static")
        assert label == "static" and out["count"].tolist() == [1, 2, 3]
        assert not out["count"].requires_grad
        out["y"].sum().backward()
        torch.testing.assert_close(x.grad, 2 * torch.cos(x) * w)
        torch.testing.assert_close(w.grad, 2 * torch.sin(x).sum(0))

    def test_integer_inputs_get_no_gradient(self):
        f = torch_callable(lambda x, idx: x[idx].sum())
        x = torch.randn(5, requires_grad=True)
        f(x, torch.tensor([0, 0, 3], dtype=torch.int32)).backward()
        assert x.grad.tolist() == pytest.approx([2.0, 0, 0, 1.0, 0])

    def test_gradcheck_float64(self, x64):
        f = torch_callable(lambda a, b: (jnp.tanh(a) @ b, jnp.exp(b).sum()))
        a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
        b = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(f, (a, b))

    def test_gradcheck_complex(self, x64):
        f = torch_callable(lambda z, r: jnp.sin(z) * jnp.conj(z) * r)
        z = torch.randn(3, dtype=torch.complex128, requires_grad=True)
        r = torch.randn(3, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(f, (z, r))

    def test_gradients_match_jax_grad(self):
        def loss(w, x):
            return jnp.sum(jnp.tanh(x @ w) ** 2)

        w, x = np.random.default_rng(0).standard_normal((2, 3, 3)).astype(np.float32)
        tw = torch.tensor(w, requires_grad=True)
        torch_callable(loss)(tw, torch.tensor(x)).backward()
        np.testing.assert_allclose(tw.grad.numpy(), jax.grad(loss)(w, x), rtol=1e-5)

    @pytest.mark.parametrize(
        "grad_output",
        [
            lambda: torch.ones(1).expand(3, 4),  # stride 0, as .sum() gives
            lambda: torch.arange(24.0).reshape(3, 8)[:, ::2],  # gaps
            lambda: torch.arange(12.0).reshape(4, 3).T,  # transposed
        ],
        ids=["stride0", "slice", "transposed"],
    )
    def test_any_gradient_layout(self, grad_output):
        f = torch_callable(lambda x: x * 3.0)
        x = torch.randn(3, 4, requires_grad=True)
        g = grad_output()
        f(x).backward(g)
        torch.testing.assert_close(x.grad, 3.0 * g)

    def test_has_aux(self):
        f = torch_callable(lambda x: (jnp.sum(x**2), {"mean": jnp.mean(x)}), has_aux=True)
        x = torch.arange(4.0, requires_grad=True)
        loss, aux = f(x)
        assert float(aux["mean"]) == 1.5 and not aux["mean"].requires_grad
        loss.backward()
        torch.testing.assert_close(x.grad, 2 * x.detach())

    def test_without_gradients_runs_plainly(self):
        f = torch_callable(lambda x: x + 1)
        with torch.no_grad():
            out = f(torch.ones(2, requires_grad=True))
        assert not out.requires_grad and out.tolist() == [2.0, 2.0]

    def test_outputs_are_copies_unless_shared(self):
        constant = jnp.arange(4.0)
        f = torch_callable(lambda x: constant)
        out = f(torch.ones(1))
        out.add_(10)  # must not reach JAX's immutable array
        assert constant.tolist() == [0.0, 1.0, 2.0, 3.0]
        shared = torch_callable(lambda x: constant, share_outputs=True)(torch.ones(1))
        assert shared.data_ptr() == jax_ptr(constant)

    def test_in_place_write_to_an_input_before_backward_raises(self):
        f = torch_callable(lambda x: jnp.sin(x))
        x = torch.randn(3, requires_grad=True)
        y = x * 1.0
        out = f(y)
        y.add_(1)  # JAX's residual is a view of y
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()

    def test_differentiating_twice_raises(self):
        f = torch_callable(lambda x: x**3)
        x = torch.randn(2, requires_grad=True)
        (g,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
        with pytest.raises(RuntimeError):
            g.sum().backward()

    @pytest.mark.parametrize("enable_x64", [False, True])
    def test_float64_gradients_keep_the_input_dtype(self, enable_x64):
        f = torch_callable(lambda x: x * 2)
        x = torch.ones(3, dtype=torch.float64, requires_grad=True)
        # Both modes, whichever this process runs in: narrowed without x64, kept with it.
        with jax.enable_x64(enable_x64):
            with narrowing("float64 became float32"):
                out = f(x)
            assert out.dtype == getattr(torch, held("float64"))
            out.sum().backward()
        assert x.grad.dtype == torch.float64 and x.grad.tolist() == [2.0, 2.0, 2.0]


class TestJaxModule:
    @staticmethod
    def linear(params, x):
        return x @ params["w"] + params["b"]

    def params(self):
        key = jax.random.key(0)
        return {"w": jax.random.normal(key, (3, 2)), "b": jnp.zeros(2)}

    def test_optimiser_step_leaves_the_callers_jax_params_alone(self):
        params = self.params()
        before = np.asarray(params["w"]).copy()
        module = interop.JaxModule(self.linear, params)
        optimiser = torch.optim.SGD(module.parameters(), lr=0.5)
        module(torch.randn(4, 3)).sum().backward()  # stride-0 gradient
        optimiser.step()
        np.testing.assert_array_equal(np.asarray(params["w"]), before)
        assert not np.array_equal(module.jax_params()["w"], before)

    def test_shared_params_on_request(self):
        params = self.params()
        module = interop.JaxModule(self.linear, params, copy_params=False)
        assert module.params_tree()["w"].data_ptr() == jax_ptr(params["w"])

    def test_structure_buffers_and_state_dict(self):
        params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2), "step": jnp.array(3)}
        module = interop.JaxModule(lambda p, x: x @ p["w"] + p["b"] * p["step"], params)
        assert [name for name, _ in module.named_parameters()] == ["params.0", "params.1"]
        tree = module.params_tree()
        assert list(tree) == ["w", "b", "step"] and not tree["step"].is_floating_point()
        assert set(module.state_dict()) == {"params.0", "params.1", "leaf_2"}
        assert isinstance(module, torch.nn.Module) and "fn=<lambda>" in repr(module)

    def test_gradients_match_jax_and_training_converges(self):
        params = self.params()
        x = torch.randn(16, 3)
        target = x @ torch.tensor([[1.0, -1.0], [0.5, 2.0], [0.0, 1.0]])
        module = interop.JaxModule(self.linear, params)
        loss = torch.nn.functional.mse_loss(module(x), target)
        loss.backward()

        def jax_loss(p):
            return jnp.mean((self.linear(p, to_jax(x)) - to_jax(target)) ** 2)

        expected = jax.grad(jax_loss)(params)
        np.testing.assert_allclose(module.params[0].grad.numpy(), expected["w"], rtol=1e-5)
        optimiser = torch.optim.Adam(module.parameters(), lr=0.1)
        for _ in range(60):
            optimiser.zero_grad()
            last = torch.nn.functional.mse_loss(module(x), target)
            last.backward()
            optimiser.step()
        assert last.item() < 0.05 * loss.item()

    def test_deepcopy_and_pickle(self):
        module = interop.JaxModule(self.linear, self.params())
        x = torch.randn(2, 3)
        for clone in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
            assert type(clone) is type(module)
            torch.testing.assert_close(clone(x), module(x))

    def test_has_aux(self):
        def fn(p, x):
            y = x @ p["w"]
            return y.sum(), {"y": y}

        module = interop.JaxModule(fn, self.params(), has_aux=True)
        loss, aux = module(torch.ones(2, 3))
        assert aux["y"].shape == (2, 2)
        loss.backward()
        assert module.params[0].grad.shape == (3, 2)


# ---------------------------------------------------------------------------------------------
# torch functions from JAX: eager, jit, grad, vmap
# ---------------------------------------------------------------------------------------------


@jax_callable
def torch_sin_product(x, y):
    return torch.sin(x) * y**2


class TestJaxCallable:
    x = jnp.linspace(0.0, 1.0, 5)
    y = jnp.linspace(1.0, 2.0, 5)

    def expected(self, x, y):
        return jnp.sin(x) * y**2

    def test_eager_and_jit(self):
        expected = self.expected(self.x, self.y)
        np.testing.assert_allclose(torch_sin_product(self.x, self.y), expected, rtol=1e-6)
        np.testing.assert_allclose(jax.jit(torch_sin_product)(self.x, self.y), expected, rtol=1e-6)

    def test_grad_eager_and_jit(self):
        def loss(fn):
            return lambda x, y: jnp.sum(fn(x, y) ** 2)

        expected = jax.grad(loss(self.expected), argnums=(0, 1))(self.x, self.y)
        for got in (
            jax.grad(loss(torch_sin_product), argnums=(0, 1))(self.x, self.y),
            jax.jit(jax.grad(loss(torch_sin_product), argnums=(0, 1)))(self.x, self.y),
        ):
            for g, e in zip(got, expected, strict=True):
                np.testing.assert_allclose(g, e, rtol=1e-5)

    def test_check_grads(self, x64):
        x, y = self.x.astype(jnp.float64), self.y.astype(jnp.float64)
        check_grads(torch_sin_product, (x, y), order=1, modes=["rev"])
        check_grads(jax.jit(torch_sin_product), (x, y), order=1, modes=["rev"])

    def test_vmap(self):
        xs = jnp.stack([self.x, 2 * self.x])
        out = jax.vmap(torch_sin_product, in_axes=(0, None))(xs, self.y)
        np.testing.assert_allclose(out, self.expected(xs, self.y), rtol=1e-6)
        grads = jax.vmap(jax.grad(lambda x: torch_sin_product(x, self.y).sum()))(xs)
        np.testing.assert_allclose(grads, jnp.cos(xs) * self.y**2, rtol=1e-5)

    def test_pytrees_static_leaves_and_integer_inputs(self):
        @jax_callable
        def f(inputs, *, power, index):
            x = inputs["x"] ** power
            return {"picked": x[index], "n": index.numel()}, "tag"

        inputs = {"x": self.x}
        index = jnp.array([0, 2, 2])

        def loss(inputs):
            (out, tag) = f(inputs, power=3, index=index)
            assert tag == "tag" and out["n"] == 3
            return out["picked"].sum()

        grad = jax.jit(jax.grad(loss))(inputs)["x"]
        expected = np.zeros(5, dtype=np.float32)
        expected[[0, 2]] = [1, 2]
        np.testing.assert_allclose(grad, expected * 3 * np.asarray(self.x) ** 2, rtol=1e-6)

    def test_several_outputs_with_an_integer_one(self):
        f = jax_callable(lambda x: (x * 2, torch.argmax(x)))

        def loss(x):
            doubled, index = f(x)
            return doubled[index]

        with narrowing("int64"):  # torch's argmax is int64
            assert jax.jit(jax.grad(loss))(self.x).tolist() == [0, 0, 0, 0, 2.0]

    def test_result_shape(self):
        f = jax_callable(
            lambda x: torch.nn.functional.pad(x, (1, 1)),
            result_shape=jax.ShapeDtypeStruct((7,), self.x.dtype),
        )
        assert jax.jit(f)(self.x).shape == (7,)
        g = jax_callable(
            lambda x: x[:2], result_shape=lambda x: jax.ShapeDtypeStruct((2,), x.dtype)
        )
        assert jax.jit(g)(self.x).tolist() == self.x[:2].tolist()

    def test_value_dependent_shapes_are_refused_under_jit(self):
        f = jax_callable(lambda x: x[x > 0.5])
        assert f(self.x).shape == (2,)  # eager: fine
        with pytest.raises(TypeError, match="result_shape"):
            jax.jit(f)(self.x)

    def test_writing_into_an_input_raises_unless_copied(self):
        def scale_in_place(x):
            return x.mul_(2)

        with pytest.raises(RuntimeError, match="copy_inputs=True"):
            jax_callable(scale_in_place)(jnp.ones(3))
        safe = jnp.ones(3)
        out = jax.jit(jax_callable(scale_in_place, copy_inputs=True))(safe)
        assert out.tolist() == [2.0] * 3 and safe.tolist() == [1.0] * 3

    @pytest.mark.parametrize("enable_x64", [False, True])
    def test_float64_outputs_narrow_with_a_warning_without_x64(self, enable_x64):
        f = jax_callable(lambda x: x.double())
        # Both modes, whichever this process runs in: narrowed without x64, kept with it.
        with jax.enable_x64(enable_x64):
            x = jnp.linspace(0.0, 1.0, 5)
            with narrowing("float64 became float32"):
                out = jax.jit(f)(x)
            assert out.dtype == held("float64")
            assert out.tolist() == x.tolist()

    def test_complex_gradients_follow_jax(self):
        z = jnp.array([1 + 2j, -0.5 + 1j], dtype=jnp.complex64)

        def loss(fn):
            return lambda z: jnp.sum(jnp.abs(fn(z)) ** 2)

        ours = jax.grad(loss(jax_callable(torch.sin)))(z)
        np.testing.assert_allclose(ours, jax.grad(loss(jnp.sin))(z), rtol=1e-5)

    def test_bad_options(self):
        with pytest.raises(ValueError, match="vmap_method"):
            jax_callable(torch.sin, vmap_method="legacy")
        with pytest.raises(TypeError, match="wraps a function"):
            jax_callable(3)


class TestModuleToJax:
    def test_linear_values_and_gradients_match_torch(self):
        torch.manual_seed(0)
        module = torch.nn.Linear(3, 2)
        apply, state = module_to_jax(module)
        assert list(state) == ["weight", "bias"]
        x = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
        tx = torch.tensor(x, requires_grad=True)
        (module(tx) ** 2).sum().backward()

        def loss(state, x):
            return jnp.sum(apply(state, x) ** 2)

        for grad_fn in (jax.grad(loss, argnums=(0, 1)), jax.jit(jax.grad(loss, argnums=(0, 1)))):
            grad_state, grad_x = grad_fn(state, x)
            np.testing.assert_allclose(grad_state["weight"], module.weight.grad, rtol=1e-5)
            np.testing.assert_allclose(grad_state["bias"], module.bias.grad, rtol=1e-5)
            np.testing.assert_allclose(grad_x, tx.grad, rtol=1e-5)

    def test_batchnorm_in_eval_mode(self):
        torch.manual_seed(0)
        module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
        module.train()
        module(torch.randn(32, 3))  # running statistics away from their defaults
        module.eval()
        with narrowing("int64"):  # num_batches_tracked
            apply, state = module_to_jax(module)
        assert "1.running_mean" in state and "1.running_var" in state
        x = jnp.ones((2, 3), jnp.float32)  # the module's dtype, in either mode
        expected = module(torch.ones(2, 3)).detach().numpy()
        np.testing.assert_allclose(apply(state, x), expected, rtol=1e-5)
        np.testing.assert_allclose(jax.jit(apply)(state, x), expected, rtol=1e-5)
        grads = jax.jit(jax.grad(lambda s: apply(s, x).sum(), allow_int=True))(state)
        assert grads["0.weight"].shape == (4, 3)
        assert not np.any(grads["1.running_mean"])  # buffers are constants, as in torch

    def test_impure_training_modes_are_refused(self):
        with pytest.raises(ValueError, match="running statistics"):
            module_to_jax(torch.nn.BatchNorm1d(3))
        dropout = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
        with pytest.raises(ValueError, match="random numbers"):
            module_to_jax(dropout)
        apply, state = module_to_jax(dropout.eval())
        dropout.train()  # switched back after wrapping: refused at the call
        with pytest.raises(ValueError, match="random numbers"):
            apply(state, jnp.ones((1, 2)))

    def test_vmap_over_inputs_and_over_stacked_states(self):
        module = torch.nn.Linear(3, 2)
        apply, state = module_to_jax(module)
        xs = jnp.arange(12.0, dtype=jnp.float32).reshape(4, 3)  # the module's dtype
        per_example = jax.vmap(apply, in_axes=(None, 0))(state, xs)
        expected = module(to_torch(xs)).detach()
        np.testing.assert_allclose(per_example, expected, rtol=1e-6)
        stacked = jax.tree.map(lambda v: jnp.stack([v, 2 * v]), state)
        ensemble = jax.jit(jax.vmap(apply, in_axes=(0, None)))(stacked, xs)
        np.testing.assert_allclose(ensemble[1], 2 * per_example, rtol=1e-6)

    def test_state_is_a_snapshot_unless_shared(self):
        module = torch.nn.Linear(2, 2)
        _, snapshot = module_to_jax(module)
        _, shared = module_to_jax(module, copy=False)
        with torch.no_grad():
            module.weight.add_(1.0)
        np.testing.assert_array_equal(shared["weight"], module.weight.detach())
        assert not np.array_equal(snapshot["weight"], module.weight.detach())

    def test_not_a_module(self):
        with pytest.raises(TypeError, match="torch.nn.Module"):
            module_to_jax(lambda x: x)


# ---------------------------------------------------------------------------------------------
# Parity with torch-jax-interop on the cases it gets right
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tji():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return need("torch_jax_interop", "torch-jax-interop")


class TestParityWithTorchJaxInterop:
    def test_single_arrays_and_string_keyed_dicts(self, tji):
        tree = {"x": torch.randn(5), "y": torch.arange(5, dtype=torch.int32)}
        theirs, ours = tji.torch_to_jax(tree), to_jax(tree)
        for key in tree:
            np.testing.assert_array_equal(theirs[key], ours[key])
            assert theirs[key].dtype == ours[key].dtype
        back_theirs, back_ours = tji.jax_to_torch(theirs), to_torch(ours)
        for key in tree:
            assert torch.equal(back_theirs[key], back_ours[key])

    def test_wrapped_jax_function_gradients(self, tji):
        def fn(params, x):
            return jnp.tanh(x @ params["w"] + params["b"])

        params = {"w": jax.random.normal(jax.random.key(1), (3, 2)), "b": jnp.ones(2)}
        x = torch.randn(4, 3)
        theirs = tji.WrappedJaxFunction(fn, params, clone_params=True)
        ours = interop.JaxModule(fn, params)
        out_theirs, out_ours = theirs(x), ours(x)
        torch.testing.assert_close(out_theirs, out_ours)
        (out_theirs**2).mean().backward()  # not .sum(): its stride-0 gradient crashes theirs
        (out_ours**2).mean().backward()
        # Theirs holds the leaves in JAX's order (sorted keys), ours in the dict's order.
        theirs_by_name = jax.tree.unflatten(jax.tree.structure(params), list(theirs.parameters()))
        for name, p_ours in ours.params_tree().items():
            torch.testing.assert_close(theirs_by_name[name].grad, p_ours.grad)

    def test_torch_module_to_jax_gradients(self, tji):
        module = torch.nn.Linear(3, 2)
        fn_theirs, params_theirs = tji.torch_module_to_jax(module, example_output=torch.zeros(4, 2))
        apply, state = module_to_jax(module)
        x = jnp.ones((4, 3), jnp.float32)  # the module's dtype, in either mode
        np.testing.assert_allclose(fn_theirs(params_theirs, x), apply(state, x), rtol=1e-6)
        grads_theirs = jax.jit(jax.grad(lambda p: fn_theirs(p, x).sum()))(params_theirs)
        grads_ours = jax.jit(jax.grad(lambda s: apply(s, x).sum()))(state)
        np.testing.assert_allclose(grads_theirs[0], grads_ours["weight"], rtol=1e-6)
        np.testing.assert_allclose(grads_theirs[1], grads_ours["bias"], rtol=1e-6)

    def test_namedtuples(self, tji):
        pair = Pair(torch.ones(2), torch.arange(3, dtype=torch.int32))
        theirs, ours = tji.torch_to_jax(pair), to_jax(pair)
        assert type(theirs) is type(ours) is Pair
        check = np.testing.assert_array_equal
        check(theirs.first, ours.first)
        check(theirs.second, ours.second)

    def test_function_decorators_without_tracing(self, tji):
        def jax_fn(x):
            return jnp.sin(x) + 1

        def torch_fn(x):
            return torch.cos(x) * 2

        x = torch.linspace(0, 1, 5)
        torch.testing.assert_close(tji.jax_to_torch(jax_fn)(x), torch_callable(jax_fn)(x))
        xj = jnp.linspace(0, 1, 5)
        np.testing.assert_allclose(tji.torch_to_jax(torch_fn)(xj), jax_callable(torch_fn)(xj))
