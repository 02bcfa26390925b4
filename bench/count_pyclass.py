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
import glob
import json
import os
import re
import runpy
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

HELPER = r"""
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void cg_stop(void) { CALLGRIND_DUMP_STATS; CALLGRIND_STOP_INSTRUMENTATION; }
"""

LOW, HIGH, WARM = 5_000, 25_000, 1_000


def child(helper: str, plan_path: str, only: set[str] | None) -> None:
    """Under callgrind: run every statement's loops, writing the order of the dumps."""
    import ctypes

    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
    exchange = runpy.run_path(os.path.join(HERE, "bench_exchange.py"), run_name="bench_exchange")
    import numpy as np

    import dlpack
    from dlpack import _dlpack

    lib = ctypes.CDLL(helper)
    a = np.arange(12, dtype=np.float32)
    base = {"np": np, "a": a}
    for name in ("torch", "tvm_ffi"):
        try:
            base[name] = __import__(name)
        except Exception:
            pass
    if "torch" in base:
        base["t"] = base["torch"].from_numpy(a)
    makers = {"hand": dlpack.asdlpack, "pyclass": _dlpack._pyclass_asdlpack}
    spaces = {kind: dict(base, asdlpack=make, obj=make(a)) for kind, make in makers.items()}

    cases = [("loop", "len(a)", "hand")]
    for key, _label, stmt, _anchor_label, anchor, _check, needs in exchange["ROWS"]:
        if (only and key not in only) or not all(n in spaces["hand"] for n in needs):
            continue
        cases += [(f"{key}:{kind}", stmt, kind) for kind in makers]
        if anchor is not None:
            if "obj" in anchor or "asdlpack" in anchor:
                cases += [(f"{key}:anchor_{kind}", anchor, kind) for kind in makers]
            else:
                cases.append((f"{key}:anchor", anchor, "hand"))
    plan = []
    for name, stmt, kind in cases:
        ns = spaces[kind]
        exec(f"def _run(n):\n    for _ in range(n):\n        {stmt}\n", ns)
        ns["_run"](WARM)
        for calls in (LOW, HIGH):
            lib.cg_start()
            ns["_run"](calls)
            lib.cg_stop()
            plan.append([name, stmt, calls])
    with open(plan_path, "w") as f:
        json.dump(plan, f)


def totals(path: str) -> int:
    with open(path) as f:
        for line in f:
            if m := re.match(r"(?:summary|totals):\s*(\d+)", line):
                return int(m.group(1))
    raise RuntimeError(f"callgrind wrote no totals to {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated row keys")
    parser.add_argument("--json", metavar="PATH", help="also write the counts here")
    parser.add_argument("--_child", nargs=2, metavar=("HELPER", "PLAN"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    if args._child:
        child(*args._child, only)
        return 0

    with tempfile.TemporaryDirectory() as work:
        helper = os.path.join(work, "cg_helper.so")
        source = os.path.join(work, "cg_helper.c")
        with open(source, "w") as f:
            f.write(HELPER)
        subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", helper, source], check=True)
        out = os.path.join(work, "cg.out")
        plan_path = os.path.join(work, "plan.json")
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-P",
            os.path.abspath(__file__),
            "--_child",
            helper,
            plan_path,
        ]
        if args.only:
            command += ["--only", args.only]
        subprocess.run(command, check=True, capture_output=True)
        with open(plan_path) as f:
            plan = json.load(f)
        dumps = sorted(glob.glob(out + ".*"), key=lambda p: int(p.rsplit(".", 1)[1]))
        if len(dumps) != len(plan):
            raise RuntimeError(f"{len(dumps)} dumps for {len(plan)} loops")
        counts: dict[str, dict[int, int]] = {}
        stmts: dict[str, str] = {}
        for (name, stmt, calls), path in zip(plan, dumps, strict=True):
            counts.setdefault(name, {})[calls] = totals(path)
            stmts[name] = stmt

    per_call = {name: (c[HIGH] - c[LOW]) / (HIGH - LOW) for name, c in counts.items()}
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
