"""Libraries that crash the interpreter when imported (``dlpack._probe``): found in child
processes, never imported by the report or the test suite, their tests skipped (or failed where
``DLPACK_TESTS_REQUIRE`` names them) while everything else runs.

The crashing libraries are fakes written to a temporary folder: one that kills its process when
imported, and two that import alone but kill the process when both are imported.
"""

import re
import textwrap

import pytest

from dlpack import _probe

from ._helpers import REQUIRE_ENV, run_python

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
        "fake_abort_at_exit",
    ]
    crashes = _probe.probe(names, timeout=60)
    assert {name: crash.message() for name, crash in crashes.items()} == {
        "fake_crash_alone": ALONE_MESSAGE,
        "fake_crash_b": PAIR_MESSAGE,
        "fake_exit_status": "fake_exit_status crashes the interpreter when imported: exit status 3",
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


def test_probe_reports_a_hang(fakes):
    crashes = _probe.probe(["fake_fine", "fake_hang"], timeout=2)
    assert {name: crash.how for name, crash in crashes.items()} == {
        "fake_hang": "no result after 2 s"
    }


def _library_rows(report: str) -> dict[str, str]:
    """The report's "Array libraries:" table: name -> what it says."""
    table = report.partition("Array libraries:\n")[2].partition("\n\n")[0]
    return dict(line.split(None, 1) for line in table.splitlines())


def test_report_survives_broken_and_crashing_libraries(tmp_path):
    # A library that raises when imported, one whose submodule needs a missing dependency (as
    # mlx.core may), and the crashing fakes, all in one report; named so that no real library
    # can stand in for them, and listed by DLPACK_PROBE_EXTRA.
    broken = tmp_path / "fake_raising"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise RuntimeError('broken on purpose')\n")
    half = tmp_path / "fake_half"
    half.mkdir()
    (half / "__init__.py").write_text("")
    (half / "core.py").write_text("import no_such_dependency_of_fake_half\n")
    for name in CRASHING.split(","):
        (tmp_path / f"{name}.py").write_text(FAKES[name])
    extra = f"fake_raising,fake_half.core,{CRASHING}"
    proc = run_python("-m", "dlpack", path=[tmp_path], env={_probe.EXTRA_ENV: extra})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _library_rows(proc.stdout)
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
    """
)


def _summary_line(outcome, line, message):
    """pytest's -rs line for a skip at ``line`` of the generated file (its path is relative)."""
    return re.compile(
        rf"^{outcome} \[1\] \S*test_generated\.py:{line}: {re.escape(message)}$", re.M
    )


def test_pytest_skips_or_fails_the_tests_of_crashing_libraries(tmp_path):
    """A pytest run with crashing libraries: their tests skip with the reason (or fail, where
    required), the others pass, and the run itself ends normally."""
    for name in CRASHING.split(","):
        (tmp_path / f"{name}.py").write_text(FAKES[name])
    test_file = tmp_path / "test_generated.py"
    test_file.write_text(GENERATED_TESTS)
    env = {_probe.EXTRA_ENV: CRASHING, REQUIRE_ENV: ""}
    args = ["-m", "pytest", "-rsf", "-p", "no:cacheprovider", str(test_file)]
    proc = run_python(*args, path=[tmp_path], env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed, 1 passed, 2 skipped" in out
    assert _summary_line("SKIPPED", 5, ALONE_MESSAGE).search(out), out
    assert _summary_line("SKIPPED", 9, PAIR_MESSAGE).search(out), out
    assert re.search(r"^FAILED \S*test_generated\.py::test_crash_pair_required\b", out, re.M)
    assert f"{PAIR_MESSAGE}, and {REQUIRE_ENV} requires it" in out
