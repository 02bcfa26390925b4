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

Each child imports ``dlpack`` (our extension) first, as the processes that ask do: a library
that crashes only beside it is found too, and named together with it.

A child killed by a signal, ending with a non-zero status, giving no result within the time
limit, or ending (even with status 0, as ``os._exit(0)`` does) before it says it has imported
them all counts as a crash. A library that merely raises (ImportError, ...) is not this module's
business: it fails to import in this process as well, and is reported as such.

A child gets its ``sys.path`` and names in a script file and reports to another file, not
through its command line (which a long ``sys.path`` would overflow) or its stdout (which a helper
process a library starts may hold open long after the child is gone; a library's own output
goes to /dev/null). Where one import takes more than ``NOTICE_AFTER_S``, a line says which
library is awaited (to stderr, or where :func:`notices_to` sends it).

``DLPACK_PROBE_EXTRA`` (comma-separated import names) adds candidates, imported first.

A process that starts others can hand its result down (:func:`handed_down`, in
``DLPACK_PROBE_KNOWN``): a child with the same interpreter that would probe the same candidates,
found in the same files, takes it instead of probing again (with many large libraries a probe
takes minutes).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

EXTRA_ENV = "DLPACK_PROBE_EXTRA"
KNOWN_ENV = "DLPACK_PROBE_KNOWN"
TIMEOUT_S = 120.0
# one import awaited longer than this is named (TensorFlow alone takes seconds), again every
# NOTICE_EVERY_S while it lasts
NOTICE_AFTER_S = 10.0
NOTICE_EVERY_S = 30.0
# what every child imports before the candidates: the processes that ask have it loaded
OURS = "dlpack"

# The child's script, after the lines that set sys.path, _OURS, _NAMES and _PROGRESS. It says in
# the progress file which import it starts, and when it is done; an exception is the caller's to
# see later (the library fails to import there too), so only a child that ends before "done" is
# news. os.write: each line is out of the process before the next import starts.
_CHILD = """
import importlib, os, warnings
warnings.simplefilter("ignore")
_progress = os.open(_PROGRESS, os.O_WRONLY | os.O_APPEND)
for _name in _OURS:
    try:
        importlib.import_module(_name)
    except BaseException:
        pass
for _name in _NAMES:
    os.write(_progress, ("importing " + _name + "\\n").encode("utf-8", "replace"))
    try:
        importlib.import_module(_name)
    except BaseException:
        pass
os.write(_progress, b"done\\n")
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


def _to_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


_notify: Callable[[str], None] = _to_stderr
_notify_lock = threading.Lock()  # children are awaited from several threads


def set_notify(notify: Callable[[str], None] | None) -> Callable[[str], None]:
    """Where the notices go (a line saying which import a child is still waiting for): to
    ``notify``, or stderr with None; returns where they went."""
    global _notify
    with _notify_lock:
        previous, _notify = _notify, notify or _to_stderr
    return previous


@contextlib.contextmanager
def notices_to(notify: Callable[[str], None]) -> Iterator[None]:
    """The notices go to ``notify`` for the block."""
    previous = set_notify(notify)
    try:
        yield
    finally:
        set_notify(previous)


def _say(line: str) -> None:
    with _notify_lock:
        try:
            _notify(line)
        except Exception:  # noqa: BLE001 - a closed stream: the probe goes on without notices
            pass


@dataclass(frozen=True)
class _Death:
    how: str
    started: int  # how many of its imports the child had started
    at_exit: bool  # it finished them all and died on the way out


def _import_in_child(names: Sequence[str], timeout: float, ours: bool = True) -> _Death | None:
    """How a child importing ``names`` in order (after ``OURS``, with ``ours``) died; None when
    it didn't."""
    with tempfile.TemporaryDirectory(prefix="dlpack-probe-") as folder:
        script, progress = os.path.join(folder, "child.py"), os.path.join(folder, "progress")
        open(progress, "wb").close()
        path = [entry for entry in sys.path if isinstance(entry, str)]
        header = (
            f"import sys\nsys.path[:] = {path!r}\n_OURS = {[OURS] if ours else []!r}\n"
            f"_NAMES = {list(names)!r}\n_PROGRESS = {progress!r}\n"
        )
        with open(script, "w", encoding="utf-8") as file:
            file.write(header + _CHILD)
        returncode = _run_child(script, progress, timeout)
        lines = _read_lines(progress)
    started = sum(line.startswith("importing ") for line in lines)
    done = "done" in lines
    if returncode == 0 and done:
        return None
    if returncode is None:
        how = f"no result after {timeout:g} s"
    elif returncode < 0:
        try:
            how = f"signal {-returncode} ({signal.Signals(-returncode).name})"
        except ValueError:
            how = f"signal {-returncode}"
    elif returncode == 0:  # os._exit(0) in the middle of an import: no crash to its parent
        how = "exit status 0 before its import returned"
    else:
        how = f"exit status {returncode}"
    return _Death(how + (" at interpreter exit" if done else ""), started, done)


def _read_lines(path: str) -> list[str]:
    with open(path, "rb") as file:
        return file.read().decode("utf-8", "replace").splitlines()


def _run_child(script: str, progress: str, timeout: float) -> int | None:
    """The exit status of ``python script``, or None when it gave no result within ``timeout``
    (then it and what it started are killed). Its own process group: a Ctrl-C here reaches
    only this process, which then kills it."""
    proc = subprocess.Popen(
        [sys.executable, script],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        return _await(proc, progress, timeout)
    finally:
        if proc.poll() is None:  # given up, or this process was interrupted
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                proc.kill()
            proc.wait()


def _await(proc: subprocess.Popen[bytes], progress: str, timeout: float) -> int | None:
    """Waits for ``proc`` up to ``timeout``, naming the import it is on where one lasts."""
    deadline = time.monotonic() + timeout
    current, since, noticed = "", 0.0, 0.0
    while True:
        now = time.monotonic()
        if now >= deadline:
            return None
        try:
            return proc.wait(timeout=min(0.5, deadline - now))
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        lines = _read_lines(progress)
        started = [
            line.removeprefix("importing ") for line in lines if line.startswith("importing ")
        ]
        if "done" in lines:  # a hang at interpreter exit
            awaited = f"a child process that imported {started[-1]} to exit" if started else ""
        else:
            awaited = f"{started[-1]} to import in a child process" if started else ""
        if awaited != current:
            current, since, noticed = awaited, now, 0.0
        waited = now - since
        if (
            current
            and waited >= NOTICE_AFTER_S
            and (not noticed or now - noticed >= NOTICE_EVERY_S)
        ):
            noticed = now
            _say(
                f"dlpack: waiting for {current}, {waited:.0f} s so far (checking it does not "
                f"crash the interpreter; given up after {timeout:g} s)"
            )


def _in_parallel(
    groups: Sequence[Sequence[str]], timeout: float, ours: Sequence[bool] = ()
) -> list[_Death | None]:
    if not groups:
        return []
    with_ours = list(ours) or [True] * len(groups)
    # each child may load several large native libraries: a few at a time
    workers = min(len(groups), max(2, os.cpu_count() or 2), 8)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda g, o: _import_in_child(g, timeout, o), groups, with_ours))


def _blame(culprit: str, before: Sequence[str], death: _Death, timeout: float) -> Crash:
    """``culprit`` crashed a child after ``before`` were imported: alone (beside our extension
    only, or not even), with one of them (the first in order), or with the group."""
    alone, without_ours = _in_parallel([[culprit], [culprit]], timeout, [True, False])
    if alone is not None:
        return Crash(culprit, alone.how, (OURS,) if without_ours is None else ())
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
