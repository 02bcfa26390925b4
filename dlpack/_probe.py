"""Which array libraries crash the interpreter when imported, found in child processes.

In environments with many array libraries, one may kill the process that imports it (a broken
native install), or two may whose native libraries conflict when both are loaded. The report
(``python -m dlpack``) and the test suite ask :func:`crash_of` before importing a library they
know; the first question probes every installed candidate, once per process:

1. one child imports all of them, in the order given (the order the report imports them), and
   says which one it is importing: when that child lives, that is all;
2. when it dies, the library it was importing is the one that crashed. A child imports it alone;
   if that one lives, children (in parallel) import each library before it, then it: the first
   pair that dies names its partner; if none does, the whole group before it is named;
3. the group is imported again without it, until a child lives.

A crash after every import (at interpreter exit) names no library: then each library is imported
alone (in parallel), and the last one is blamed if none of them crashes alone.

A child killed by a signal, ending with a non-zero status, or giving no result within the time
limit counts as a crash. A library that merely raises (ImportError, ...) is not this module's
business: it fails to import in this process as well, and is reported as such.

``DLPACK_PROBE_EXTRA`` (comma-separated import names) adds candidates, imported first.

A process that starts others can hand its result down (:func:`handed_down`, in
``DLPACK_PROBE_KNOWN``): a child with the same interpreter that would probe the same candidates,
found in the same files, takes it instead of probing again (with many large libraries a probe
takes minutes).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

EXTRA_ENV = "DLPACK_PROBE_EXTRA"
KNOWN_ENV = "DLPACK_PROBE_KNOWN"
TIMEOUT_S = 120.0

# The child imports its arguments in order, saying which it starts; an exception is the caller's
# to see later (the library fails to import there too), so only a dying child is news.
_CHILD = """
import importlib, json, sys, warnings
sys.path[:] = json.loads(sys.argv[1])
warnings.simplefilter("ignore")
for name in sys.argv[2:]:
    print("\\ndlpack-probe: importing", name, flush=True)
    try:
        importlib.import_module(name)
    except BaseException:
        pass
print("\\ndlpack-probe: imported all", flush=True)
"""


@dataclass(frozen=True)
class Crash:
    name: str  # the import that died
    how: str  # "signal 11 (SIGSEGV)", "exit status 3", "no result after 120 s"
    together_with: tuple[str, ...] = ()  # imported before it in the same process

    def message(self, label: Callable[[str], str] = str) -> str:
        """``"X crashes the interpreter when imported[ together with Y]: how"``."""
        with_ = ""
        if self.together_with:
            names = [label(n) for n in self.together_with]
            joined = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
            with_ = f" together with {joined}"
        return f"{label(self.name)} crashes the interpreter when imported{with_}: {self.how}"


def extra_names() -> list[str]:
    """The candidates ``DLPACK_PROBE_EXTRA`` adds."""
    return [n.strip() for n in os.environ.get(EXTRA_ENV, "").split(",") if n.strip()]


def installed(name: str) -> bool:
    """Whether the top-level package of ``name`` can be found (nothing is imported); a folder
    without ``__init__.py`` (a namespace package) counts only where a module under it is named
    (``mlx.core``): by its own name it is a stray folder (an empty ``paddle/`` in the current
    folder, Ray's ``/tmp/ray``), no library."""
    top, dot, _ = name.partition(".")
    if top in sys.modules:
        return True
    try:
        spec = importlib.util.find_spec(top)
    except Exception:  # noqa: BLE001 - a finder that fails: let a child find out
        return True
    return spec is not None and (spec.origin is not None or bool(dot))


@dataclass(frozen=True)
class _Death:
    how: str
    started: int  # how many of its imports the child had started
    at_exit: bool  # it finished them all and died on the way out


def _import_in_child(names: Sequence[str], timeout: float) -> _Death | None:
    """How a child importing ``names`` in order died; None when it didn't."""
    argv = [sys.executable, "-c", _CHILD, json.dumps(sys.path), *names]
    returncode: int | None
    try:
        proc = subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=timeout
        )
        output, returncode = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout or ""
        output = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
        returncode = None
    # counted in the whole output: a library may print too, even half a line
    started = output.count("dlpack-probe: importing ")
    at_exit = "dlpack-probe: imported all" in output
    if returncode == 0:
        return None
    if returncode is None:
        how = f"no result after {timeout:g} s"
    elif returncode < 0:
        try:
            how = f"signal {-returncode} ({signal.Signals(-returncode).name})"
        except ValueError:
            how = f"signal {-returncode}"
    else:
        how = f"exit status {returncode}"
    return _Death(how + (" at interpreter exit" if at_exit else ""), started, at_exit)


def _in_parallel(groups: Sequence[Sequence[str]], timeout: float) -> list[_Death | None]:
    if not groups:
        return []
    # each child may load several large native libraries: a few at a time
    workers = min(len(groups), max(2, os.cpu_count() or 2), 8)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda names: _import_in_child(names, timeout), groups))


def _blame(culprit: str, before: Sequence[str], death: _Death, timeout: float) -> Crash:
    """``culprit`` crashed a child after ``before`` were imported: alone, with one of them (the
    first in order), or with the group."""
    alone = _import_in_child([culprit], timeout)
    if alone is not None:
        return Crash(culprit, alone.how)
    pairs = _in_parallel([[partner, culprit] for partner in before], timeout)
    for partner, pair in zip(before, pairs, strict=True):
        if pair is not None:
            return Crash(culprit, pair.how, (partner,))
    return Crash(culprit, death.how, tuple(before))


def probe(names: Sequence[str], timeout: float = TIMEOUT_S) -> dict[str, Crash]:
    """Import ``names`` (all installed) in child processes, as described above; return the crash
    found for each library that must not be imported with the others, in that order."""
    remaining = list(dict.fromkeys(names))
    found: dict[str, Crash] = {}
    if not sys.executable:
        return found
    while remaining:  # each round takes out one library, or ends
        death = _import_in_child(remaining, timeout)
        if death is None:
            break
        if death.at_exit:
            alone = _in_parallel([[n] for n in remaining], timeout)
            crashed = {n: d for n, d in zip(remaining, alone, strict=True) if d is not None}
            if crashed:
                found.update((n, Crash(n, d.how)) for n, d in crashed.items())
                remaining = [n for n in remaining if n not in crashed]
                continue
            index = len(remaining) - 1
        elif death.started == 0:
            break  # the child died before importing anything: nothing to learn from it
        else:
            index = death.started - 1
        culprit = remaining.pop(index)
        found[culprit] = _blame(culprit, remaining[:index], death, timeout)
    return found


_lock = threading.Lock()
_crashes: dict[str, Crash] | None = None
_probed: list[str] = []  # the candidates, in the order probed


def crashes(known: Sequence[str], timeout: float = TIMEOUT_S) -> dict[str, Crash]:
    """The crashes among ``known`` and ``DLPACK_PROBE_EXTRA``'s installed libraries; probed the
    first time this is called in a process (or handed down, see :func:`handed_down`),
    remembered after."""
    global _crashes, _probed
    with _lock:
        if _crashes is None:
            # extra names (test fakes) first: a crash among them is then found without the others
            candidates = [n for n in [*extra_names(), *known] if installed(n)]
            # what this process already imported comes first, as it did here
            candidates.sort(key=lambda n: n not in sys.modules)
            _probed = candidates
            _crashes = _from_parent(candidates)
            if _crashes is None:
                _crashes = probe(candidates, timeout)
        return _crashes


def _places(names: Sequence[str]) -> list[list[str]] | None:
    """Each name with where its top-level package is found (nothing is imported); None when one
    can't be told."""
    places = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name.partition(".")[0])
        except Exception:  # noqa: BLE001 - a finder that fails: nothing to compare
            return None
        if spec is None:
            return None
        # A namespace package (mlx) lists each sys.path entry it is found under, so a process
        # started in site-packages (its folder on sys.path twice) lists it twice: once each.
        folders = dict.fromkeys(map(os.path.realpath, spec.submodule_search_locations or []))
        where = spec.origin or os.pathsep.join(folders)
        places.append([name, where])
    return places


def handed_down() -> dict[str, str]:
    """The environment variable that hands this process's probe result down to the processes it
    starts; empty before it has probed."""
    with _lock:
        if _crashes is None:
            return {}
        crashed = {n: [c.name, c.how, list(c.together_with)] for n, c in _crashes.items()}
        doc = {"executable": sys.executable, "places": _places(_probed), "crashes": crashed}
        return {KNOWN_ENV: json.dumps(doc)}


def _from_parent(candidates: Sequence[str]) -> dict[str, Crash] | None:
    """The crashes ``KNOWN_ENV`` hands down, where they were found for these candidates at the
    same places, by this interpreter; else None."""
    text = os.environ.get(KNOWN_ENV)
    if not text:
        return None
    try:
        doc = json.loads(text)
        if doc["executable"] != sys.executable or doc["places"] is None:
            return None
        # the same libraries at the same places; the order may differ (what a process imported
        # before it probes comes first), as the order a process then imports them in does
        places = _places(candidates)
        if places is None or sorted(doc["places"]) != sorted(places):
            return None
        return {
            name: Crash(str(culprit), str(how), tuple(map(str, together)))
            for name, (culprit, how, together) in doc["crashes"].items()
        }
    except (ValueError, KeyError, TypeError):  # not ours to read: probe
        return None


def crash_of(name: str, known: Sequence[str]) -> Crash | None:
    """The crash that importing ``name`` risks here (any probed module of its top-level package
    counts), or None; see :func:`crashes`."""
    top = name.partition(".")[0]
    found = crashes(known)
    if name in found:
        return found[name]
    return next((c for n, c in found.items() if n.partition(".")[0] == top), None)
