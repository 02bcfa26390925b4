import gc
import sys
from collections import Counter

import pytest

from dlpack import _probe

from . import _crash_report
from ._helpers import REQUIRABLE_SKIPS, REQUIRE_ENV, need


def pytest_report_header(config):
    try:
        import dlpack

        where = dlpack.__file__
    except Exception as exc:  # pragma: no cover - reported, not hidden
        where = f"IMPORT FAILED: {exc!r}"
    return [f"dlpack: {where}", f"python: {sys.version.split()[0]}"]


_NOTIFY_BEFORE = pytest.StashKey()


@pytest.hookimpl(trylast=True)  # after pytest's faulthandler plugin (see _crash_report)
def pytest_configure(config):
    """The crash probe's notices (a library import it is still waiting for, in a child process)
    shown when they come, past the capture of the test that asked for the library; Python's
    fault handler kept in charge of crashes (:mod:`._crash_report`)."""
    _crash_report.arm(config)
    capture = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if capture is None or reporter is None:  # stderr, as without pytest
        return

    def notify(line):
        with capture.global_and_fixture_disabled():
            reporter.write_line(line)

    config.stash[_NOTIFY_BEFORE] = _probe.set_notify(notify)


# How many modules were imported when the collector last had its objects frozen.
_FROZEN_AT = [0]


def _freeze_imports():
    """What was imported (torch, JAX, pyarrow: some 300,000 objects) moved out of the collector's
    sight: the many ``gc.collect()`` calls of the lifetime and refcount tests then walk only what
    the tests made, instead of 0.7 s each (a third of the suite's time, in 6,700 calls)."""
    if len(sys.modules) > _FROZEN_AT[0]:
        gc.collect()
        gc.freeze()
        _FROZEN_AT[0] = len(sys.modules)


def pytest_collection_finish(session):
    _freeze_imports()


@pytest.hookimpl(tryfirst=True)  # before pytest's faulthandler plugin restores the original
def pytest_unconfigure(config):
    # given back to the collector, so the interpreter's exit frees them as it would have
    # (nanobind's types, triton's under torch, count what is never freed as leaked)
    gc.unfreeze()
    _crash_report.disarm()
    previous = config.stash.get(_NOTIFY_BEFORE, None)
    if previous is not None:
        _probe.set_notify(previous)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup():
    _crash_report.rearm()
    # Libraries tests import later (polars, duckdb, tvm-ffi, TensorFlow...) too, between tests:
    # before this test's fixtures, not during a test, whose objects it must still collect.
    _freeze_imports()


def pytest_terminal_summary(terminalreporter):
    """Lists apart the skips DLPACK_TESTS_REQUIRE can't turn into failures (a platform, a
    library version's feature, hardware other than a GPU), so a run that requires everything
    still says what it did not check."""
    reasons = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        if not (isinstance(longrepr, tuple) and len(longrepr) == 3):
            continue
        reason = str(longrepr[2]).removeprefix("Skipped: ")
        if reason not in REQUIRABLE_SKIPS:
            reasons[reason] += 1
    if not reasons:
        return
    terminalreporter.section(f"skips {REQUIRE_ENV} can't turn into failures", sep="-")
    for reason, count in reasons.most_common():
        terminalreporter.line(f"{count:4d} {reason}")


@pytest.fixture
def np():
    return need("numpy")


@pytest.fixture
def x64():
    """Run a test with JAX's 64-bit types enabled."""
    jax = need("jax")
    with jax.enable_x64(True):
        yield
