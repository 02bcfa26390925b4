#!/usr/bin/env python
"""Instructions per exchange of ``bench/bench_exchange.py``'s rows (through ``asdlpack`` and the
native path beside it), counted by callgrind: figures that don't move with the machine's load,
for comparing two builds of the runtime.

With ``dlpack`` installed (a release build), a C compiler and valgrind on PATH::

    OPENBLAS_NUM_THREADS=1 python -P bench/count_exchange.py
    OPENBLAS_NUM_THREADS=1 python -P bench/count_exchange.py --only numpy --keep /tmp/cg

Two builds, each installed with ``pip install --no-deps --target DIR``, one after the other::

    OPENBLAS_NUM_THREADS=1 python -P bench/ab_builds.py /tmp/ab-old /tmp/ab-new --rounds 1 -- \\
        bench/count_exchange.py --only numpy,dunder_dlpack,asdlpack

Counted as ``_callgrind.count_in_process`` counts (1,000 calls uncounted, then 5,000 and
25,000 counted; the difference is 20,000 calls): ``len(a)`` in the same loop is the loop's own
cost, taken out of every row. ``--keep`` leaves callgrind's dumps there for
``callgrind_annotate`` (the last is the last row's anchor, or the row itself without one).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CALLGRIND = runpy.run_path(os.path.join(HERE, "_callgrind.py"))


def child(argv: list[str], only: set[str] | None) -> None:
    """Under callgrind: every row's loops, ours then its anchor."""
    base, rows = CALLGRIND["exchange_rows"](only)
    import dlpack

    ns = dict(base, asdlpack=dlpack.asdlpack, obj=dlpack.asdlpack(base["a"]))
    cases = [("loop", "len(a)")]
    for key, stmt, anchor, needs in rows:
        if not all(n in ns for n in needs):
            continue
        cases.append((key, stmt))
        if anchor is not None:
            cases.append((f"{key}:anchor", anchor))
    CALLGRIND["run_cases"](argv, [(name, stmt, ns) for name, stmt in cases])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated row keys (bench_exchange.py's)")
    parser.add_argument("--keep", metavar="DIR", help="keep callgrind's dumps in this folder")
    parser.add_argument(CALLGRIND["CHILD_FLAG"], nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    child_args = getattr(args, CALLGRIND["CHILD_FLAG"].lstrip("-").replace("-", "_"))
    if child_args:
        child(child_args, only)
        return 0

    only_args = ["--only", args.only] if args.only else []
    per_call, stmts = CALLGRIND["count_in_process"](__file__, only_args, keep=args.keep)
    loop = per_call.pop("loop")
    import dlpack

    print(f"dlpack at {os.path.dirname(dlpack.__file__)}")
    print(f"instructions per call, the loop's own ({loop:.0f}, `len(a)`) taken out")
    print()
    print("| exchange | instructions | native path | instructions | ratio |")
    print("|---|---:|---|---:|---:|")
    for name, count in per_call.items():
        if name.endswith(":anchor"):
            continue
        ours = count - loop
        anchor = per_call.get(f"{name}:anchor")
        if anchor is None:
            print(f"| `{stmts[name]}` | {ours:.0f} | — | — | — |")
            continue
        theirs = anchor - loop
        print(
            f"| `{stmts[name]}` | {ours:.0f} | `{stmts[name + ':anchor']}` | {theirs:.0f} "
            f"| {ours / theirs:.2f}× |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
