#!/usr/bin/env python
"""Run one benchmark script against two builds of the package, in alternating rounds.

Install each build's wheel into a directory of its own, then name both::

    python -m pip install --no-deps --target /tmp/ab-old dist-old/*.whl
    python -m pip install --no-deps --target /tmp/ab-new dist-new/*.whl
    OPENBLAS_NUM_THREADS=1 python -P bench/ab_builds.py /tmp/ab-old /tmp/ab-new \\
        --rounds 2 -- bench/bench_interop.py --quick

Each round runs the script once with the first directory first on ``PYTHONPATH``, then once with
the second, so both builds see the same machine noise round by round. Every run's output is
printed in full under its label; compare the rows by eye or by the script's ``--json``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys


def _check_build(path: str) -> str:
    package = os.path.join(path, "dlpack", "__init__.py")
    if not os.path.isfile(package):
        raise SystemExit(f"{path}: no dlpack package there (pip install --target it first)")
    return os.path.abspath(path)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], usage="%(prog)s A B [--rounds N] -- script.py [args]"
    )
    parser.add_argument("a", help="directory holding the first build (pip install --target)")
    parser.add_argument("b", help="directory holding the second build")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of A then B (default 2)")
    argv = sys.argv[1:]
    if "--" not in argv:
        parser.error("name the benchmark script after --")
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    script = argv[split + 1 :]
    if not script:
        parser.error("name the benchmark script after --")
    builds = {"A": _check_build(args.a), "B": _check_build(args.b)}
    for round_ in range(1, args.rounds + 1):
        for label, path in builds.items():
            env = dict(os.environ, PYTHONPATH=path)
            print(f"===== round {round_}, build {label} ({path}) =====", flush=True)
            done = subprocess.run([sys.executable, "-P", *script], env=env, check=False)
            if done.returncode != 0:
                print(f"(exit status {done.returncode})", flush=True)
                return done.returncode
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
