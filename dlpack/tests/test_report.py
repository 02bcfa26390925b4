"""The environment report, ``python -m dlpack``."""

import dlpack

from ._helpers import optional, run_python


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
    assert "Traceback" not in proc.stderr


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
