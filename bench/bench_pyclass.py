#!/usr/bin/env python
"""The exchanges of ``bench/bench_exchange.py`` through the hand-written ``DLPackObject`` and
through the same state in a PyO3 ``#[pyclass]``, side by side in one process.

Needs a build with the ``pyclass-probe`` feature, which adds ``dlpack._dlpack._PyClassObject``
and ``_pyclass_asdlpack`` (see ``src/object/probe.rs``)::

    maturin build --release --features pyclass-probe -o dist-probe
    pip install --no-deps --target site dist-probe/*.whl
    OPENBLAS_NUM_THREADS=1 PYTHONPATH=site taskset -c 1 python -P bench/bench_pyclass.py

Each row is bench_exchange.py's, its statement run once with ``asdlpack`` and ``obj`` the
hand-written type's and once with the probe's; the row's anchor is timed alongside (once per
type where the anchor itself names ``obj``). The repeats of a row's statements are interleaved
(``bench/_bench_timing.py``), so all of them see the same machine noise. The table shows the
best repeat; ``--json`` also keeps every repeat.
"""

import argparse
import json
import os
import platform
import runpy
import statistics
import sys
import time
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]

exchange = runpy.run_path(os.path.join(HERE, "bench_exchange.py"), run_name="bench_exchange")
interleaved = runpy.run_path(os.path.join(HERE, "_bench_timing.py"))["interleaved"]

# Each row's goal (docs/benchmarks.md, "Exchange cost"): at most this ratio to its anchor.
GOALS = {
    "numpy": 1.5,
    "torch": 1.1,
    "numpy_from_torch": 0.5,
    "dunder_dlpack": 1.0,
    "tvm_ffi": 1.2,
    "memoryview": 1.2,
    "asarray": 1.5,
    "memoryview_torch": 1.0,
}

TYPES = ("hand", "pyclass")


def fmt(ns: float) -> str:
    return f"{ns:.0f} ns" if ns < 1000 else f"{ns / 1000:.2f} µs"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--repeats", type=int, help="repeats per statement (default 15, quick 3)")
    parser.add_argument("--target", type=float, help="seconds per repeat (default 0.2)")
    parser.add_argument("--only", help="comma-separated row keys")
    parser.add_argument("--json", metavar="PATH", help="also write the raw numbers here")
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 15)
    target_s = args.target or (0.03 if args.quick else 0.2)

    import numpy as np

    import dlpack
    from dlpack import _dlpack

    if not hasattr(_dlpack, "_pyclass_asdlpack"):
        print(f"{dlpack.__file__}: not built with the pyclass-probe feature", file=sys.stderr)
        return 1
    a = np.arange(12, dtype=np.float32)
    base = {"np": np, "a": a, "SRC_PTR": a.ctypes.data, "EXPECTED": a.copy()}
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    for name in ("torch", "tvm_ffi"):
        try:
            module = __import__(name)
        except Exception as exc:
            print(f"{name} rows skipped: {exc}", file=sys.stderr)
            continue
        base[name] = module
        versions[name] = getattr(module, "__version__", "?")
    if "torch" in base:
        base["t"] = base["torch"].from_numpy(a)
    makers = {"hand": dlpack.asdlpack, "pyclass": _dlpack._pyclass_asdlpack}
    spaces = {kind: dict(base, asdlpack=make, obj=make(a)) for kind, make in makers.items()}

    only = set(args.only.split(",")) if args.only else None
    started = time.perf_counter()
    rows = []
    for key, label, stmt, _anchor_label, anchor, check, needs in exchange["ROWS"]:
        if (only and key not in only) or not all(n in spaces["hand"] for n in needs):
            continue
        timers = {}
        for kind in TYPES:
            reason = exchange["try_stmt"](stmt, spaces[kind], check)
            if reason:
                print(f"{key} ({kind}): {reason}", file=sys.stderr)
                break
            timers[kind] = timeit.Timer(stmt, globals=spaces[kind])
        else:
            if anchor is not None:
                own = "obj" in anchor or "asdlpack" in anchor
                for kind in TYPES if own else ("hand",):
                    name = f"anchor_{kind}" if own else "anchor"
                    timers[name] = timeit.Timer(anchor, globals=spaces[kind])
            print(f"timing {key}: {stmt}", file=sys.stderr, flush=True)
            numbers, per_call = interleaved(timers, repeats, target_s)
            row = {"key": key, "exchange": label, "anchor_stmt": anchor}
            for name, seconds in per_call.items():
                values = [s * 1e9 for s in seconds]
                row[name] = {
                    "best_ns": min(values),
                    "median_ns": statistics.median(values),
                    "number": numbers[name],
                    "repeats_ns": values,
                }
            rows.append(row)

    print()
    print(
        f"Python {versions['python']}, numpy {versions['numpy']}, torch "
        f"{versions.get('torch', '-')}, tvm_ffi {versions.get('tvm_ffi', '-')}; "
        f"{exchange['_cpu_model']()}, nproc={exchange['_nproc']()}; best of {repeats} repeats "
        f"of ~{target_s:g} s"
    )
    print()
    print("| exchange | hand-written | ratio | #[pyclass] | ratio | pyclass/hand | goal |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for row in rows:
        hand, probe = row["hand"]["best_ns"], row["pyclass"]["best_ns"]
        ratios = {}
        for kind in TYPES:
            anchor = row.get(f"anchor_{kind}", row.get("anchor"))
            if anchor is not None:
                ratios[kind] = row[kind]["best_ns"] / anchor["best_ns"]
        goal = GOALS.get(row["key"])
        verdict = ""
        if goal is not None and ratios:
            met = ["met" if ratios[k] <= goal else "missed" for k in TYPES]
            verdict = f"≤ {goal}×: {met[0]} / {met[1]}"
        shown = {k: f"{ratios[k]:.2f}×" if k in ratios else "—" for k in TYPES}
        print(
            f"| `{row['exchange']}` | {fmt(hand)} | {shown['hand']} | {fmt(probe)} | "
            f"{shown['pyclass']} | {probe / hand:.2f}× | {verdict} |"
        )
    print()
    print("ratio = the row's statement / its anchor (bench_exchange.py's); goal: hand / pyclass.")
    for row in rows:
        if "anchor_hand" in row:
            print(
                f"`{row['anchor_stmt']}` is timed per type: hand "
                f"{fmt(row['anchor_hand']['best_ns'])}, pyclass "
                f"{fmt(row['anchor_pyclass']['best_ns'])}."
            )
    elapsed = time.perf_counter() - started
    print(f"benchmark took {elapsed:.0f} s", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"versions": versions, "repeats": repeats, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
