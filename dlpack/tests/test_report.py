"""The environment report, ``python -m dlpack``."""

import json
import os
import platform
import pty
import re
import subprocess
import sys
import tempfile

import pytest

import dlpack
from dlpack import _probe
from dlpack._report import _terminal

from ._helpers import (
    LONG_PATH,
    child_env,
    leave_out_heavy_libraries,
    need,
    optional,
    package_root,
    run_python,
)


def test_report_runs_and_shows_the_table():
    proc = run_python("-m", "dlpack")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"dlpack-adapter {dlpack.__version__}" in out
    assert f"DLPack {dlpack.DLPACK_VERSION[0]}.{dlpack.DLPACK_VERSION[1]}" in out
    assert "Array libraries:" in out and "Devices:" in out
    assert "CPU exchanges" in out
    if optional("numpy") is not None:  # numpy says hello and is a consumer in the table
        assert "numpy.from_dlpack(asdlpack(bytearray(b'Hello!'))) -> 'Hello!'" in out
        assert "provider \\ consumer" in out
    if "provider \\ consumer" in out:
        row = next(line for line in out.splitlines() if line.strip().startswith("bytearray"))
        assert "zero-copy" in row
    else:
        assert "no consumer library is installed" in out
    # the columns that take Arrow, named under the table
    arrow = [n for n in ("pyarrow", "polars", "pandas", "duckdb", "nanoarrow") if optional(n)]
    if arrow:
        assert f"Columns {', '.join(arrow)} take x through the Arrow PyCapsule interface." in out
    assert "Traceback" not in proc.stderr
    assert "\x1b[K" not in proc.stderr  # no progress line where stderr is no terminal


def test_exchange_never_raises():
    from dlpack._report import Consumer, Provider, exchange
    from dlpack._report._providers import _bytearray

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


def test_help_comes_from_argparse():
    proc = run_python("-m", "dlpack", "--help")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("usage: python -m dlpack [-h]")
    assert "A report of this environment." in proc.stdout
    assert "Array libraries:" not in proc.stdout  # help only, no report
    assert run_python("-m", "dlpack", "-h").stdout == proc.stdout


def test_unknown_option_is_a_usage_error():
    proc = run_python("-m", "dlpack", "--no-such-option")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "unrecognized arguments: --no-such-option" in proc.stderr
    assert proc.stdout == ""


ONLY_FOLDERS = "only (a folder|folders) of that name: "

# What native libraries write to descriptor 2: glog/absl lines (before and after absl's logging is
# set up) and TensorFlow's, then one line that is no log and must reach the user.
NATIVE_LOGS = (
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    b"I0000 00:00:1795619464.957895   12514 port.cc:153] oneDNN custom operations are on.\n"
    b"W1125 14:03:07.123456  4242 fake_native.cc:42] fake native warning\n"
    b"2026-01-01 12:00:00.000000: I tensorflow/core/util/port.cc:113] fake tensorflow line\n"
    b"fake_native_logs: this line is not a log\n"
)


@pytest.fixture(scope="module")
def json_report():
    """``python -m dlpack --json`` with a terminal on stderr: (exit status, stdout, what the
    terminal got)."""
    leader, follower = pty.openpty()
    # stdout to a file: a pipe could fill up while the terminal is read
    with tempfile.TemporaryFile() as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dlpack", "--json"],
            cwd=package_root(),
            env=child_env(),
            stdout=stdout,
            stderr=follower,
        )
        os.close(follower)
        terminal = bytearray()
        while True:  # until the child closes the terminal (EIO)
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            terminal += chunk
        returncode = proc.wait(timeout=300)
        os.close(leader)
        stdout.seek(0)
        return returncode, stdout.read().decode(), terminal.decode(errors="replace")


def test_json_report_describes_libraries_and_exchanges(json_report):
    returncode, stdout, terminal = json_report
    assert returncode == 0, stdout + terminal
    doc = json.loads(stdout)  # the document and nothing else
    assert doc["schema"] == 1
    ours = doc["dlpack_adapter"]
    assert ours["version"] == dlpack.__version__ and ours["works"] is True
    assert ours["dlpack_version"] == "{}.{}".format(*dlpack.DLPACK_VERSION)
    assert doc["python"]["version"] == platform.python_version()
    libraries = {lib["name"]: lib for lib in doc["libraries"]}
    for lib in libraries.values():
        assert set(lib) == {"name", "module", "status", "version", "error"}
        assert lib["status"] in ("ok", "missing", "broken", "crashes")
        if lib["status"] == "missing":  # a folder of its name, where one is on sys.path
            assert lib["error"] is None or re.match(ONLY_FOLDERS, lib["error"])
        else:
            assert (lib["error"] is None) == (lib["status"] == "ok")
    listed = {"numpy", "torch", "jax", "tensorflow", "paddle", "pytest"}
    assert listed | {"polars", "pandas", "duckdb", "nanoarrow"} <= set(libraries)
    assert doc["devices"]["cpu"] == {"available": True}
    assert isinstance(doc["devices"]["cuda"]["available"], bool)
    exchanges = {(e["device"], e["provider"], e["consumer"]): e for e in doc["exchanges"]}
    for e in exchanges.values():
        assert e["status"] in ("zero-copy", "copy", "fails", "skip")
        assert (e["reason"] is None) == (e["status"] in ("zero-copy", "copy"))
    np = need("numpy")
    torch = need("torch")
    for name, module in (("numpy", np), ("torch", torch)):
        assert libraries[name]["status"] == "ok"
        assert libraries[name]["version"] == module.__version__
    for provider in ("bytearray", "numpy", "torch"):
        for consumer in ("numpy", "torch"):
            assert exchanges["cpu", provider, consumer]["status"] == "zero-copy"


DATAFRAMES = ("pyarrow", "polars", "pandas", "duckdb", "nanoarrow")


def test_json_report_has_the_dataframe_world(json_report):
    """Columns of the dataframe libraries are rows (through their Arrow export), and the
    libraries are columns (taking the Arrow PyCapsule interface)."""
    _, stdout, _ = json_report
    modules = {name: need(name) for name in ("numpy", *DATAFRAMES)}
    doc = json.loads(stdout)
    libraries = {lib["name"]: lib for lib in doc["libraries"]}
    for name in DATAFRAMES:
        assert libraries[name]["status"] == "ok"
        assert libraries[name]["version"] == modules[name].__version__
    cpu = [e for e in doc["exchanges"] if e["device"] == "cpu"]
    exchanges = {(e["provider"], e["consumer"]): e["status"] for e in cpu}
    for name in ("polars", "pandas", "nanoarrow", "pyarrow-stream"):
        assert exchanges[name, "numpy"] == "zero-copy"
    for name in ("pyarrow", "polars", "nanoarrow"):
        assert exchanges["numpy", name] == "zero-copy"
        assert exchanges["bytes", name] == "zero-copy"  # Arrow memory is read-only anyway
    # a query result is a table (one copy into rows x columns), and DuckDB keeps its own memory
    assert exchanges["duckdb", "numpy"] == exchanges["numpy", "duckdb"] == "copy"
    assert exchanges["bytearray", "pandas"] == "copy"  # into pandas' own block


def test_report_survives_broken_and_crashing_dataframe_libraries(tmp_path):
    """Fakes first on the path: a polars that raises when imported, a DuckDB that kills the
    interpreter (the probe must know it, or the report dies importing it), a pandas that raises
    ImportError. The report lists them so, leaves their rows and columns out, and the rest runs.
    (torch, JAX and the other slow imports are left out: none of this is about them.)"""
    need("numpy")
    need("nanoarrow")
    leave_out_heavy_libraries(tmp_path)
    (tmp_path / "polars").mkdir()
    (tmp_path / "polars" / "__init__.py").write_text("raise RuntimeError('broken on purpose')\n")
    (tmp_path / "duckdb.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    (tmp_path / "pandas.py").write_text("raise ImportError('broken on purpose')\n")
    # started in tmp_path: the current folder comes first on sys.path, and a child started in
    # site-packages (where the package root is, installed) would import the real libraries
    proc = run_python("-m", "dlpack", "--json", path=[tmp_path], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    libraries = {lib["name"]: lib for lib in doc["libraries"]}
    assert libraries["polars"]["status"] == "broken"
    assert libraries["polars"]["error"] == "RuntimeError: broken on purpose"
    assert libraries["pandas"]["status"] == "broken"
    assert libraries["duckdb"]["status"] == "crashes"
    assert "signal 11 (SIGSEGV)" in libraries["duckdb"]["error"]
    assert libraries["nanoarrow"]["status"] == "ok"
    exchanges = {(e["provider"], e["consumer"]): e["status"] for e in doc["exchanges"]}
    named = {name for pair in exchanges for name in pair}
    assert not named & {"polars", "pandas", "duckdb"}
    assert exchanges["nanoarrow", "numpy"] == exchanges["numpy", "nanoarrow"] == "zero-copy"


def test_progress_shows_on_a_terminal(json_report):
    _, _, terminal = json_report
    assert "\r\x1b[Kimporting numpy..." in terminal
    assert "\r\x1b[Kcpu: bytearray -> memoryview..." in terminal
    # cleared when done
    assert terminal.rpartition("...")[2].startswith("\r\x1b[K"), terminal[-300:]
    # and no library's native log lines there (TensorFlow's, where it is installed)
    assert not [line for line in terminal.splitlines() if _terminal.is_native_log(line)]


def test_native_log_lines_stay_off_stderr():
    """What goes to descriptor 2 while the report works: native logs dropped, the rest kept."""
    code = (
        "import os, sys\n"
        "from dlpack._report._terminal import native_stderr_kept_aside\n"
        "with native_stderr_kept_aside() as real:\n"
        f"    os.write(2, {NATIVE_LOGS!r})\n"
        "    print('python stderr line', file=sys.stderr)\n"
        "    real.write('said on the real stderr\\n')\n"
        "print('stdout line')\n"
    )
    proc = run_python("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "stdout line\n"
    assert proc.stderr.splitlines() == [
        "said on the real stderr",
        "fake_native_logs: this line is not a log",
        "python stderr line",
    ]


def test_json_is_alone_on_stdout_when_libraries_print(tmp_path):
    """A library that prints when imported (print, a native write, C's buffered printf): its
    lines go to stderr, stdout is the JSON document alone."""
    (tmp_path / "fake_prints.py").write_text(
        "import ctypes, os\n"
        "print('fake_prints: print')\n"
        "os.write(1, b'fake_prints: native write\\n')\n"
        "ctypes.CDLL(None).printf(b'fake_prints: printf\\n')\n"
    )
    # slow to import, and no part of this; started in tmp_path, where the stand-ins come first
    leave_out_heavy_libraries(tmp_path)
    env = {_probe.EXTRA_ENV: "fake_prints"}
    proc = run_python("-m", "dlpack", "--json", path=[tmp_path], env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    libraries = {lib["name"]: lib["status"] for lib in doc["libraries"]}
    assert libraries["fake_prints"] == "ok"
    for line in ("print", "native write", "printf"):
        assert f"fake_prints: {line}\n" in proc.stderr


def test_report_takes_a_long_sys_path(tmp_path):
    """sys.path longer than one command-line argument may be (~150 KB): the probe's children
    get it all the same."""
    code = f"{LONG_PATH}; from dlpack.__main__ import main; sys.exit(main())"
    # slow to import, and no part of this; started in tmp_path, where the stand-ins come first
    leave_out_heavy_libraries(tmp_path)
    env = {_probe.KNOWN_ENV: ""}  # nothing handed down: it probes
    proc = run_python("-c", code, path=[tmp_path], env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CPU exchanges" in proc.stdout
    assert "Traceback" not in proc.stderr


# A child that would probe: it says whether it did, and what it found.
PROBING_CHILD = """
import json
from dlpack import _probe
from dlpack._report import _terminal
from dlpack._report._libraries import PROBED
probed = []
_probe.probe = lambda names, timeout: probed.append(list(names)) or {}
found = _probe.crashes(PROBED)
print(json.dumps({"probed": bool(probed), "crashes": sorted(found)}))
"""


# A parent that probes (a stand-in probe: the first candidate "crashes") and starts the probing
# child with what it hands down; it says what it found and what the child said.
PROBING_PARENT = """
import json, os, subprocess, sys
from dlpack import _probe
from dlpack._report._libraries import PROBED
os.environ.pop(_probe.KNOWN_ENV, None)  # the stand-in below probes, not the test process
_probe.probe = lambda names, timeout: {n: _probe.Crash(n, "a stand-in crash") for n in names[:1]}
found = _probe.crashes(PROBED)
env = dict(os.environ, **_probe.handed_down())
child = subprocess.run([sys.executable, "-c", sys.argv[1]], env=env, capture_output=True,
                       text=True, check=True)
print(json.dumps({"parent": sorted(found), "child": json.loads(child.stdout)}))
"""


def test_a_child_takes_the_probe_handed_down(tmp_path):
    # In a parent of its own (the test process's probe depends on what ran before it).
    done = json.loads(run_python("-c", PROBING_PARENT, PROBING_CHILD).stdout)
    assert done["child"] == {"probed": False, "crashes": done["parent"]}
    # another candidate (first, as extras are): the child probes again
    (tmp_path / "fake_fine.py").write_text("")
    env = {_probe.EXTRA_ENV: "fake_fine"}
    child = json.loads(run_python("-c", PROBING_CHILD, path=[tmp_path], env=env).stdout)
    assert child == {"probed": True, "crashes": []}


# A parent that probes (nothing crashes) and starts the probing child in the folder given.
PARENT_ELSEWHERE = """
import json, os, subprocess, sys
from dlpack import _probe
from dlpack._report._libraries import PROBED
os.environ.pop(_probe.KNOWN_ENV, None)
_probe.probe = lambda names, timeout: {}
_probe.crashes(PROBED)
env = dict(os.environ, **_probe.handed_down())
child = subprocess.run([sys.executable, "-c", sys.argv[1]], env=env, cwd=sys.argv[2],
                       capture_output=True, text=True, check=True)
print(child.stdout)
"""


def test_a_namespace_package_on_the_path_twice_is_one_place(tmp_path):
    # A namespace package (as mlx is, with mlx.core in it) lists every sys.path entry it is
    # under: the child, started in a folder that is on its PYTHONPATH too, has that folder on
    # sys.path twice (as the current directory, and by name), as a child started in
    # site-packages has site-packages; it must still see the parent's places and take its probe.
    (tmp_path / "fake_namespace").mkdir()
    (tmp_path / "fake_namespace" / "core.py").write_text("")
    env = {_probe.EXTRA_ENV: "fake_namespace.core"}
    proc = run_python("-c", PARENT_ELSEWHERE, PROBING_CHILD, tmp_path, path=[tmp_path], env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"probed": False, "crashes": []}


def test_a_folder_of_a_library_name_beside_a_child_leaves_it_the_probe(tmp_path):
    # A child started in a folder holding an empty folder of a library's name (an empty paddle/)
    # finds the same libraries as its parent, which does not see that folder: it is none.
    (tmp_path / "fake_stray").mkdir()
    env = {_probe.EXTRA_ENV: "fake_stray"}
    proc = run_python("-c", PARENT_ELSEWHERE, PROBING_CHILD, tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"probed": False, "crashes": []}
