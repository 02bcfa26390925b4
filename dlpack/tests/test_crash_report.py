"""A crash in a test prints Python's fault report (the test, each thread's stack) although a
library loaded before it replaced Python's SIGSEGV handler (see ``_crash_report``)."""

import signal
import textwrap

import pytest

from ._helpers import need, run_python

# A test module that crashes after something replaced the handler, when its module was imported
# (as libraries are, at collection).
CRASHES = """
import ctypes

{replace}

def test_reads_address_zero():
    ctypes.string_at(0)
"""

REPLACE = {
    # what any library's own handler amounts to here: not Python's
    "libc signal()": "ctypes.CDLL(None).signal(11, ctypes.c_void_p(0))  # SIG_DFL",
    # libtvm_ffi.so's constructor installs its handler, writing to the captured stderr
    "tvm_ffi": "import tvm_ffi",
}


@pytest.mark.parametrize("how", list(REPLACE))
def test_a_crash_after_a_library_replaced_the_handler_is_reported(tmp_path, how):
    if how == "tvm_ffi":
        need("tvm_ffi")
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    # the suite's own hooks, as dlpack/tests/conftest.py has them
    (pkg / "conftest.py").write_text(
        "from dlpack.tests.conftest import pytest_configure, pytest_runtest_setup, "
        "pytest_unconfigure  # noqa: F401\n"
    )
    (pkg / "test_crash.py").write_text(textwrap.dedent(CRASHES.format(replace=REPLACE[how])))
    proc = run_python("-m", "pytest", "-q", "-p", "no:cacheprovider", "fakepkg", cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == -signal.SIGSEGV, output
    assert "Fatal Python error: Segmentation fault" in proc.stderr, output
    assert 'test_crash.py", line 7 in test_reads_address_zero' in proc.stderr, output
