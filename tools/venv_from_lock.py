"""A virtualenv with a lock file installed, made again from scratch whenever the lock changes.

    python tools/venv_from_lock.py --python PYTHON VENV LOCK

The lock's SHA-256 is kept in ``VENV/.lock-hash``; while it matches (and the virtualenv's
python is there) nothing is done. uv, run by the python running this, makes the virtualenv for
``PYTHON`` and installs the lock into it. ``make mixed-venv`` and ``tools/other_pythons.py``
make theirs this way.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path


def make_venv(python: str, venv: Path, lock: Path) -> Path:
    """``venv`` for ``python`` with ``lock`` installed; returns the virtualenv's python."""
    uv = [sys.executable, "-m", "uv"]
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    stamp = venv / ".lock-hash"
    venv_python = venv / "bin" / "python"
    if not (stamp.is_file() and stamp.read_text().strip() == digest and venv_python.exists()):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([*uv, "venv", "-q", "--python", python, str(venv)], check=True)
        subprocess.run(
            [*uv, "pip", "install", "-q", "--python", str(venv_python), "-r", str(lock)],
            check=True,
        )
        stamp.write_text(digest + "\n")
    return venv_python


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="the interpreter the virtualenv runs")
    parser.add_argument("venv", type=Path)
    parser.add_argument("lock", type=Path)
    args = parser.parse_args()
    make_venv(args.python, args.venv, args.lock)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
