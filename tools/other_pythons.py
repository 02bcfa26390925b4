"""The suite from the wheel on other CPythons the abi3 wheel claims, each in its own virtualenv.

    python tools/other_pythons.py --wheel dist/*.whl --venvs DIR [--jobs N] [--require] 3.12 3.13
    python tools/other_pythons.py --wheel dist/*.whl --chroot ROOT [--jobs N] [--require] 3.14

For each version: find its interpreter (``python3.X`` on PATH, else pyenv's
``versions/3.X*``), make ``DIR/py3.X`` from ``requirements/lock-py3.X.txt``
(``tools/venv_from_lock.py``: again whenever that lock changes), install the wheel there, and
run the whole suite with the libraries of ``DLPACK_TESTS_REQUIRE`` required, but for those the
lock says it left out, having no wheel for that CPython (``tools/lock_python.py``). The suites
run ``--jobs`` at a time (each keeps to about one core), each one's output printed whole when it
ends. At the end, one line per version says which interpreter ran, how it went, and what was
not required; a version with no interpreter here is said as such, and with ``--require`` (CI)
fails the run instead of passing it silently.

With ``--chroot``, the interpreters are ``/usr/bin/python3.X`` inside the Debian chroot ROOT
(``tools/debian_chroot.sh``, which must have its mounts up: run this under its ``run``), the
virtualenvs ``/opt/venvs/py3.X`` inside it, their wheels fetched here and installed offline
there, and the suites run inside it (its ``enter``) in a clean environment.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# this script's folder is first on sys.path
from lock_python import left_out
from venv_from_lock import clean_chroot_downloads, make_chroot_venv, make_venv

ROOT = Path(__file__).resolve().parent.parent
# What the chroot's clean environment keeps of this one: the suite's time limit per test
PASSED = ("DLPACK_TESTS_TIMEOUT",)


def find_interpreter(version: str) -> str | None:
    """A working ``python3.X`` for ``version`` ("3.12"), or None."""
    candidates = []
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(on_path)
    # pyenv's shims name every version it has, but run only those it has made current: look
    # in its versions folder too
    pyenv_root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    pattern = os.path.join(pyenv_root, "versions", f"{version}.*", "bin", f"python{version}")
    candidates += sorted(glob.glob(pattern), reverse=True)
    for candidate in candidates:
        done = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0 and done.stdout.strip() == version:
            return candidate
    return None


def chroot_interpreter(root: Path, version: str) -> str | None:
    """``/usr/bin/python3.X`` inside the chroot ``root``, if it is there and runs."""
    python = f"/usr/bin/python{version}"
    if not (root / python.lstrip("/")).exists():
        return None
    done = subprocess.run(["chroot", str(root), python, "-c", ""], check=False)
    return python if done.returncode == 0 else None


class Suite:
    """One version's suite, running in the background, its output in a file of its own."""

    def __init__(
        self, version: str, where: str, command: list[str], note: str, **popen: Any
    ) -> None:
        self.version, self.where, self.command, self.note = version, where, command, note
        self.log = tempfile.TemporaryFile(mode="w+")
        self.start = time.monotonic()
        self.process = subprocess.Popen(
            [*command, "-P", "-m", "dlpack.tests", "-q", "-ra"],
            **popen,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def finish(self) -> tuple[bool, str]:
        status = self.process.wait()
        took = time.monotonic() - self.start
        self.log.seek(0)
        print(f"=== CPython {self.version}: the suite's output", flush=True)
        sys.stdout.write(self.log.read())
        verdict = "passed" if status == 0 else f"FAILED (exit status {status})"
        done = subprocess.run([*self.command, "-V"], capture_output=True, text=True, check=True)
        name = done.stdout.strip().replace("Python", "CPython")
        return status == 0, f"{name} ({self.where}): {verdict} in {took:.0f} s{self.note}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="+", help="CPython versions, as 3.12")
    parser.add_argument("--wheel", required=True, help="the wheel to test (a glob)")
    place = parser.add_mutually_exclusive_group(required=True)
    place.add_argument("--venvs", type=Path, help="folder holding one virtualenv each")
    place.add_argument("--chroot", type=Path, help="a Debian chroot holding the interpreters")
    parser.add_argument("--jobs", type=int, default=1, help="suites run at once (default 1)")
    parser.add_argument("--require", action="store_true", help="a missing version fails the run")
    args = parser.parse_args()
    wheels = glob.glob(args.wheel)
    if len(wheels) != 1:
        parser.error(f"--wheel {args.wheel!r} names {len(wheels)} files, not one")
    wheel = Path(wheels[0]).resolve()
    required = [n for n in os.environ.get("DLPACK_TESTS_REQUIRE", "").split(",") if n]
    outcomes: list[str] = []
    failed = False
    running: list[Suite] = []

    def finish_one() -> None:
        nonlocal failed
        passed, line = running.pop(0).finish()
        outcomes.append(line)
        failed |= not passed

    for version in args.versions:
        lock = ROOT / "requirements" / f"lock-py{version}.txt"
        if args.chroot:
            python = chroot_interpreter(args.chroot, version)
            missing = f"no /usr/bin/python{version} in the chroot {args.chroot}"
        else:
            python = find_interpreter(version)
            missing = "no interpreter found (PATH, pyenv)"
        if python is None:
            outcomes.append(f"CPython {version}: NOT RUN, {missing}")
            failed |= args.require
            continue
        if not lock.is_file():
            outcomes.append(f"CPython {version}: NOT RUN, no {lock.relative_to(ROOT)}")
            failed = True
            continue
        print(f"=== CPython {version}: {python}", flush=True)
        if args.chroot:
            venv = f"/opt/venvs/py{version}"
            make_chroot_venv(args.chroot, python, venv, lock, version)
            shutil.copyfile(wheel, args.chroot / "var/tmp" / wheel.name)
            install = ["chroot", str(args.chroot), "/usr/local/bin/uv", "pip", "install"]
            install += ["--offline", "--no-index", "--python", f"{venv}/bin/python"]
            target = f"/var/tmp/{wheel.name}"
            where = f"Debian's python{version} in {args.chroot}"
        else:
            venv_python = make_venv(python, args.venvs / f"py{version}", lock)
            install = [sys.executable, "-m", "uv", "pip", "install"]
            install += ["--python", str(venv_python)]
            target, where = str(wheel), python
        subprocess.run([*install, "-q", "--reinstall", "--no-deps", target], check=True)
        absent = left_out(lock, version)
        require = ",".join(n for n in required if n not in absent)
        note = f"; not required, no wheel for it: {', '.join(absent)}" if absent else ""
        while len(running) >= max(args.jobs, 1):
            finish_one()
        if args.chroot:
            # entered as the root of a mount namespace (the suite makes a user namespace, which
            # a chrooted process can't), in a clean environment: nothing of this machine's
            # paths or settings inside
            command = [
                str(ROOT / "tools/debian_chroot.sh"), "enter", str(args.chroot),
                "/usr/bin/env", "-i", "-C", "/opt/venvs",
                "HOME=/root", "LANG=C.UTF-8", f"PATH={venv}/bin:/usr/bin:/bin",
                f"DLPACK_TESTS_REQUIRE={require}",
                *(f"{k}={os.environ[k]}" for k in PASSED if k in os.environ),
                f"{venv}/bin/python",
            ]  # fmt: skip
            running.append(Suite(version, where, command, note))
        else:
            env = {**os.environ, "DLPACK_TESTS_REQUIRE": require}
            # away from the source tree: the installed wheel is tested
            cwd = args.venvs
            running.append(Suite(version, where, [str(venv_python)], note, env=env, cwd=cwd))
    if args.chroot:
        clean_chroot_downloads(args.chroot)
    while running:
        finish_one()
    print("=== the suite from the wheel, on each CPython:")
    for line in outcomes:
        print(f"    {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
