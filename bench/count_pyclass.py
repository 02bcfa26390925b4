#!/usr/bin/env python
"""Instructions per exchange of ``bench/bench_pyclass.py``'s rows, counted by callgrind: the
hand-written ``DLPackObject`` against the same state in a PyO3 ``#[pyclass]``, in figures that
don't move with the VM's noise.

With a build that has the ``pyclass-probe`` feature importable (see ``bench_pyclass.py``), a C
compiler and valgrind on PATH::

    python -P bench/count_pyclass.py

One process runs under ``valgrind --tool=callgrind --instr-atstart=no``; a small C helper
(compiled here, loaded with ctypes) switches counting on around each loop of a statement and
dumps the count after it. Each statement runs 1,000 times uncounted, then 5,000 and 25,000 times
counted; the difference divided by 20,000 is one call with the interpreter's start-up and the
helper's calls taken out. ``len(a)`` in the same loop is the loop's own cost, subtracted from the
"own" figures.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CALLGRIND = runpy.run_path(os.path.join(HERE, "_callgrind.py"))


def child(argv: list[str], only: set[str] | None) -> None:
    """Under callgrind: run every statement's loops, writing the order of the dumps."""
    base, rows = CALLGRIND["exchange_rows"](only)
    import dlpack
    from dlpack import _dlpack

    makers = {"hand": dlpack.asdlpack, "pyclass": _dlpack._pyclass_asdlpack}
    spaces = {kind: dict(base, asdlpack=make, obj=make(base["a"])) for kind, make in makers.items()}

    cases = [("loop", "len(a)", "hand")]
    for key, stmt, anchor, needs in rows:
        if not all(n in spaces["hand"] for n in needs):
            continue
        cases += [(f"{key}:{kind}", stmt, kind) for kind in makers]
        if anchor is not None:
            if "obj" in anchor or "asdlpack" in anchor:
                cases += [(f"{key}:anchor_{kind}", anchor, kind) for kind in makers]
            else:
                cases.append((f"{key}:anchor", anchor, "hand"))
    CALLGRIND["run_cases"](argv, [(name, stmt, spaces[kind]) for name, stmt, kind in cases])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated row keys")
    parser.add_argument("--json", metavar="PATH", help="also write the counts here")
    parser.add_argument(CALLGRIND["CHILD_FLAG"], nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    child_args = getattr(args, CALLGRIND["CHILD_FLAG"].lstrip("-").replace("-", "_"))
    if child_args:
        child(child_args, only)
        return 0

    only_args = ["--only", args.only] if args.only else []
    per_call, stmts = CALLGRIND["count_in_process"](__file__, only_args)
    loop = per_call.pop("loop")
    print(f"instructions per call, the loop's own ({loop:.0f}, `len(a)`) taken out")
    print()
    print(
        "| exchange | hand-written | #[pyclass] | pyclass − hand | anchor | hand/anchor |"
        " pyclass/anchor |"
    )
    print("|---|---:|---:|---:|---|---:|---:|")
    keys = dict.fromkeys(name.split(":")[0] for name in per_call)
    for key in keys:
        hand = per_call[f"{key}:hand"] - loop
        probe = per_call[f"{key}:pyclass"] - loop
        anchors = {
            kind: per_call.get(f"{key}:anchor_{kind}", per_call.get(f"{key}:anchor"))
            for kind in ("hand", "pyclass")
        }
        if anchors["hand"] is None:
            anchor, ratios = "—", ("—", "—")
        else:
            own = {kind: anchors[kind] - loop for kind in anchors}
            name = f"{key}:anchor" if f"{key}:anchor" in stmts else f"{key}:anchor_hand"
            anchor = f"`{stmts[name]}`: {own['hand']:.0f}"
            if own["pyclass"] != own["hand"]:
                anchor += f" (pyclass's: {own['pyclass']:.0f})"
            ratios = (f"{hand / own['hand']:.2f}×", f"{probe / own['pyclass']:.2f}×")
        print(
            f"| `{stmts[f'{key}:hand']}` | {hand:.0f} | {probe:.0f} | {probe - hand:+.0f} | "
            f"{anchor} | {ratios[0]} | {ratios[1]} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"loop": loop, "per_call": per_call, "stmts": stmts}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
