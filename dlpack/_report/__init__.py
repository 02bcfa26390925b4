"""The environment report of ``python -m dlpack``, and the provider/consumer catalog it shares
with the test suite (``dlpack/tests/test_matrix.py``).

A *provider* makes a small array in some library (or a stdlib buffer, or a dataframe column that
speaks the Arrow PyCapsule interface); ``asdlpack`` wraps it; a *consumer* takes the
``DLPackObject`` with its ``from_dlpack`` (or through the buffer protocol, an array interface or
the Arrow PyCapsule interface, for libraries that take those). :func:`exchange` runs one such
exchange and says whether it worked zero-copy (the consumer's data pointer is the source's), with
a copy (same values, other memory), or failed (and why). Every library import is guarded: a
library that is missing is "not installed" (as is a mere folder of its name, which Python would
import as a namespace package), one that fails to import is reported as broken, one
that crashes the interpreter when imported (found by :mod:`dlpack._probe` in child processes,
before any of them is imported here) is never imported, and none of them stops the report.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from .. import _probe
from ._consumers import CONSUMERS, DEVICES, Consumer, pairs
from ._engine import engine_facts, engine_lines
from ._exchange import Outcome, exchange
from ._libraries import (
    PROBED,
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
from ._terminal import Progress, native_stderr_kept_aside, stdout_to_stderr

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


@dataclass
class _Row:
    provider: Provider
    outcomes: list[tuple[Consumer, Outcome]]


@dataclass
class _Device:
    name: str
    left_out: list[str]  # why crashing libraries were left out
    consumers: list[Consumer]
    rows: list[_Row]


@dataclass
class _Findings:
    version: str
    dlpack_version: tuple[int, int]
    path: str
    hello: list[str]
    ours_ok: bool
    libraries: list[tuple[str, Library]]  # (shown name, how it imported)
    cuda: bool
    cuda_how: str
    devices: list[_Device] = field(default_factory=list)
    copy_engine: dict[str, Any] = field(default_factory=dict)


def report(out: TextIO | None = None, *, as_json: bool = False) -> int:
    """Print the report (a JSON document with ``as_json``); return the exit status (0 unless
    dlpack itself is broken). Native libraries' log lines stay off stderr while it runs, what
    libraries print goes to stderr (``out`` gets the report alone), and a terminal on stderr
    shows what it is doing; a library import the crash probe waits on is named on stderr."""
    out = out or sys.stdout
    started = time.perf_counter()
    try:
        import dlpack
        from dlpack import DLPACK_VERSION, __version__
    except Exception as exc:  # noqa: BLE001
        if as_json:
            json.dump({"schema": JSON_SCHEMA, "broken": short_error(exc, 300)}, out, indent=2)
            out.write("\n")
        else:
            print(f"dlpack is broken here: {short_error(exc, 300)}", file=out)
        return 1
    with native_stderr_kept_aside() as real_stderr, stdout_to_stderr():
        progress = Progress(real_stderr)
        try:
            with _probe.notices_to(progress.note):
                found = _gather(__version__, DLPACK_VERSION, dlpack.__path__[0], progress)
        finally:
            progress.clear()
    seconds = time.perf_counter() - started
    if as_json:
        json.dump(_as_json(found, seconds), out, indent=2)
        out.write("\n")
    else:
        for line in _as_text(found, seconds):
            print(line, file=out)
    out.flush()
    return 0 if found.ours_ok else 1


def _gather(
    version: str, dlpack_version: tuple[int, int], path: str, progress: Progress
) -> _Findings:
    """Everything the report shows: libraries imported, exchanges run."""
    known = [module for module, _ in REPORTED + TEST_TOOLS]
    progress.show("checking in child processes which libraries import without crashing...")
    _probe.crashes(PROBED)
    hello: list[str] = []
    ours_ok = _hello(hello)
    libraries = []
    extra = [(name, name) for name in _probe.extra_names() if name not in known]
    for module, shown in REPORTED + TEST_TOOLS + extra:
        progress.show(f"importing {shown}...")
        libraries.append((shown, library(module)))
    progress.show("looking for CUDA devices...")
    cuda, how = cuda_devices()
    found = _Findings(version, dlpack_version, path, hello, ours_ok, libraries, cuda, how)
    if ours_ok:
        progress.show("measuring the CPU copy engine...")
        found.copy_engine = engine_facts()
    for device in DEVICES:
        if device == "cuda" and not cuda:
            continue
        found.devices.append(_exchanges(device, progress))
    return found


def _exchanges(device: str, progress: Progress) -> _Device:
    providers = [p for p in PROVIDERS if device in p.devices and _present(p.module)]
    consumers = [c for c in CONSUMERS if device in c.devices and _present(c.module)]
    used_here = [x.module for x in PROVIDERS + CONSUMERS if device in x.devices and x.module]
    left_out = [
        library(module).error
        for module in dict.fromkeys(used_here)
        if library(module).status == "crashes"
    ]
    rows = []
    if consumers:
        for p in providers:
            outcomes = []
            for c in consumers:
                progress.show(f"{device}: {p.name} -> {c.name}...")
                outcomes.append((c, exchange(p, c, device)))
            rows.append(_Row(p, outcomes))
    return _Device(device, left_out, consumers, rows)


def _as_text(found: _Findings, seconds: float) -> list[str]:
    major, minor = found.dlpack_version
    lines = [
        f"dlpack-adapter {found.version} (DLPack {major}.{minor}) at {found.path}",
        f"Python {platform.python_version()} ({platform.python_implementation()}) "
        f"on {platform.system()} {platform.machine()}",
        "",
        *found.hello,
        "",
        "Array libraries:",
        *_table([[shown, lib.describe()] for shown, lib in found.libraries]),
    ]
    if not library("pytest").ok:
        hint = 'pip install "dlpack-adapter[test]"'
        lines.append(f"  (`python -m dlpack.tests` needs pytest: {hint})")
    lines += ["", "Devices:", "  cpu", f"  cuda  {found.cuda_how}", ""]
    if found.copy_engine:
        lines += [*engine_lines(found.copy_engine), ""]
    notes: dict[str, int] = {}
    for device in found.devices:
        lines.append(
            f"{device.name.upper()} exchanges, consumer(asdlpack(x)): "
            "rows make x, columns consume it (2x3 float32, a float32 column, or 6 bytes)"
        )
        lines += [f"  (left out: {why})" for why in device.left_out]
        if not device.consumers:
            lines += ["  (no consumer library is installed: numpy, torch, jax, cupy, ...)", ""]
            continue
        table = [["provider \\ consumer"] + [c.name for c in device.consumers]]
        for row in device.rows:
            cells = [row.provider.name]
            for _, o in row.outcomes:
                if o.status == "fails":
                    n = notes.setdefault(o.reason, len(notes) + 1)
                    cells.append(f"fails [{n}]")
                elif o.status == "skip":
                    n = notes.setdefault(f"not tried: {o.reason}", len(notes) + 1)
                    cells.append(f"- [{n}]")
                else:
                    cells.append(o.status)
            table.append(cells)
        lines += [*_table(table), ""]
    if notes:
        lines.append("Notes:")
        lines += [f"  [{n}] {reason}" for reason, n in notes.items()]
        lines.append("")
    lines += [
        "zero-copy: the consumer's array uses the source's memory; copy: same values, other",
        "memory; fails [n]: see note n; - [n]: not tried, see note n.",
    ]
    # the columns that take no DLPack, where the table has them
    shown = {c.name for device in found.devices for c in device.consumers}
    arrow = [c.name for c in CONSUMERS if c.speaks_arrow and c.name in shown]
    if arrow:
        lines.append(f"Columns {', '.join(arrow)} take x through the Arrow PyCapsule interface.")
    lines += [
        "`python -m dlpack.tests` runs the test suite against these libraries.",
        f"(report made in {seconds:.1f}s)",
    ]
    return lines


# The JSON document's version: raised when a field changes meaning or goes away (new fields may
# come without it).
JSON_SCHEMA = 1


def _as_json(found: _Findings, seconds: float) -> dict[str, Any]:
    major, minor = found.dlpack_version
    return {
        "schema": JSON_SCHEMA,
        "dlpack_adapter": {
            "version": found.version,
            "dlpack_version": f"{major}.{minor}",
            "path": found.path,
            "works": found.ours_ok,
            "hello": found.hello,
        },
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
            "system": platform.system(),
            "machine": platform.machine(),
        },
        "libraries": [
            {
                "name": shown,
                "module": lib.name,
                # "ok", "missing", "broken" (fails to import) or "crashes" (the interpreter)
                "status": lib.status,
                "version": lib.version,
                # why; for "missing", None or the folder that has its name but is no library
                "error": lib.error or None,
            }
            for shown, lib in found.libraries
        ],
        "devices": {
            "cpu": {"available": True},
            "cuda": {"available": found.cuda, "detail": found.cuda_how},
        },
        # dlpack._dlpack._copy_engine(measure=True), or {"error": why}; absent when dlpack's own
        # extension doesn't work
        **({"copy_engine": found.copy_engine} if found.copy_engine else {}),
        # one entry per provider and consumer present here, on each device tried
        "exchanges": [
            {
                "device": device.name,
                "provider": row.provider.name,
                "consumer": consumer.name,
                # "zero-copy", "copy", "fails" or "skip"
                "status": outcome.status,
                "reason": outcome.reason or None,
            }
            for device in found.devices
            for row in device.rows
            for consumer, outcome in row.outcomes
        ],
        "seconds": round(seconds, 3),
    }


def _present(module: str | None) -> bool:
    return module is None or library(module).ok
