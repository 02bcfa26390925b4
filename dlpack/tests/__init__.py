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

``DLPACK_TESTS_TIMEOUT``: seconds one test may run (unset: no limit). A test that runs longer
ends the run, with every thread's Python traceback printed and the test named: a hang (a peer
process that never answers, a lock never released) fails fast instead of holding a CI job.

``DLPACK_TESTS_REQUIRE``: comma-separated import names (``numpy,torch,jax,...``) of libraries
that must be usable here: for those, a library that is missing, fails to import or crashes the
interpreter makes its tests fail instead of skip (CI sets it to what it installs). ``cuda`` in
the list does the same for the tests that need a CUDA device (for a run on a GPU machine).

:func:`run` runs pytest in a child process and checks that pytest finished there: a test, or a
library it imports, may end the process (``os._exit(0)``, a crash) partway, and in-process
nothing would run after that to turn the status into a failure (``os._exit`` skips ``finally``
and ``atexit``). The child writes which test it is running, and pytest's status when pytest
returns, to a file; a run whose child ended without that status failed.
"""

from __future__ import annotations

import faulthandler
import importlib
import os
import pkgutil
import signal
import subprocess
import sys
import tempfile

__all__ = ["run"]

INSTALL_HINT = 'dlpack.tests needs pytest: pip install "dlpack-adapter[test]"'

# pytest's statuses: some test failed (also ours when the run ended before pytest finished),
# interrupted, usage error (also ours when pytest is missing)
EXIT_TESTS_FAILED = 1
EXIT_INTERRUPTED = 2
EXIT_USAGE_ERROR = 4

TIMEOUT_ENV = "DLPACK_TESTS_TIMEOUT"


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

    pytest runs in a child process (with this process's ``sys.path`` and interpreter options).
    Where that process ends before pytest returns (a test or a library calls ``os._exit``, or
    crashes it), one line on stderr says how and during which test, and the status is 1 (2 for
    a Ctrl-C that killed it); where it ends otherwise than pytest said (a crash at interpreter
    exit), a line says so and the status is pytest's, or 1 for 0.
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
    _timeout()  # a value that is no number fails here, in the caller
    argv = pytest_argv([os.fspath(a) for a in args], package)
    return _run_in_child(argv)


# The child's script, after the lines that set sys.path, ARGV and STATUS. Guarded as a main
# module must be: multiprocessing's spawn and forkserver children import it again.
_CHILD = """
if __name__ == "__main__":
    from dlpack.tests import _run_here

    sys.exit(_run_here(ARGV, STATUS))
"""


def _run_in_child(argv: list[str]) -> int:
    """``pytest.main(argv)`` in a child process: its status when pytest returned there, else 1
    (see :func:`run`). sys.path goes in a script file, where any length fits."""
    with tempfile.TemporaryDirectory(prefix="dlpack-tests-") as folder:
        script, status = os.path.join(folder, "run.py"), os.path.join(folder, "status")
        open(status, "wb").close()
        path = [entry for entry in sys.path if isinstance(entry, str)]
        with open(script, "w", encoding="utf-8") as file:
            file.write(
                f"import sys\nsys.path[:] = {path!r}\nARGV = {argv!r}\nSTATUS = {status!r}\n"
                + _CHILD
            )
        proc = subprocess.Popen([sys.executable, *_interpreter_options(), script])
        returncode = _wait(proc)
        with open(status, "rb") as file:
            lines = file.read().decode("utf-8", "replace").splitlines()
    how = _how(returncode)
    limit = next((x for x in lines if x.startswith("limit ")), "").removeprefix("limit ")
    lines = [x for x in lines if not x.startswith("limit ")]
    if lines and lines[-1].startswith("finished "):
        code = int(lines[-1].removeprefix("finished "))
        if returncode == code:
            return code
        print(f"dlpack.tests: pytest finished (status {code}), then {how}", file=sys.stderr)
        return code or EXIT_TESTS_FAILED
    last = lines[-1] if lines else ""
    if last.startswith("running "):
        where = f"while running {last.removeprefix('running ')}"
        if limit and returncode == EXIT_TESTS_FAILED:  # faulthandler's _exit(1)
            print(
                f"dlpack.tests: the run failed: {last.removeprefix('running ')} ran past "
                f"{TIMEOUT_ENV}={limit} s, which ended the process (every thread's traceback "
                "is above)",
                file=sys.stderr,
            )
            return EXIT_TESTS_FAILED
    elif last.startswith("ran "):
        where = f"after {last.removeprefix('ran ')}, between tests"
    else:
        where = "before any test ran"
    print(
        f"dlpack.tests: the run failed: {how} {where}, before pytest finished "
        "(a test, or a library it imported, ended the process)",
        file=sys.stderr,
    )
    return EXIT_INTERRUPTED if returncode == -signal.SIGINT else EXIT_TESTS_FAILED


def _wait(proc: subprocess.Popen[bytes]) -> int:
    """The child's exit status. A Ctrl-C reaches it too, and pytest there ends the run and says
    so: this process waits for it; a second Ctrl-C kills it."""
    try:
        return proc.wait()
    except KeyboardInterrupt:
        pass
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.kill()
        return proc.wait()


def _how(returncode: int) -> str:
    if returncode >= 0:
        return f"its process ended with exit status {returncode}"
    try:
        name = f" ({signal.Signals(-returncode).name})"
    except ValueError:
        name = ""
    return f"its process was killed by signal {-returncode}{name}"


def _interpreter_options() -> list[str]:
    """This interpreter's command-line options that change how code runs, for the child."""
    flags = sys.flags
    options = []
    if flags.isolated:
        options.append("-I")
    else:
        options += ["-E"] * flags.ignore_environment + ["-s"] * flags.no_user_site
        options += ["-P"] * flags.safe_path
    options += ["-S"] * flags.no_site + ["-B"] * flags.dont_write_bytecode
    options += ["-O"] * flags.optimize + ["-b"] * flags.bytes_warning
    options += [f"-W{option}" for option in sys.warnoptions]
    for key, value in sys._xoptions.items():
        options += ["-X", key if value is True else f"{key}={value}"]
    return options


def _timeout() -> float | None:
    """``DLPACK_TESTS_TIMEOUT`` in seconds, None when unset or empty; a ValueError naming it
    when it is no positive number."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{TIMEOUT_ENV} must be a positive number of seconds, not {text!r}")
    return value


def _run_here(argv: list[str], status: str) -> int:
    """In the child: pytest's status, with the test being run, and the status once pytest
    returned, in the file ``status`` (written straight to the file: a line is there even where
    the process ends right after)."""
    import pytest

    fd = os.open(status, os.O_WRONLY | os.O_APPEND)

    def note(line: str) -> None:
        os.write(fd, (line + "\n").encode("utf-8", "replace"))

    limit = _timeout()
    if limit:
        note(f"limit {limit:g}")
        # the process's stderr as it is now: pytest's capture points fd 2 at a file of its
        # own during each test, which nobody reads once the process has ended
        stderr = os.fdopen(os.dup(2), "w")

    class Progress:
        def pytest_runtest_logstart(self, nodeid: str) -> None:
            note(f"running {nodeid}")
            if limit:  # every thread's traceback, then _exit(1): the parent names the test
                faulthandler.dump_traceback_later(limit, exit=True, file=stderr)

        def pytest_runtest_logfinish(self, nodeid: str) -> None:
            if limit:
                faulthandler.cancel_dump_traceback_later()
            note(f"ran {nodeid}")

    code = int(pytest.main(argv, plugins=[Progress()]))
    note(f"finished {code}")
    os.close(fd)
    return code


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
