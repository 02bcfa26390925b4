"""The test runner itself (``dlpack.tests.run``, ``python -m dlpack.tests``) and the environment
report (``python -m dlpack``).

The built-in runner is run in subprocesses with pytest hidden (a meta-path finder refuses to
import it), over a small throwaway test package and over a few of our own tests.
"""

import os
import re
import subprocess
import sys
import textwrap

import pytest

import dlpack
from dlpack.tests import _pytest_shim as shim
from dlpack.tests import _runner
from dlpack.tests._helpers import package_root

SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed, (\d+) skipped$", re.MULTILINE)

HIDE_PYTEST = textwrap.dedent(
    """
    import sys

    class _HidePytest:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("pytest", "_pytest"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _HidePytest())
    """
)


def _python(code, *args, hide_pytest=True, path=None, timeout=300):
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_CURRENT_TEST", None)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
    source = (HIDE_PYTEST if hide_pytest else "") + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", source, *args],
        cwd=package_root(),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _pytest_installed() -> bool:
    """Is the real pytest installed (whether or not this run uses it)?"""
    return _runner.pytest_installed()


def _summary(proc):
    found = SUMMARY.findall(proc.stdout)
    assert found, f"no summary line in:\n{proc.stdout}\n{proc.stderr}"
    return tuple(int(n) for n in found[-1])


RUN_FAKE = """
import sys
import dlpack.tests
sys.exit(dlpack.tests.run(*sys.argv[1:], package="fakepkg"))
"""

RUN_MAIN = """
import sys
from dlpack.tests.__main__ import main
sys.exit(main(sys.argv[1:]))
"""

FAKE_CONFTEST = """
import pytest

@pytest.fixture
def answer():
    return 42
"""

FAKE_TEST_A = """
import pytest

def test_passes(answer):
    assert answer == 42

def test_fails():
    assert 1 + 1 == 3, "arithmetic is broken"

def test_skips():
    pytest.skip("not today")

@pytest.mark.parametrize("x", [1, 2])
@pytest.mark.parametrize("y", ["a", "b"], ids=["A", "B"])
def test_params(x, y):
    assert x in (1, 2) and y in ("a", "b")

@pytest.mark.skipif(True, reason="always skipped")
def test_skipif():
    raise AssertionError("must not run")

@pytest.mark.xfail(reason="known bug")
def test_xfail():
    raise ValueError("bug")

def test_raises():
    with pytest.raises(ValueError, match="bad"):
        raise ValueError("bad value")

def test_tmp_path(tmp_path):
    (tmp_path / "f").write_text("x")
    assert (tmp_path / "f").read_text() == "x"

def test_needs_capfd(capfd):
    raise AssertionError("must not run")

class TestClass:
    @pytest.fixture(autouse=True)
    def _setup(self):
        self.value = 7
        yield
        self.value = None

    def test_method(self):
        assert self.value == 7
"""

FAKE_TEST_B = """
import pytest

pytest.importorskip("no_such_module_for_dlpack_tests")

def test_never():
    raise AssertionError("must not run")
"""

# test_a: 8 pass (passes, 4 params, raises, tmp_path, method), 1 fails, 4 skip (skips, skipif,
# xfail, capfd); test_b: skipped at import
FAKE_COUNTS = (8, 1, 5)


def _fake_package(tmp_path, *, broken=False):
    pkg = tmp_path / "fakepkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "conftest.py").write_text(FAKE_CONFTEST)
    (pkg / "test_a.py").write_text(FAKE_TEST_A)
    (pkg / "test_b.py").write_text(FAKE_TEST_B)
    (pkg / "helper_not_a_test.py").write_text("def test_not_collected():\n    raise 0\n")
    if broken:
        (pkg / "test_c.py").write_text("import no_such_dependency_for_dlpack_tests\n")
    return tmp_path


# ---------------------------------------------------------------------------
# the built-in runner, pytest hidden
# ---------------------------------------------------------------------------


def test_builtin_runner_counts_and_exit_status(tmp_path):
    proc = _python(RUN_FAKE, path=_fake_package(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _summary(proc) == FAKE_COUNTS, proc.stdout
    out = proc.stdout
    assert "pytest is not installed" in out
    assert "FAILED test_a.py::test_fails - AssertionError: arithmetic is broken" in out
    assert "SKIPPED [1] test_a.py: not today" in out
    assert "SKIPPED [1] test_a.py: always skipped" in out
    assert "needs pytest's 'capfd' fixture" in out
    assert "could not import 'no_such_module_for_dlpack_tests'" in out
    assert "install pytest to run them" in out
    assert "must not run" not in out
    assert "Traceback" not in proc.stderr


def test_builtin_runner_keyword_selection_passes(tmp_path):
    proc = _python(RUN_FAKE, "-k", "not fails", path=_fake_package(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _summary(proc) == (8, 0, 5)
    proc = _python(RUN_FAKE, "-k", "params and B", "-q", path=_fake_package(tmp_path / "q"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _summary(proc) == (2, 0, 1)  # the module skipped at import still counts, as pytest


def test_builtin_runner_exitfirst(tmp_path):
    proc = _python(RUN_FAKE, "-x", path=_fake_package(tmp_path))
    assert proc.returncode == 1
    assert _summary(proc) == (1, 1, 1)
    assert "stopped after 1 failure" in proc.stdout


def test_builtin_runner_collect_only_ids(tmp_path):
    proc = _python(RUN_FAKE, "--co", "test_a.py::test_params", path=_fake_package(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    assert ids == [
        "test_a.py::test_params[A-1]",
        "test_a.py::test_params[A-2]",
        "test_a.py::test_params[B-1]",
        "test_a.py::test_params[B-2]",
    ]


def test_builtin_runner_module_that_fails_to_import_is_a_failure(tmp_path):
    proc = _python(RUN_FAKE, "test_c.py", path=_fake_package(tmp_path, broken=True))
    assert proc.returncode == 1
    assert _summary(proc) == (0, 1, 0)
    assert "no_such_dependency_for_dlpack_tests" in proc.stdout


def test_builtin_runner_usage_errors(tmp_path):
    path = _fake_package(tmp_path)
    proc = _python(RUN_FAKE, "--no-such-option", path=path)
    assert proc.returncode == 4
    proc = _python(RUN_FAKE, "test_nonexistent.py", path=path)
    assert proc.returncode == 4
    assert "not a test module" in proc.stderr
    proc = _python(RUN_FAKE, "-k", "nothing_matches_this", path=path)
    assert proc.returncode == 0  # the module skipped at import is still reported
    assert _summary(proc) == (0, 0, 1)


def test_builtin_runner_on_our_tests():
    proc = _python(
        RUN_MAIN, "test_dlpack_object.py", "-k", "test_dlpack_version or test_package_version"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _summary(proc) == (2, 0, 0)
    assert "built-in test runner (pytest is not installed)" in proc.stdout


def test_run_returns_zero_without_pytest_and_use_pytest_true_raises():
    proc = _python(
        """
        import dlpack.tests
        code = dlpack.tests.run("-q", "test_dlpack_object.py::test_dlpack_version")
        print("CODE", code)
        try:
            dlpack.tests.run(use_pytest=True)
        except ModuleNotFoundError as exc:
            print("RAISED", exc.name)
        """
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CODE 0" in proc.stdout
    assert "RAISED pytest" in proc.stdout
    assert _summary(proc) == (1, 0, 0)


def test_builtin_collects_what_pytest_collects():
    if not _pytest_installed():
        pytest.skip("needs pytest, to compare with")
    mods = ["test_dlpack_object.py", "test_dtypes.py", "test_matrix.py"]
    ours = _python(RUN_MAIN, "--co", "-q", *mods)
    theirs = _python(
        "import sys, pytest; sys.exit(pytest.main(sys.argv[1:]))",
        "--collect-only",
        "-q",
        "-p",
        "no:cacheprovider",
        "--pyargs",
        *[f"dlpack.tests.{m[:-3]}" for m in mods],
        hide_pytest=False,
    )
    assert ours.returncode == 0, ours.stdout + ours.stderr
    assert theirs.returncode == 0, theirs.stdout + theirs.stderr

    def ids(text):
        return sorted(line.rsplit("/", 1)[-1] for line in text.splitlines() if "::" in line)

    assert ids(ours.stdout) == ids(theirs.stdout)
    assert len(ids(ours.stdout)) > 100


def test_pytest_path_passes_arguments_through(tmp_path):
    if not _pytest_installed():
        pytest.skip("needs pytest")
    path = _fake_package(tmp_path)
    proc = _python(RUN_FAKE, "-k", "passes or raises", hide_pytest=False, path=path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout
    proc = _python(RUN_FAKE, "-x", hide_pytest=False, path=path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 failed" in proc.stdout


# ---------------------------------------------------------------------------
# pieces of the runner and the shim, in this process
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr, words, expected",
    [
        ("", set(), True),
        ("numpy", {"test_numpy_layouts"}, True),
        ("NumPy", {"test_numpy_layouts"}, True),
        ("not numpy", {"test_numpy_layouts"}, False),
        ("torch and cpu", {"test_exchange[cpu-numpy-torch]"}, True),
        ("torch and (cuda or jax)", {"test_exchange[cpu-numpy-torch]"}, False),
        ("cpu-numpy-torch", {"test_exchange[cpu-numpy-torch]"}, True),
        ("not (a or b) and c", {"c"}, True),
    ],
)
def test_keyword_expressions(expr, words, expected):
    match = _runner.compile_expression(expr)
    assert match(lambda ident: any(ident.lower() in w.lower() for w in words)) is expected


@pytest.mark.parametrize("expr", ["(", "a and", "a b", "not", "a or or b", "a $ b"])
def test_bad_keyword_expressions(expr):
    with pytest.raises(ValueError):
        _runner.compile_expression(expr)


def test_parametrize_ids_like_pytest():
    mark = shim.mark.parametrize("v", [1, 1, 2, "x", "x", None, 1.5, object(), (1, 2), int])
    names, sets = _runner._expand_parametrize(mark.mark)
    assert names == ["v"]
    assert [s.id for s in sets] == [
        "1_0",
        "1_1",
        "2",
        "x0",
        "x1",
        "None",
        "1.5",
        "v7",
        "v8",
        "int",
    ]
    mark = shim.mark.parametrize("a, b", [(1, 2), shim.param(3, 4, id="custom")])
    names, sets = _runner._expand_parametrize(mark.mark)
    assert names == ["a", "b"]
    assert [s.id for s in sets] == ["1-2", "custom"]
    assert sets[1].values == {"a": 3, "b": 4}


def test_pytest_argv():
    argv = _runner.pytest_argv(["-k", "test_matrix", "-x"], "dlpack.tests")
    assert argv[-1] == "dlpack.tests"
    assert argv[argv.index("-k") + 1] == "test_matrix"
    assert "--pyargs" in argv and "no:cacheprovider" in argv
    argv = _runner.pytest_argv(["test_matrix.py::test_exchange", "-q"], "dlpack.tests")
    assert argv[-1] == "dlpack.tests.test_matrix::test_exchange"
    argv = _runner.pytest_argv(["-p", "cacheprovider", "test_runner"], "dlpack.tests")
    assert "no:cacheprovider" not in argv
    assert argv[-1] == "dlpack.tests.test_runner"


def test_shim_raises():
    with shim.raises(ValueError) as info:
        raise ValueError("boom 42")
    assert info.type is ValueError and str(info.value) == "boom 42"
    assert info.match(r"\d+")
    with pytest.raises(shim.Failed):
        with shim.raises(ValueError):
            pass
    with pytest.raises(AssertionError):
        with shim.raises(ValueError, match="nope"):
            raise ValueError("boom")
    with pytest.raises(KeyError):  # another exception goes through
        with shim.raises(ValueError):
            raise KeyError("k")
    info = shim.raises((TypeError, ValueError), int, "x")
    assert info.type is ValueError


def test_shim_skips_and_marks():
    with pytest.raises(shim.Skipped, match="could not import 'no_such_module_xyz'"):
        shim.importorskip("no_such_module_xyz")
    assert shim.importorskip("os") is os
    with pytest.raises(shim.Skipped, match="required is"):
        shim.importorskip("pytest" if "pytest" in sys.modules else "os", minversion="999")
    assert issubclass(shim.Skipped, BaseException) and not issubclass(shim.Skipped, Exception)

    @shim.mark.parametrize("x", [1])
    @shim.mark.skipif(False, reason="r")
    def f(x):
        pass

    assert [m.name for m in f.pytestmark] == ["skipif", "parametrize"]
    assert shim.approx(0.1 + 0.2) == 0.3
    assert [0.1 + 0.2, 1.0] == shim.approx([0.3, 1.0])
    assert shim.approx(1.0) != 1.1


# ---------------------------------------------------------------------------
# python -m dlpack
# ---------------------------------------------------------------------------


def test_report_runs_and_shows_the_table():
    proc = subprocess.run(
        [sys.executable, "-m", "dlpack"],
        cwd=package_root(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"dlpack-adapter {dlpack.__version__}" in out
    assert f"DLPack {dlpack.DLPACK_VERSION[0]}.{dlpack.DLPACK_VERSION[1]}" in out
    assert "Array libraries:" in out and "Devices:" in out
    assert "CPU exchanges" in out
    if "provider \\ consumer" in out:
        row = next(line for line in out.splitlines() if line.strip().startswith("bytearray"))
        assert "zero-copy" in row
    else:
        assert "no consumer library is installed" in out
    assert "Traceback" not in proc.stderr


def test_report_survives_a_broken_library(tmp_path):
    broken = tmp_path / "paddle"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise RuntimeError('broken on purpose')\n")
    half = tmp_path / "mlx"
    half.mkdir()
    (half / "__init__.py").write_text("")
    (half / "core.py").write_text("import no_such_dependency_of_mlx\n")
    proc = _python(
        "import sys, runpy; sys.argv = ['dlpack']; runpy.run_module('dlpack', run_name='__main__')",
        hide_pytest=False,
        path=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    paddle = next(line for line in lines if line.strip().startswith("paddle "))
    assert "import failed: RuntimeError: broken on purpose" in paddle
    mlx = next(line for line in lines if line.strip().startswith("mlx "))
    assert "import failed" in mlx and "no_such_dependency_of_mlx" in mlx


def test_exchange_never_raises():
    from dlpack._report import Consumer, Provider, _bytearray, exchange

    def bad_make(device):
        raise RuntimeError("provider exploded")

    def bad_consume(obj, device):
        raise ValueError("consumer exploded")

    good = Provider("good", None, ("cpu",), _bytearray)
    bad = Provider("bad", None, ("cpu",), bad_make)
    out = exchange(bad, Consumer("c", "os", ("cpu",), bad_consume))
    assert out.status == "fails" and "provider exploded" in out.reason
    out = exchange(good, Consumer("c", "os", ("cpu",), bad_consume))
    assert out.status == "fails" and out.stage == "consumer"
    assert out.reason == "ValueError: consumer exploded"
    out = exchange(good, Consumer("c", "no_such_module_xyz", ("cpu",), bad_consume))
    assert out.status == "skip" and "not installed" in out.reason
