"""A virtualenv with a lock file installed, made again from scratch whenever the lock changes.

    python tools/venv_from_lock.py --python PYTHON VENV LOCK

The SHA-256 of the lock and of how it is installed is kept in ``VENV/.lock-hash``; while it
matches (and the virtualenv's python is there) nothing is done. Every module is compiled to
bytecode as it is installed: where ``PYTHONDONTWRITEBYTECODE`` is set (CI's machines set it), an
interpreter would otherwise compile torch, JAX and the rest from source in every process the
suite starts (3.12's suite took 289 s so, against 136 s for 3.14's, whose chroot has it unset).
uv, run by the python running this, makes the virtualenv for ``PYTHON`` and installs the lock
into it. ``make mixed-venv`` and ``tools/other_pythons.py`` make theirs this way.

``make_chroot_venv`` does the same inside a chroot (``tools/debian_chroot.sh``), whose pip can't
reach the package index: the lock's wheels are fetched here (``pip download`` for that CPython,
wheels only) and installed offline inside by uv, this uv's binary copied in.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

# How uv installs a lock, part of the hash kept beside it: a virtualenv installed otherwise is
# made again.
INSTALL = ("--compile-bytecode",)


def _digest(lock: Path) -> str:
    return hashlib.sha256(lock.read_bytes() + "\n".join(INSTALL).encode()).hexdigest()


def make_venv(python: str, venv: Path, lock: Path) -> Path:
    """``venv`` for ``python`` with ``lock`` installed; returns the virtualenv's python."""
    uv = [sys.executable, "-m", "uv"]
    digest = _digest(lock)
    stamp = venv / ".lock-hash"
    venv_python = venv / "bin" / "python"
    if not (stamp.is_file() and stamp.read_text().strip() == digest and venv_python.exists()):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([*uv, "venv", "-q", "--python", python, str(venv)], check=True)
        subprocess.run(
            [*uv, "pip", "install", "-q", *INSTALL, "--python", str(venv_python), "-r", str(lock)],
            check=True,
        )
        stamp.write_text(digest + "\n")
    return venv_python


def make_chroot_venv(root: Path, python: str, venv: str, lock: Path, version: str) -> bool:
    """``venv`` (a path inside the chroot ``root``) for ``python`` (likewise) with ``lock``
    installed. Its wheels are fetched into ``root``'s /var/tmp/wheels and unpacked into uv's cache
    there, both left for ``clean_chroot_downloads`` once every virtualenv is made: CPythons share
    many wheels (the virtualenvs share their files too, linked from that cache). True if it was
    made anew."""
    # the lock's alone: the suites there run in a clean environment, which writes bytecode as
    # it imports, so one installed without it needs no new download of every wheel
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    outside = root / venv.lstrip("/")
    stamp = outside / ".lock-hash"
    made = stamp.is_file() and stamp.read_text().strip() == digest
    # bin/python links to the chroot's interpreter by its path inside: seen from here it
    # points nowhere, so the link itself is what is looked for
    if made and os.path.lexists(outside / "bin/python"):
        return False
    shutil.rmtree(outside, ignore_errors=True)
    wheels = root / "var/tmp/wheels"
    subprocess.run(
        [
            sys.executable, "-m", "pip", "download", "-q", "--no-cache-dir", "--no-deps",
            "--python-version", version, "--only-binary=:all:", "-d", str(wheels),
            "-r", str(lock),
        ],
        check=True,
    )  # fmt: skip
    uv = chroot_uv(root)
    shutil.copyfile(lock, root / "var/tmp" / lock.name)
    in_root = ["chroot", str(root), "/usr/bin/env", "UV_CACHE_DIR=/var/tmp/uv-cache", uv]
    subprocess.run([*in_root, "venv", "-q", "--python", python, venv], check=True)
    subprocess.run(
        [
            *in_root, "pip", "install", "-q", *INSTALL, "--offline", "--no-index",
            "--find-links", "/var/tmp/wheels", "--python", f"{venv}/bin/python",
            "-r", f"/var/tmp/{lock.name}",
        ],
        check=True,
    )  # fmt: skip
    stamp.write_text(digest + "\n")
    return True


def clean_chroot_downloads(root: Path) -> None:
    """Removes what ``make_chroot_venv`` fetched and unpacked: the virtualenvs hold their files."""
    for folder in ("var/tmp/wheels", "var/tmp/uv-cache"):
        shutil.rmtree(root / folder, ignore_errors=True)


def chroot_uv(root: Path) -> str:
    """The path inside ``root`` of this uv's binary, copied there if it differs."""
    import uv  # the dev extra's, in the virtualenv running this

    source = Path(uv.find_uv_bin())
    target = root / "usr/local/bin/uv"
    if not (target.exists() and target.read_bytes() == source.read_bytes()):
        shutil.copyfile(source, target)
        os.chmod(target, 0o755)
    return "/usr/local/bin/uv"


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
