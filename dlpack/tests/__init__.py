"""dlpack's own test suite, shipped with the package so it can check any environment.

``import dlpack.tests; dlpack.tests.run()`` (or ``python -m dlpack.tests``) runs it with pytest
against whatever array libraries are importable here; a missing library or device is a skip with
its reason (a folder that merely has a library's name, such as an empty ``paddle/`` in the
current folder, is no library: its tests skip and name it). It needs pytest (and hypothesis for
the property tests): ``pip install "dlpack-adapter[test]"``.

Before the first array library is imported, child processes check which of them import without
crashing the interpreter (:mod:`dlpack._probe`; about the time of importing them all once): a
library that crashes it, alone or together with another, is never imported, and its tests are
skipped with that reason while the others run. Tests import libraries through
``dlpack.tests._helpers.need``.

``DLPACK_TESTS_REQUIRE``: comma-separated import names (``numpy,torch,jax,...``) of libraries
that must be usable here: for those, a library that is missing, fails to import or crashes the
interpreter makes its tests fail instead of skip (CI sets it to what it installs). ``cuda`` in
the list does the same for the tests that need a CUDA device (for a run on a GPU machine).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

__all__ = ["run"]

INSTALL_HINT = 'dlpack.tests needs pytest: pip install "dlpack-adapter[test]"'

# pytest's status for a usage error; also ours when pytest is missing
EXIT_USAGE_ERROR = 4


def run(*args: str | os.PathLike, package: str = "dlpack.tests") -> int:
    """Run the test suite with pytest; return pytest's exit status: **0 on success** (falsy).

    ``args`` are pytest's command-line arguments, as for ``python -m dlpack.tests``: ``-k EXPR``,
    ``-x``, ``-v``, ``-q``, ``-rs``, ... Test modules may be named as ``test_matrix.py``,
    ``test_matrix`` or ``test_matrix.py::test_exchange``. A list may be passed instead of
    separate strings.

    ``package``: the package whose tests are run (for testing ``run`` itself).

    The exit status is pytest's: 0 all selected tests passed or were skipped, 1 some test failed,
    2 interrupted, 3 internal error, 4 usage error, 5 no tests were collected. Without pytest
    (or with only a folder named ``pytest``) it prints one line saying what to install and
    returns 4.
    """
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        args = tuple(args[0])
    try:
        import pytest
    except ModuleNotFoundError as exc:
        if exc.name not in ("pytest", "_pytest"):
            raise  # pytest is there but broken: its traceback says more than we can
        print(INSTALL_HINT, file=sys.stderr)
        return EXIT_USAGE_ERROR
    from dlpack._report._libraries import only_folders

    folders = only_folders(pytest)
    if folders:  # a folder named pytest, where pytest itself is not installed
        print(f"{INSTALL_HINT} ({folders})", file=sys.stderr)
        return EXIT_USAGE_ERROR
    argv = pytest_argv([os.fspath(a) for a in args], package)
    return int(pytest.main(argv))


# pytest options whose value is the next argument (so it isn't taken for a test module name)
_VALUE_OPTIONS = frozenset(
    {
        "-k",
        "-m",
        "-p",
        "-o",
        "-W",
        "-c",
        "-n",
        "-r",
        "--tb",
        "--maxfail",
        "--basetemp",
        "--rootdir",
        "--deselect",
        "--ignore",
        "--ignore-glob",
        "--durations",
        "--junitxml",
        "--junit-xml",
        "--log-level",
        "--confcutdir",
        "--override-ini",
        "--capture",
        "--import-mode",
        "--color",
        "--hypothesis-seed",
        "--hypothesis-profile",
    }
)


def _test_modules(package: str) -> list[str]:
    pkg = importlib.import_module(package)
    return sorted(
        m.name
        for m in pkgutil.iter_modules(getattr(pkg, "__path__", []))
        if m.name.startswith("test_") and not m.ispkg
    )


def _resolve_target(arg: str, package: str, modules: list[str]) -> tuple[str, str] | None:
    """``test_x.py[::rest]``, ``test_x``, ``a/b/test_x.py``, ``pkg.test_x`` or ``pkg`` ->
    (module name or "" for the whole package, rest); None when ``arg`` names none of ours."""
    head, _, rest = arg.partition("::")
    if head in (package, package.replace(".", "/"), package.replace(".", "/") + "/"):
        return "", rest
    if head.startswith(package + "."):
        head = head[len(package) + 1 :]
    base = os.path.basename(head.rstrip("/\\"))
    if base.endswith(".py"):
        base = base[:-3]
    if base in modules:
        return base, rest
    return None


def pytest_argv(args: list[str], package: str = "dlpack.tests") -> list[str]:
    """The argument list for ``pytest.main``: our test modules named by module name (or
    ``test_x.py``, with ``::`` parts) become ``--pyargs`` targets; the rest passes through."""
    modules = _test_modules(package)
    options: list[str] = []
    targets: list[str] = []
    value_next = False
    for arg in args:
        if value_next:
            options.append(arg)
            value_next = False
            continue
        if arg.startswith("-"):
            options.append(arg)
            value_next = arg in _VALUE_OPTIONS
            continue
        resolved = None
        if not os.path.exists(arg.partition("::")[0]):  # a real path is pytest's to resolve
            resolved = _resolve_target(arg, package, modules)
        if resolved is None:
            targets.append(arg)
            continue
        mod, rest = resolved
        targets.append(package + (f".{mod}" if mod else "") + (f"::{rest}" if rest else ""))
    argv = []
    if "--pyargs" not in options:
        argv.append("--pyargs")
    if not any(a.startswith("--rootdir") for a in options):
        # node ids relative to the directory holding the package: dlpack/tests/test_x.py::...
        top = importlib.import_module(package.split(".")[0])
        argv.append(f"--rootdir={os.path.dirname(list(top.__path__)[0])}")
    if not any("cacheprovider" in a for a in options):
        argv += ["-p", "no:cacheprovider"]  # don't leave a .pytest_cache wherever this runs
    return argv + options + (targets or [package])
