#!/usr/bin/env python
"""Instructions per call of ``dlpack.copyto(out, a)`` against ``np.copyto(out, a)``, counted by
callgrind: the cost of a small copy's call, which doesn't move with the machine's load as
``bench_copy.py``'s timings of it do.

With ``dlpack`` installed (a release build) and valgrind on PATH::

    python -P bench/count_copyto.py                 # 4 KiB, 64 KiB and 1 MiB of float32
    python -P bench/count_copyto.py --sizes 1024 --annotate /tmp/copyto.out

As ``count_rust_api.py`` counts: each loop runs under ``valgrind --tool=callgrind`` at two
numbers of calls, and the difference divided by the difference in calls is one call's cost, the
interpreter's start-up taken out (without address randomisation and with ``PYTHONHASHSEED=0``,
so that start-up counts the same in both runs). The whole process is counted (both functions
are called from the same Python loop), and the same loop with an empty body gives the loop's
own cost, which is taken out too. ``--annotate`` keeps the larger ``dlpack.copyto`` run's callgrind
output there, for ``callgrind_annotate --inclusive=yes``.
"""

from __future__ import annotations

import argparse
import os
import platform
import runpy
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CALLGRIND = runpy.run_path(os.path.join(HERE, "_callgrind.py"))

LOOP = """
import sys
import numpy as np
import dlpack
which, items, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
a = np.arange(items, dtype=np.float32)
out = np.empty_like(a)
f = {"dlpack": dlpack.copyto, "numpy": np.copyto, "loop": None}[which]
if f is None:
    for _ in range(100 + calls):
        pass
else:
    for _ in range(100 + calls):
        f(out, a)
    assert (out == a).all()
"""


def instructions(which: str, items: int, calls: int, workdir: str, keep: str | None) -> int:
    """Instructions of the whole process running ``which``'s loop ``calls`` (+ 100) times."""
    out = os.path.join(workdir, f"{which}.{items}.{calls}.out")
    # Without address randomisation (where `setarch` can turn it off), and with dicts' hashes
    # fixed below, two runs of a loop count the same start-up to the instruction.
    fixed = ["setarch", platform.machine(), "-R"] if shutil.which("setarch") else []
    script = [sys.executable, "-P", os.path.join(workdir, "loop.py"), which, str(items), str(calls)]
    total = CALLGRIND["process_total"](
        script, out, prefix=fixed, env={**os.environ, "PYTHONHASHSEED": "0"}
    )
    if keep:
        shutil.copyfile(out, keep)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls between the two runs")
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[1024, 16384, 262144],
        help="float32 items per copy (default: 4 KiB, 64 KiB, 1 MiB)",
    )
    parser.add_argument("--annotate", help="keep dlpack.copyto's callgrind output here")
    args = parser.parse_args()

    def per_call(which: str, items: int, workdir: str, keep: str | None = None) -> float:
        low = instructions(which, items, 1_000, workdir, None)
        high = instructions(which, items, 1_000 + args.calls, workdir, keep)
        return (high - low) / args.calls

    with tempfile.TemporaryDirectory() as workdir:
        with open(os.path.join(workdir, "loop.py"), "w") as f:
            f.write(LOOP)
        loop = per_call("loop", 1, workdir)
        print(f"the loop's own cost: {loop:.0f} instructions per iteration (taken out below)")
        print(
            f"{'float32 copy':>14} {'dlpack':>9} {'numpy':>9} {'ratio':>6}  (instructions per call)"
        )
        for items in args.sizes:
            ours = per_call("dlpack", items, workdir, args.annotate) - loop
            theirs = per_call("numpy", items, workdir) - loop
            size = f"{items * 4 // 1024} KiB"
            print(f"{size:>14} {ours:9.0f} {theirs:9.0f} {ours / theirs:6.2f}")


if __name__ == "__main__":
    main()
