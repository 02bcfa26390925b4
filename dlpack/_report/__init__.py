"""The environment report of ``python -m dlpack``, and the provider/consumer catalog it shares
with the test suite (``dlpack/tests/test_matrix.py``).

A *provider* makes a small array in some library (or a stdlib buffer); ``asdlpack`` wraps it; a
*consumer* takes the ``DLPackObject`` with its ``from_dlpack``. :func:`exchange` runs one such
exchange and says whether it worked zero-copy (the consumer's data pointer is the source's), with
a copy (same values, other memory), or failed (and why). Every library import is guarded: a
library that is missing is "not installed", one that fails to import is reported as broken, one
that crashes the interpreter when imported (found by :mod:`dlpack._probe` in child processes,
before any of them is imported here) is never imported, and none of them stops the report.
"""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Callable
from typing import TextIO

from .. import _probe
from ._consumers import CONSUMERS, DEVICES, Consumer, pairs
from ._exchange import Outcome, exchange
from ._libraries import (
    REPORTED,
    TEST_TOOLS,
    Library,
    Unavailable,
    cuda_devices,
    cupy_cuda,
    jax_gpu,
    label,
    library,
    need,
    numba_cuda,
    short_error,
    torch_cuda,
    version,
)
from ._providers import PROVIDERS, Provider, PyBufferView, Sample, buffer_address

__all__ = [
    "CONSUMERS",
    "DEVICES",
    "PROVIDERS",
    "Consumer",
    "Library",
    "Outcome",
    "Provider",
    "PyBufferView",
    "Sample",
    "Unavailable",
    "cuda_devices",
    "cupy_cuda",
    "exchange",
    "jax_gpu",
    "label",
    "library",
    "need",
    "numba_cuda",
    "pairs",
    "report",
    "torch_cuda",
    "version",
]

# ---------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        (indent + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True))).rstrip()
        for r in rows
    ]


def _hello(lines: list[str]) -> bool:
    """The one-line demo, and a check that our own extension works; False when it doesn't."""
    from dlpack import asdlpack

    source = bytearray(b"Hello!")
    try:
        view = asdlpack(source)
        ok = (
            view.shape == (6,) and view.dtype == "uint8" and view.data_ptr == buffer_address(source)
        )
        capsule_ok = type(view.__dlpack__(max_version=(1, 0))).__name__ == "PyCapsule"
    except Exception as exc:  # noqa: BLE001
        lines.append(f"asdlpack(bytearray(b'Hello!')) FAILED: {short_error(exc, 200)}")
        return False
    if not (ok and capsule_ok):
        lines.append(f"asdlpack(bytearray(b'Hello!')) gives a wrong view: {view!r}")
        return False
    shown = False
    for module, call in (("numpy", "numpy.from_dlpack"), ("torch", "torch.from_dlpack")):
        lib = library(module)
        if not lib.ok:
            continue
        try:
            result = lib.module.from_dlpack(asdlpack(source))
            text = bytes(int(x) for x in result.tolist()).decode()
        except Exception as exc:  # noqa: BLE001
            lines.append(f"{call}(asdlpack(bytearray(b'Hello!'))) FAILED: {short_error(exc)}")
            continue
        lines.append(f"{call}(asdlpack(bytearray(b'Hello!'))) -> {text!r}")
        shown = True
    if not shown:
        lines.append(f"asdlpack(bytearray(b'Hello!')) -> {view!r}")
    return True


def report(out: TextIO | None = None) -> int:
    """Print the report; return the exit status (0 unless dlpack itself is broken)."""
    out = out or sys.stdout
    started = time.perf_counter()

    def say(line: str = "") -> None:
        print(line, file=out)
        out.flush()

    try:
        import dlpack
        from dlpack import DLPACK_VERSION, __version__
    except Exception as exc:  # noqa: BLE001
        say(f"dlpack is broken here: {short_error(exc, 300)}")
        return 1
    say(
        f"dlpack-adapter {__version__} (DLPack {DLPACK_VERSION[0]}.{DLPACK_VERSION[1]}) "
        f"at {dlpack.__path__[0]}"
    )
    say(
        f"Python {platform.python_version()} ({platform.python_implementation()}) "
        f"on {platform.system()} {platform.machine()}"
    )
    say()
    hello: list[str] = []
    ours_ok = _hello(hello)
    for line in hello:
        say(line)
    say()

    say("Array libraries:")
    rows = []
    extra = [(name, name) for name in _probe.extra_names()]
    for module, shown in REPORTED + TEST_TOOLS + extra:
        lib = library(module)
        rows.append([shown, lib.describe()])
    for line in _table(rows):
        say(line)
    if not library("pytest").ok:
        say('  (`python -m dlpack.tests` needs pytest: pip install "dlpack-adapter[test]")')
    say()

    cuda, how = cuda_devices()
    say("Devices:")
    say("  cpu")
    say(f"  cuda  {how}")
    say()

    notes: dict[str, int] = {}
    for device in DEVICES:
        if device == "cuda" and not cuda:
            continue
        _exchange_table(device, say, notes)
    if notes:
        say("Notes:")
        for reason, n in notes.items():
            say(f"  [{n}] {reason}")
        say()
    say("zero-copy: the consumer's array uses the source's memory; copy: same values, other")
    say("memory; fails [n]: see note n; - [n]: not tried, see note n.")
    say("`python -m dlpack.tests` runs the test suite against these libraries.")
    say(f"(report made in {time.perf_counter() - started:.1f}s)")
    return 0 if ours_ok else 1


def _exchange_table(device: str, say: Callable[[str], None], notes: dict[str, int]) -> None:
    providers = [p for p in PROVIDERS if device in p.devices and _present(p.module)]
    consumers = [c for c in CONSUMERS if device in c.devices and _present(c.module)]
    say(
        f"{device.upper()} exchanges, from_dlpack(asdlpack(x)): "
        "rows make x, columns consume it (2x3 float32, or 6 bytes)"
    )
    used_here = [x.module for x in PROVIDERS + CONSUMERS if device in x.devices and x.module]
    for module in dict.fromkeys(used_here):
        if library(module).status == "crashes":
            say(f"  (left out: {library(module).error})")
    if not consumers:
        say("  (no consumer library is installed: numpy, torch, jax, cupy, ...)")
        say("")
        return
    rows = [["provider \\ consumer"] + [c.name for c in consumers]]
    for p in providers:
        row = [p.name]
        for c in consumers:
            o = exchange(p, c, device)
            if o.status == "fails":
                n = notes.setdefault(o.reason, len(notes) + 1)
                row.append(f"fails [{n}]")
            elif o.status == "skip":
                n = notes.setdefault(f"not tried: {o.reason}", len(notes) + 1)
                row.append(f"- [{n}]")
            else:
                row.append(o.status)
        rows.append(row)
    for line in _table(rows):
        say(line)
    say("")


def _present(module: str | None) -> bool:
    return module is None or library(module).ok
