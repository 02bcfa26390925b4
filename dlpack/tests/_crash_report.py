"""Keeps Python's fault handler in charge of fatal signals for every test, so a crash still names
the test and prints each thread's Python stack.

pytest enables :mod:`faulthandler` once, at the start of the session; a library loaded later may
install its own handler over it. tvm-ffi does, whenever ``libtvm_ffi.so`` is loaded: its SIGSEGV
handler writes a native backtrace to file descriptor 2, which pytest's capture holds and a crash
throws away, so the run ended with no word at all. ``ray.init`` installs ray's, and
``ray.shutdown`` leaves the default (no word either). Here Python's handler is put back (onto
stderr as it was when the session started) before each test and after an import
:func:`need` or :func:`optional` makes loads a module.
The suite's conftest calls :func:`arm`, :func:`rearm` and :func:`disarm`.
"""

from __future__ import annotations

import faulthandler
import os
import sys

import pytest

# A duplicate of stderr as the session started, before any test's capture (faulthandler
# writes to a file descriptor, which must stay open while it is armed).
_fd: int | None = None
# How many modules were loaded when the handler was last put back: only a load can replace it
# within a test.
_modules_seen = 0


def arm(config: pytest.Config) -> None:
    """Take over from pytest's own faulthandler plugin, when it is on."""
    global _fd
    if _fd is not None or not config.pluginmanager.has_plugin("faulthandler"):
        return  # armed already, or `-p no:faulthandler` asked for none
    try:
        fileno = sys.stderr.fileno()
    except (AttributeError, ValueError):  # stderr replaced by an object without a descriptor
        if sys.__stderr__ is None:
            return
        fileno = sys.__stderr__.fileno()
    _fd = os.dup(fileno)
    rearm()


def rearm() -> None:
    """Put Python's handler back in front of the fatal signals (a library may have replaced
    it): `enable` alone keeps whatever replaced it, so the handler is disabled first."""
    global _modules_seen
    if _fd is None or not faulthandler.is_enabled():
        return  # not armed here, or someone turned it off on purpose
    _modules_seen = len(sys.modules)
    faulthandler.disable()
    faulthandler.enable(file=_fd, all_threads=True)


def rearm_after_import() -> None:
    """:func:`rearm`, where a module was loaded since it last ran (a library imported by
    :func:`need` or :func:`optional` may have loaded one that replaced the handler)."""
    if len(sys.modules) != _modules_seen:
        rearm()


def disarm() -> None:
    """Before pytest's plugin restores the handler the process had: off, and our stderr
    closed."""
    global _fd
    if _fd is None:
        return
    faulthandler.disable()
    os.close(_fd)
    _fd = None
