"""The suite from the wheel on other CPythons the abi3 wheel claims, each in its own virtualenv.

    python tools/other_pythons.py --wheel dist/*.whl --venvs DIR [--jobs N] [--require] 3.12 3.13

For each version: find its interpreter (``python3.X`` on PATH, else pyenv's
``versions/3.X*``), make ``DIR/py3.X`` from ``requirements/lock-py3.X.txt``
(``tools/venv_from_lock.py``: again whenever that lock changes), install the wheel there, and
run the whole suite with the libraries of ``DLPACK_TESTS_REQUIRE`` required. The suites run
``--jobs`` at a time (each keeps to about one core), each one's output printed whole when it
ends. At the end, one line per version says which interpreter ran and how it went; a version
with no interpreter here is said as such, and with ``--require`` (CI) fails the run instead of
passing it silently.
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

from venv_from_lock import make_venv  # this script's folder is first on sys.path

ROOT = Path(__file__).resolve().parent.parent


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


def full_version(python: str) -> str:
    done = subprocess.run([python, "-V"], capture_output=True, text=True, check=True)
    return done.stdout.strip().replace("Python", "CPython")


class Suite:
    """One version's suite, running in the background, its output in a file of its own."""

    def __init__(self, version: str, python: str, venv_python: Path, cwd: Path):
        self.version, self.python, self.venv_python = version, python, venv_python
        self.log = tempfile.TemporaryFile(mode="w+")
        self.start = time.monotonic()
        self.process = subprocess.Popen(
            [str(venv_python), "-P", "-m", "dlpack.tests", "-q", "-ra"],
            cwd=cwd,  # away from the source tree: the installed wheel is tested
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
        line = f"{full_version(str(self.venv_python))} ({self.python}): {verdict} in {took:.0f} s"
        return status == 0, line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="+", help="CPython versions, as 3.12")
    parser.add_argument("--wheel", required=True, help="the wheel to test (a glob)")
    parser.add_argument("--venvs", required=True, help="folder holding one virtualenv each")
    parser.add_argument("--jobs", type=int, default=1, help="suites run at once (default 1)")
    parser.add_argument("--require", action="store_true", help="a missing version fails the run")
    args = parser.parse_args()
    wheels = glob.glob(args.wheel)
    if len(wheels) != 1:
        parser.error(f"--wheel {args.wheel!r} names {len(wheels)} files, not one")
    uv = [sys.executable, "-m", "uv"]
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
        python = find_interpreter(version)
        if python is None:
            outcomes.append(f"CPython {version}: NOT RUN, no interpreter found (PATH, pyenv)")
            failed |= args.require
            continue
        if not lock.is_file():
            outcomes.append(f"CPython {version}: NOT RUN, no {lock.relative_to(ROOT)}")
            failed = True
            continue
        print(f"=== CPython {version}: {python}", flush=True)
        venv_python = make_venv(python, Path(args.venvs) / f"py{version}", lock)
        subprocess.run(
            [
                *uv, "pip", "install", "-q", "--python", str(venv_python),
                "--reinstall", "--no-deps", wheels[0],
            ],
            check=True,
        )  # fmt: skip
        while len(running) >= max(args.jobs, 1):
            finish_one()
        running.append(Suite(version, python, venv_python, Path(args.venvs)))
    while running:
        finish_one()
    print("=== the suite from the wheel, on each CPython:")
    for line in outcomes:
        print(f"    {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
