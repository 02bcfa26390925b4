"""dlpack's own test suite, shipped with the package so it can check any environment.

``import dlpack.tests; dlpack.tests.run()`` (or ``python -m dlpack.tests``) runs it against
whatever array libraries are importable here; a missing library or device is a skip with its
reason. With pytest installed it is pytest underneath; without it, a small built-in runner runs
the same tests (see :mod:`dlpack.tests._runner`).
"""

from __future__ import annotations

__all__ = ["run"]


def run(*args: str, use_pytest: bool | None = None, package: str = "dlpack.tests") -> int:
    """Run the test suite; return an exit status: **0 on success** (falsy), nonzero on failure.

    ``args`` are command-line arguments, as for ``python -m dlpack.tests``: with pytest they
    pass through to it (``-k EXPR``, ``-x``, ``-v``, ``-q``, ``-rs``, ...); test modules may be
    named as ``test_matrix.py`` or ``test_matrix.py::test_exchange``. The built-in runner
    understands ``-k``, ``-m``, ``-x``, ``--maxfail``, ``-v``, ``-q``, ``-s``, ``--tb``,
    ``--collect-only`` and test module names, and accepts (ignoring) pytest options that only
    tune pytest itself. A list may be passed instead of separate strings.

    ``use_pytest``: None (default) uses pytest when it can be imported and the built-in runner
    otherwise; False always uses the built-in runner; True requires pytest
    (ModuleNotFoundError without it).

    ``package``: the package whose ``test_*`` modules are run (for testing the runner itself).

    The exit status follows pytest's: 0 all selected tests passed or were skipped, 1 some test
    failed (for the built-in runner: also a test module that fails to import), 2 interrupted,
    4 usage error, 5 no tests were collected. The built-in runner ends with the line
    ``N passed, N failed, N skipped``.
    """
    from ._runner import run as _run

    return _run(args, use_pytest=use_pytest, package=package)
