"""``dlpack.tests.run()`` and ``python -m dlpack.tests``: pytest underneath, arguments passed
through, pytest's exit status returned; without pytest, one line saying what to install.

Each run is a child process, so its pytest session is its own.
"""

import os
import re
import textwrap

from dlpack import _probe
from dlpack.tests import INSTALL_HINT, pytest_argv

from ._helpers import LONG_PATH, LONG_PATH_ENTRIES, REQUIRE_ENV, package_root, run_python

RUN = "import sys, dlpack.tests; sys.exit(dlpack.tests.run(sys.argv[1:]))"
RUN_FAKE = "import sys, dlpack.tests; sys.exit(dlpack.tests.run(*sys.argv[1:], package='fakepkg'))"
TWO_TESTS = ["test_dlpack_object.py", "-k", "test_dlpack_version or test_package_version"]


def _output(proc) -> str:
    return proc.stdout + proc.stderr


def test_run_forwards_arguments_and_returns_pytest_status():
    proc = run_python("-c", RUN, *TWO_TESTS, "-q")
    assert proc.returncode == 0, _output(proc)
    assert "2 passed" in proc.stdout
    proc = run_python("-c", RUN, "test_dlpack_object.py", "-k", "no_test_has_this_name")
    assert proc.returncode == 5, _output(proc)  # pytest: no tests collected


def test_python_m_dlpack_tests_forwards_arguments():
    proc = run_python("-m", "dlpack.tests", *TWO_TESTS, "-v")
    assert proc.returncode == 0, _output(proc)
    assert "test_dlpack_object.py::test_dlpack_version PASSED" in proc.stdout
    assert "2 passed" in proc.stdout


def test_run_returns_1_when_a_test_fails(tmp_path):
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "test_a.py").write_text(
        textwrap.dedent(
            """
            def test_passes():
                pass

            def test_fails():
                assert 1 + 1 == 3
            """
        )
    )
    proc = run_python("-c", RUN_FAKE, "-q", path=[tmp_path])
    assert proc.returncode == 1, _output(proc)
    assert "1 failed, 1 passed" in proc.stdout
    proc = run_python("-c", RUN_FAKE, "-q", "-k", "passes", path=[tmp_path])
    assert proc.returncode == 0, _output(proc)
    assert "1 passed, 1 deselected" in proc.stdout


def _fake_package(tmp_path, source):
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "test_a.py").write_text(textwrap.dedent(source))


def test_a_run_that_ends_before_pytest_finishes_fails(tmp_path):
    """A test (or a library it imports) that ends the process with status 0: no summary, and
    no pass either."""
    _fake_package(
        tmp_path,
        """
        import os

        def test_passes():
            pass

        def test_ends_the_process():
            os._exit(0)

        def test_never_runs():
            pass
        """,
    )
    proc = run_python("-c", RUN_FAKE, "-q", path=[tmp_path], timeout=120)
    assert proc.returncode == 1, _output(proc)
    assert "passed" not in proc.stdout  # no summary
    assert proc.stderr.splitlines()[-1] == (
        "dlpack.tests: the run failed: its process ended with exit status 0 while running "
        "fakepkg/test_a.py::test_ends_the_process, before pytest finished (a test, or a library "
        "it imported, ended the process)"
    )


def test_a_test_past_the_time_limit_ends_the_run_and_is_named(tmp_path):
    """DLPACK_TESTS_TIMEOUT: a test that hangs (here a lock never released, in a thread the test
    waits for) ends the run once it has run that long, every thread's traceback printed; the
    tests before it ran, and the status is a failure."""
    _fake_package(
        tmp_path,
        """
        import threading

        def test_passes():
            pass

        def test_hangs():
            lock = threading.Lock()
            lock.acquire()
            waiter = threading.Thread(target=lock.acquire, name="waiter")
            waiter.start()
            waiter.join()

        def test_never_runs():
            pass
        """,
    )
    proc = run_python(
        "-c", RUN_FAKE, "-v", path=[tmp_path], env={"DLPACK_TESTS_TIMEOUT": "2"}, timeout=120
    )
    assert proc.returncode == 1, _output(proc)
    assert "test_a.py::test_passes PASSED" in proc.stdout
    assert "test_never_runs" not in proc.stdout
    assert "Timeout (0:00:02)!" in proc.stderr  # faulthandler's dump, every thread's
    assert " in test_hangs\n" in proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        "dlpack.tests: the run failed: fakepkg/test_a.py::test_hangs ran past "
        "DLPACK_TESTS_TIMEOUT=2 s, which ended the process (every thread's traceback is above)"
    )


def test_a_time_limit_below_the_tests_time_changes_nothing(tmp_path):
    _fake_package(
        tmp_path,
        """
        import time

        def test_sleeps_a_little():
            time.sleep(0.2)
        """,
    )
    proc = run_python("-c", RUN_FAKE, "-q", path=[tmp_path], env={"DLPACK_TESTS_TIMEOUT": "60"})
    assert proc.returncode == 0, _output(proc)
    assert "1 passed" in proc.stdout


def test_a_time_limit_that_is_no_number_is_a_value_error():
    for value in ("soon", "0", "-5", "inf", "nan"):
        proc = run_python("-c", RUN, "-q", env={"DLPACK_TESTS_TIMEOUT": value})
        assert proc.returncode == 1, _output(proc)
        assert proc.stderr.splitlines()[-1] == (
            f"ValueError: DLPACK_TESTS_TIMEOUT must be a positive number of seconds, not {value!r}"
        ), _output(proc)


def test_tests_may_start_spawned_processes(tmp_path):
    """multiprocessing's spawn imports the main module again in its child: the runner's own
    child script must be safe to import (it had run pytest again there, and failed)."""
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "test_spawn.py").write_text(
        textwrap.dedent(
            """
            import multiprocessing

            def test_spawned_child_answers():
                with multiprocessing.get_context("spawn").Pool(1) as pool:
                    assert pool.map(abs, [-1, -2]) == [1, 2]
            """
        )
    )
    proc = run_python("-c", RUN_FAKE, "-q", path=[tmp_path])
    assert proc.returncode == 0, _output(proc)
    assert "1 passed" in proc.stdout


def test_a_crash_after_pytest_finished_fails_the_run(tmp_path):
    _fake_package(
        tmp_path,
        """
        import atexit, os

        def test_passes():
            atexit.register(os.abort)
        """,
    )
    proc = run_python("-c", RUN_FAKE, "-q", path=[tmp_path], timeout=120)
    assert proc.returncode == 1, _output(proc)
    assert "1 passed" in proc.stdout
    assert proc.stderr.splitlines()[-1] == (
        "dlpack.tests: pytest finished (status 0), then its process was killed by signal 6 "
        "(SIGABRT)"
    )


def test_a_library_that_ends_the_process_on_import_is_a_skip(tmp_path):
    """A cupy that calls os._exit(0) when imported: the probe finds it, its tests skip, the run
    ends with pytest's summary."""
    (tmp_path / "cupy.py").write_text("import os\nos._exit(0)\n")
    args = ["-m", "dlpack.tests", "-q", "-rs", "test_matrix.py", "-k", "cupy"]
    proc = run_python(*args, path=[tmp_path], env={REQUIRE_ENV: ""}, timeout=300)
    assert proc.returncode == 0, _output(proc)
    assert re.search(r"^\d+ skipped, \d+ deselected in ", proc.stdout, re.M), _output(proc)
    reason = "cupy crashes the interpreter when imported: exit status 0 before its import returned"
    assert reason in proc.stdout


def test_a_long_sys_path_reaches_the_tests(tmp_path):
    """A sys.path longer than one command-line argument may be, with a module-level need() (the
    probe runs while pytest collects)."""
    (tmp_path / "fake_fine.py").write_text("")
    _fake_package(
        tmp_path,
        f"""
        import sys
        from dlpack.tests._helpers import need

        need("fake_fine")

        def test_path():
            assert sys.path[-1] == {LONG_PATH_ENTRIES[-1]!r}
        """,
    )
    code = f"{LONG_PATH}; {RUN_FAKE}"
    # nothing handed down: the run probes with this sys.path
    env = {_probe.KNOWN_ENV: "", _probe.EXTRA_ENV: "fake_fine"}
    proc = run_python("-c", code, "-q", path=[tmp_path], env=env, timeout=300)
    assert proc.returncode == 0, _output(proc)
    assert "1 passed" in proc.stdout


def _without_pytest(tmp_path):
    """A folder that, first on sys.path, makes ``import pytest`` fail as a missing pytest does."""
    hide = tmp_path / "hide_pytest"
    hide.mkdir()
    (hide / "pytest.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'pytest'\", name='pytest')\n"
    )
    return hide


def test_without_pytest_one_line_says_what_to_install(tmp_path):
    hide = _without_pytest(tmp_path)
    # -P: the child starts in the folder holding dlpack, which may be site-packages (pytest's
    # too); without -P that folder would come first on sys.path and pytest would be found.
    for args in (["-P", "-c", RUN, "-q"], ["-P", "-m", "dlpack.tests", "-q"]):
        proc = run_python(*args, path=[hide, package_root()], timeout=60)
        assert proc.returncode == 4, _output(proc)
        assert _output(proc).splitlines() == [INSTALL_HINT]
    assert 'pip install "dlpack-adapter[test]"' in INSTALL_HINT


def test_a_folder_named_pytest_is_no_pytest(tmp_path):
    # Run from a folder holding an empty pytest/, where pytest is not installed: -S leaves
    # site-packages (pytest's) off sys.path, and dlpack is found through a folder holding only a
    # link to it.
    here = tmp_path / "here"
    (here / "pytest").mkdir(parents=True)
    (tmp_path / "linked").mkdir()
    os.symlink(os.path.join(package_root(), "dlpack"), tmp_path / "linked" / "dlpack")
    env = {"PYTHONPATH": str(tmp_path / "linked")}
    proc = run_python("-S", "-m", "dlpack.tests", "-q", cwd=here, env=env, timeout=60)
    assert proc.returncode == 4, _output(proc)
    folder = os.path.realpath(here / "pytest")
    assert _output(proc).splitlines() == [f"{INSTALL_HINT} (only a folder of that name: {folder})"]


def test_pytest_argv_names_our_modules_for_pyargs():
    argv = pytest_argv(["-k", "test_matrix", "-x"])
    assert argv[-1] == "dlpack.tests"
    assert argv[argv.index("-k") + 1] == "test_matrix"
    assert "--pyargs" in argv and "no:cacheprovider" in argv
    argv = pytest_argv(["test_matrix.py::test_exchange", "-q"])
    assert argv[-1] == "dlpack.tests.test_matrix::test_exchange"
    argv = pytest_argv(["-p", "cacheprovider", "test_run"])
    assert "no:cacheprovider" not in argv
    assert argv[-1] == "dlpack.tests.test_run"
