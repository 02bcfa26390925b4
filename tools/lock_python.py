"""A lock file of the test extra for one other CPython, wheels only, leaving out what has none.

    python tools/lock_python.py 3.15 -o requirements/lock-py3.15.txt [-c requirements/lock.txt]

uv compiles ``pyproject.toml``'s test extra for that CPython on x86_64 manylinux_2_35 Linux,
wheels only (``--only-binary :all:``), at the newest versions or at those of the constraint files
given (``--upgrade``: the versions the lock had don't hold it back). Where that fails, each
library of the extra is resolved alone, and those that can't be (no wheel for that CPython, for
it or for something it needs) are left out of the resolution (``--excludes``) and named on a
line below uv's header::

    # no wheel for CPython 3.15, left out: nanoarrow (nanoarrow), ray (ray)

with the name each is imported by in parentheses: ``tools/other_pythons.py`` reads that line and
leaves those out of ``DLPACK_TESTS_REQUIRE`` for that CPython, saying so in its log. Exits 1 with
uv's message when nothing is left out and the extra still can't be resolved.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEFT_OUT = "# no wheel for CPython {version}, left out: "
# Distributions imported by another name than their own (the others: '-' becomes '_')
IMPORT_NAMES = {"apache-tvm-ffi": "tvm_ffi", "pillow": "PIL"}


def import_name(distribution: str) -> str:
    return IMPORT_NAMES.get(distribution, distribution.replace("-", "_"))


def requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def left_out(lock: Path, version: str) -> list[str]:
    """The import names a lock written here says it left out (none when it says nothing)."""
    prefix = LEFT_OUT.format(version=version)
    for line in lock.read_text().splitlines():
        if not line.startswith("#"):
            break
        if line.startswith(prefix):
            return re.findall(r"\(([^)]+)\)", line[len(prefix) :])
    return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", help="the CPython, as 3.15")
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("-c", "--constraint", action="append", default=[], type=Path)
    args = parser.parse_args()
    uv = [sys.executable, "-m", "uv", "pip", "compile", "-q"]
    flags = [
        "--python-version", args.version, "--python-platform", "x86_64-manylinux_2_35",
        "--only-binary", ":all:",
        *(f for c in args.constraint for f in ("-c", str(c))),
    ]  # fmt: skip

    def compile_extra(excludes: Path | None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *uv, "--upgrade", "pyproject.toml", "--extra", "test", *flags,
                *(["--excludes", str(excludes)] if excludes else []),
                "--custom-compile-command", "make lock", "-o", str(args.output),
            ],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip

    whole = compile_extra(None)
    if whole.returncode == 0:
        return 0
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    failing = []
    for requirement in extra["optional-dependencies"]["test"]:
        alone = subprocess.run(
            [*uv, "-", *flags, "--no-header"],
            input=requirement,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if alone.returncode != 0:
            failing.append(requirement_name(requirement))
    if not failing:
        sys.stderr.write(whole.stderr)
        return 1
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as excludes:
        excludes.write("".join(f"{name}\n" for name in failing))
        excludes.flush()
        done = compile_extra(Path(excludes.name))
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        return 1
    named = ", ".join(f"{name} ({import_name(name)})" for name in sorted(failing))
    lines = args.output.read_text().splitlines(keepends=True)
    top = next(i for i, line in enumerate(lines) if not line.startswith("#"))  # uv's header
    lines.insert(top, f"{LEFT_OUT.format(version=args.version)}{named}\n")
    args.output.write_text("".join(lines))
    print(f"{args.output}: no wheel for CPython {args.version}, left out: {named}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
