"""torch <-> JAX interop under careless inputs: results that are not what ``result_shape``
declares, trees deeper than Python's recursion limit or holding themselves, torch nested
tensors, and where warnings point."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

import dlpack
from dlpack import interop

from ._helpers import need, run_python

torch = need("torch")
jax = need("jax")
jnp = jax.numpy


def declared(shape, dtype):
    return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def modes(fn):
    """The same call eagerly and under jit."""
    return {"eager": fn, "jit": jax.jit(fn)}


@pytest.mark.parametrize(
    ("returns", "declares", "said"),
    [
        # int32 declared float16: a cast would turn 100000 into inf
        (lambda x: torch.full((3,), 100000, dtype=torch.int32), ((3,), "float16"), "int32"),
        # float32 declared int32: a cast would truncate 2.5 to 2
        (lambda x: torch.full((3,), 2.5), ((3,), "int32"), "float32"),
        (lambda x: torch.zeros(4), ((3,), "float32"), "shape (4,)"),
    ],
)
def test_a_result_that_is_not_what_result_shape_declares_is_refused(returns, declares, said):
    call = interop.jax_callable(returns, result_shape=declared(*declares))
    for mode, fn in modes(call).items():
        with pytest.raises(RuntimeError, match="result_shape declares") as raised:
            jax.block_until_ready(fn(jnp.ones(3)))
        text = str(raised.value)
        assert said in text and declares[1] in text and "output tree" in text, (mode, text)


def test_the_output_is_named_by_its_place_in_the_tree():
    def two(x):
        return {"a": torch.ones(3), "b": [torch.ones(2), torch.ones(5)]}

    shapes = {
        "a": declared((3,), "float32"),
        "b": [declared((2,), "float32"), declared((2,), "float32")],
    }
    call = interop.jax_callable(two, result_shape=shapes)
    for fn in modes(call).values():
        with pytest.raises(RuntimeError, match=r"output tree\['b'\]\[1\]"):
            jax.block_until_ready(fn(jnp.ones(3)))


def test_what_result_shape_declares_comes_back_in_both_modes():
    call = interop.jax_callable(
        lambda x: (x * 2).to(torch.int32), result_shape=lambda x: declared(x.shape, "int32")
    )
    for fn in modes(call).values():
        out = fn(jnp.arange(3.0))
        assert out.dtype == jnp.int32 and out.tolist() == [0, 2, 4]


@pytest.mark.parametrize("depth", [900, 5000])
def test_trees_deeper_than_the_recursion_limit(depth):
    tree = torch.arange(3.0)
    for level in range(depth):
        tree = [tree] if level % 2 else {"k": tree}
    back = interop.to_torch(interop.to_jax(tree))
    for level in reversed(range(depth)):
        back = back[0] if level % 2 else back["k"]
    assert back.tolist() == [0.0, 1.0, 2.0]
    assert interop.to_numpy(tree) is not None


@dataclasses.dataclass
class Node:
    value: object
    child: object = None


def test_a_tree_holding_itself_is_a_value_error():
    listed = [torch.ones(1)]
    listed.append([1, listed])
    mapped = {"x": torch.ones(1)}
    mapped["y"] = {"z": mapped}
    node = Node(torch.ones(1))
    node.child = [node]
    for tree, where in (
        (listed, r"tree\[1\]\[1\]"),
        (mapped, r"tree\['y'\]\['z'\]"),
        (node, r"tree\.child\[0\]"),
    ):
        for convert in (interop.to_jax, interop.to_torch, interop.to_numpy):
            with pytest.raises(ValueError, match=f"contains itself: {where}"):
                convert(tree)
    shared = torch.ones(2)
    twice = [shared, [shared, shared]]  # the same leaf in several places is a tree, not a cycle
    assert [t.tolist() for t in interop.to_torch(interop.to_jax(twice))[1]] == [[1.0, 1.0]] * 2


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
@pytest.mark.parametrize("layout", [torch.strided, torch.jagged])
def test_nested_tensors_are_refused_by_name(layout):
    nested = torch.nested.nested_tensor([torch.arange(3.0), torch.arange(5.0)], layout=layout)
    for convert in (
        dlpack.asdlpack,
        interop.to_jax,
        interop.to_numpy,
        lambda t: interop.to_jax([t]),
    ):
        with pytest.raises(BufferError, match="nested tensor has no single strided layout"):
            convert(nested)


def test_jax_module_warnings_point_at_the_callers_line():
    weights = torch.ones(3, 3, dtype=torch.float64)
    # Without x64 the float64 tensors narrow with a warning; set here, so that it is tested in
    # either mode.
    with jax.enable_x64(False), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = interop.JaxModule(lambda p, x: jnp.tanh(x @ p["w"]), {"w": weights})
        model(torch.ones(2, 3, dtype=torch.float64))
    narrowing = [w for w in caught if w.category is interop.DtypeNarrowingWarning]
    assert narrowing, [str(w.message) for w in caught]
    assert {w.filename for w in narrowing} == {__file__}


def test_a_folder_named_like_a_library_is_not_the_library(tmp_path):
    """An empty ``torch/`` or ``jax/`` folder imported where the library is not installed is a
    namespace package, not the library: interop leaves it alone, and a function that needs the
    library says that only a folder has its name."""
    code = (
        "import importlib.machinery, importlib.util, sys\n"
        # what `import torch` gives where only an empty folder has the name
        "for name in ('torch', 'jax'):\n"
        "    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)\n"
        f"    spec.submodule_search_locations = [{str(tmp_path)!r} + '/' + name]\n"
        "    sys.modules[name] = importlib.util.module_from_spec(spec)\n"
        "import numpy as np\n"
        "from dlpack import interop\n"
        "tree = interop.to_numpy({'a': np.arange(3), 'b': [np.ones(2)]}, device='cpu')\n"
        "print(tree['a'].tolist(), tree['b'][0].tolist(), interop.is_array(np.arange(3)))\n"
        "for fn in (interop.to_torch, interop.to_jax):\n"
        "    try:\n"
        "        fn(np.arange(3))\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
    )
    done = run_python("-c", code)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "[0, 1, 2] [1.0, 1.0] True"
    assert "to_torch needs torch, and 'torch' here is only a folder of that name" in lines[1]
    assert str(tmp_path / "torch") in lines[1]
    assert "to_jax needs jax, and 'jax' here is only a folder of that name" in lines[2]
