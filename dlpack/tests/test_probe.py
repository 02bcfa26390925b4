"""Libraries that crash the interpreter when imported (``dlpack._probe``): found in child
processes, never imported by the report or the test suite, their tests skipped (or failed where
``DLPACK_TESTS_REQUIRE`` names them) while everything else runs. A folder that only has a
library's name (which Python imports as a namespace package) is no library: neither probed nor
taken for one, and named where the library is said to be missing.

The crashing libraries are fakes written to a temporary folder: one that kills its process when
imported, two that import alone but kill the process when both are imported, one that ends it
with status 0, one that kills it only where our extension is loaded.
"""

import os
import re
import sys
import textwrap

import pytest

from dlpack import _probe, _report
from dlpack._report import _libraries

from ._helpers import LONG_PATH_ENTRIES, REQUIRE_ENV, leave_out_heavy_libraries, run_python

FAKES = {
    "fake_crash_alone": "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n",
    "fake_crash_a": "",
    # b dies only where a is already loaded (as two conflicting native libraries would)
    "fake_crash_b": (
        "import os, signal, sys\n"
        "if 'fake_crash_a' in sys.modules:\n"
        "    os.kill(os.getpid(), signal.SIGSEGV)\n"
    ),
    "fake_fine": "",
    "fake_broken": "raise ImportError('broken on purpose')\n",
    "fake_exit_status": "import os\nos._exit(3)\n",
    "fake_abort_at_exit": "import atexit, os\natexit.register(os.abort)\n",
    # c dies only where both a and b of the trio are loaded: no pair explains it
    "fake_trio_a": "",
    "fake_trio_b": "",
    "fake_trio_c": (
        "import os, signal, sys\n"
        "if {'fake_trio_a', 'fake_trio_b'} <= set(sys.modules):\n"
        "    os.kill(os.getpid(), signal.SIGSEGV)\n"
    ),
    "fake_hang": "import time\ntime.sleep(600)\n",
    # slow, but it ends: long enough for a notice
    "fake_slow": "import time\ntime.sleep(2.5)\n",
    # no crash to the parent of its process, but nothing after it runs
    "fake_exit_zero": "import os\nos._exit(0)\n",
    # dies only beside our extension (as two native libraries with conflicting symbols would)
    "fake_beside_ours": (
        "import os, signal, sys\n"
        "if 'dlpack._dlpack' in sys.modules:\n"
        "    os.kill(os.getpid(), signal.SIGSEGV)\n"
    ),
}
CRASHING = "fake_crash_alone,fake_crash_a,fake_crash_b"
ALONE_MESSAGE = "fake_crash_alone crashes the interpreter when imported: signal 11 (SIGSEGV)"
PAIR_MESSAGE = (
    "fake_crash_b crashes the interpreter when imported together with fake_crash_a: "
    "signal 11 (SIGSEGV)"
)


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    """A folder with the fake libraries, first on this process's sys.path (the probe's children
    get the same sys.path); none of them is ever imported here."""
    folder = tmp_path / "fakes"
    folder.mkdir()
    for name, source in FAKES.items():
        (folder / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(folder))
    return folder


def test_probe_verdicts(fakes):
    names = [
        "fake_fine",
        "fake_crash_alone",
        "fake_broken",
        "fake_crash_a",
        "fake_crash_b",
        "fake_exit_status",
        "fake_exit_zero",
        "fake_beside_ours",
        "fake_abort_at_exit",
    ]
    crashes = _probe.probe(names, timeout=60)
    assert {name: crash.message() for name, crash in crashes.items()} == {
        "fake_crash_alone": ALONE_MESSAGE,
        "fake_crash_b": PAIR_MESSAGE,
        "fake_exit_status": "fake_exit_status crashes the interpreter when imported: exit status 3",
        "fake_exit_zero": (
            "fake_exit_zero crashes the interpreter when imported: "
            "exit status 0 before its import returned"
        ),
        "fake_beside_ours": (
            "fake_beside_ours crashes the interpreter when imported together with dlpack: "
            "signal 11 (SIGSEGV)"
        ),
        "fake_abort_at_exit": (
            "fake_abort_at_exit crashes the interpreter when imported: "
            "signal 6 (SIGABRT) at interpreter exit"
        ),
    }
    assert crashes["fake_crash_b"].together_with == ("fake_crash_a",)
    # in the other order, b comes first and nothing crashes
    assert _probe.probe(["fake_crash_b", "fake_crash_a", "fake_fine"], timeout=60) == {}


def test_probe_names_the_group_when_no_pair_crashes(fakes):
    crashes = _probe.probe(["fake_trio_a", "fake_fine", "fake_trio_b", "fake_trio_c"], timeout=60)
    assert list(crashes) == ["fake_trio_c"]
    assert crashes["fake_trio_c"].message() == (
        "fake_trio_c crashes the interpreter when imported together with fake_trio_a, fake_fine "
        "and fake_trio_b: signal 11 (SIGSEGV)"
    )


def test_probe_reports_a_hang_and_names_it_while_waiting(fakes, monkeypatch):
    monkeypatch.setattr(_probe, "NOTICE_AFTER_S", 0.5)
    notices = []
    with _probe.notices_to(notices.append):
        crashes = _probe.probe(["fake_fine", "fake_hang"], timeout=2)
    assert {name: crash.how for name, crash in crashes.items()} == {
        "fake_hang": "no result after 2 s"
    }
    # the child importing all, then those importing it alone (with and without our extension)
    assert notices
    for notice in notices:
        assert re.fullmatch(
            r"dlpack: waiting for fake_hang to import in a child process, \d+ s so far "
            r"\(checking it does not crash the interpreter; given up after 2 s\)",
            notice,
        ), notices


def test_probe_notices_go_to_stderr(fakes):
    """Where no one asked for them, on stderr, as they come (an import slow enough for one,
    which ends: the verdict on a hang is the test above's)."""
    code = (
        "from dlpack import _probe\n"
        "_probe.NOTICE_AFTER_S = 0.5\n"
        "print(sorted(_probe.probe(['fake_slow'], timeout=60)))\n"
    )
    proc = run_python("-c", code, path=[fakes], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "[]\n"
    assert "dlpack: waiting for fake_slow to import in a child process" in proc.stderr


def test_probe_is_not_fooled_by_a_helper_holding_stdout(tmp_path, monkeypatch):
    """A library that starts a helper process, which inherits its stdout and lives on (a server,
    a compiler daemon): the child importing it is done when it ends, not when the helper does."""
    alive = tmp_path / "helper_alive"
    alive.write_text("")
    # it lives while the file does (two minutes at most)
    helper = (
        "import os, time\n"
        "for _ in range(1200):\n"
        f"    if not os.path.exists({str(alive)!r}):\n"
        "        break\n"
        "    time.sleep(0.1)\n"
    )
    (tmp_path / "fake_helper.py").write_text(
        f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {helper!r}])\n"
    )
    (tmp_path / "fake_fine.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert _probe.probe(["fake_helper", "fake_fine"], timeout=20) == {}
    finally:
        alive.unlink()


def test_probe_takes_a_long_sys_path(fakes, monkeypatch):
    monkeypatch.setattr(sys, "path", [*sys.path, *LONG_PATH_ENTRIES])
    crashes = _probe.probe(["fake_fine", "fake_crash_alone"], timeout=60)
    assert {name: crash.message() for name, crash in crashes.items()} == {
        "fake_crash_alone": ALONE_MESSAGE
    }


def _only_a_folder(path) -> str:
    return f"only a folder of that name: {os.path.realpath(path)}"


def test_a_folder_of_a_library_name_is_no_library(tmp_path, monkeypatch):
    # an empty folder where the library is not installed, as an empty paddle/ or Ray's /tmp/ray;
    # and a module inside a folder without __init__.py, as mlx.core is
    (tmp_path / "fake_stray").mkdir()
    (tmp_path / "fake_spaced").mkdir()
    (tmp_path / "fake_spaced" / "core.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_libraries, "_LIBRARIES", {})  # what this test imports, forgotten after it
    assert not _probe.installed("fake_stray")
    assert _probe.installed("fake_spaced.core")
    lib = _report.library("fake_stray")
    reason = f"fake_stray is not installed ({_only_a_folder(tmp_path / 'fake_stray')})"
    assert (lib.status, lib.module, lib.not_installed()) == ("missing", None, reason)
    assert lib.describe() == f"not installed ({_only_a_folder(tmp_path / 'fake_stray')})"
    assert "fake_stray" not in sys.modules  # imported to find out, and let go
    with pytest.raises(_report.Unavailable) as excinfo:
        _report.need("fake_stray")
    assert str(excinfo.value) == reason
    spaced = _report.library("fake_spaced.core")
    assert spaced.status == "ok" and spaced.module.VALUE == 42


def _library_rows(report: str) -> dict[str, str]:
    """The report's "Array libraries:" table: name -> what it says."""
    table = report.partition("Array libraries:\n")[2].partition("\n\n")[0]
    return dict(line.split(None, 1) for line in table.splitlines())


def test_report_survives_broken_and_crashing_libraries_and_folders(tmp_path):
    # A library that raises when imported, one whose submodule needs a missing dependency (as
    # mlx.core may), the crashing fakes, and an empty folder of a library's name in the folder
    # the report is run from, all in one report; named so that no real library can stand in for
    # them, and listed by DLPACK_PROBE_EXTRA.
    (tmp_path / "fake_stray").mkdir()
    broken = tmp_path / "fake_raising"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise RuntimeError('broken on purpose')\n")
    half = tmp_path / "fake_half"
    half.mkdir()
    (half / "__init__.py").write_text("")
    (half / "core.py").write_text("import no_such_dependency_of_fake_half\n")
    for name in [*CRASHING.split(","), "fake_beside_ours"]:
        (tmp_path / f"{name}.py").write_text(FAKES[name])
    # a cupy that ends the process with status 0: the report must not end with it
    (tmp_path / "cupy.py").write_text(FAKES["fake_exit_zero"])
    leave_out_heavy_libraries(tmp_path)  # slow to import, and no part of this
    extra = f"fake_raising,fake_half.core,{CRASHING},fake_beside_ours,fake_stray"
    proc = run_python("-m", "dlpack", cwd=tmp_path, env={_probe.EXTRA_ENV: extra})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _library_rows(proc.stdout)
    assert rows["cupy"] == (
        "crashes the interpreter when imported: exit status 0 before its import returned"
    )
    assert rows["fake_beside_ours"] == (
        "crashes the interpreter when imported together with dlpack: signal 11 (SIGSEGV)"
    )
    assert rows["fake_stray"] == f"not installed ({_only_a_folder(tmp_path / 'fake_stray')})"
    assert rows["fake_raising"] == "import failed: RuntimeError: broken on purpose"
    assert "import failed" in rows["fake_half.core"]
    assert "no_such_dependency_of_fake_half" in rows["fake_half.core"]
    assert rows["fake_crash_alone"] == ALONE_MESSAGE.removeprefix("fake_crash_alone ")
    assert rows["fake_crash_b"] == PAIR_MESSAGE.removeprefix("fake_crash_b ")
    assert rows["fake_crash_a"] == "(version unknown)"  # imported: it is fine alone
    # and everything else still runs
    assert "CPU exchanges" in proc.stdout
    assert re.search(r"^  bytearray +zero-copy", proc.stdout, re.MULTILINE), proc.stdout


# the last test sets DLPACK_TESTS_REQUIRE for itself: need() reads it when called
GENERATED_TESTS = textwrap.dedent(
    f"""
    from dlpack.tests._helpers import need

    def test_crash_alone():
        need("fake_crash_alone")

    def test_crash_pair():
        need("fake_crash_a")
        need("fake_crash_b")

    def test_numpy():
        np = need("numpy")
        assert int(np.arange(4).sum()) == 6

    def test_crash_pair_required(monkeypatch):
        monkeypatch.setenv("{REQUIRE_ENV}", "numpy,fake_crash_b")
        need("fake_crash_b")

    def test_folder():
        need("fake_stray")

    def test_folder_required(monkeypatch):
        monkeypatch.setenv("{REQUIRE_ENV}", "fake_stray")
        need("fake_stray")
    """
)


def _summary_line(outcome, line, message):
    """pytest's -rs line for a skip at ``line`` of the generated file (its path is relative)."""
    return re.compile(
        rf"^{outcome} \[1\] \S*test_generated\.py:{line}: {re.escape(message)}$", re.M
    )


def test_pytest_skips_or_fails_the_tests_of_crashing_libraries_and_folders(tmp_path):
    """A pytest run with crashing libraries and a folder of a library's name: their tests skip
    with the reason (or fail, where required), the others pass, and the run itself ends
    normally."""
    (tmp_path / "fake_stray").mkdir()
    for name in CRASHING.split(","):
        (tmp_path / f"{name}.py").write_text(FAKES[name])
    test_file = tmp_path / "test_generated.py"
    test_file.write_text(GENERATED_TESTS)
    leave_out_heavy_libraries(tmp_path)  # slow to import (its probe would), and no part of this
    env = {_probe.EXTRA_ENV: CRASHING, REQUIRE_ENV: ""}
    args = ["-m", "pytest", "-rsf", "-p", "no:cacheprovider", str(test_file)]
    proc = run_python(*args, path=[tmp_path], env=env, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "2 failed, 1 passed, 3 skipped" in out
    assert _summary_line("SKIPPED", 5, ALONE_MESSAGE).search(out), out
    assert _summary_line("SKIPPED", 9, PAIR_MESSAGE).search(out), out
    assert re.search(r"^FAILED \S*test_generated\.py::test_crash_pair_required\b", out, re.M)
    assert f"{PAIR_MESSAGE}, and {REQUIRE_ENV} requires it" in out
    folder_message = f"fake_stray is not installed ({_only_a_folder(tmp_path / 'fake_stray')})"
    assert _summary_line("SKIPPED", 20, folder_message).search(out), out
    assert re.search(r"^FAILED \S*test_generated\.py::test_folder_required\b", out, re.M)
    assert f"{folder_message}, and {REQUIRE_ENV} requires it" in out
