#!/usr/bin/env python
"""Throughput of the CPU copy engine (``dlpack.copyto``) against numpy and torch.

Run from the repository root with the python that has ``dlpack-adapter`` installed::

    python -P bench/bench_copy.py            # full run
    python -P bench/bench_copy.py --quick    # fewer repeats
    python -P bench/bench_copy.py --json out.json

Cases (float32): a contiguous 64 MiB copy, a 4096x4096 transpose, a 64**4 permute (3, 1, 2, 0)
and a stride-2 gather; then contiguous copies of 4 KiB, 64 KiB and 1 MiB (the cost of a call).
Each competitor writes into its own preallocated destination; timeit times it
(``bench/_bench_timing.py``: ``Timer.autorange`` picks the loop count, ``Timer.repeat`` times
it), repeats of the competitors are interleaved so they see the same machine noise, and the table
shows the best repeat. GB/s is 2 x the destination's bytes per second (what a copy reads and
writes; the stride-2 gather really reads twice that). Every result is checked against numpy's.

The transpose also gets a second table: ``dlpack.copyto`` of ``src.T`` against the limit, a
contiguous copy of the same bytes (the faster of ``np.copyto``, one memcpy, and
``dlpack.copyto``, memcpy on every core), timed in the same interleaved repeats.

The engine measures, on the first copy of each kind large enough, how many threads and which
stores to use (the check of each case's result, before the timing, is that copy); the run ends
with what it chose and what the measuring cost, as ``python -m dlpack`` shows it. The header
names the CPU (``lscpu``'s model line) and the load average before and after the run: the
machine's other work changes the figures.

A row whose library is missing, or whose call raises, is skipped with a printed reason.
"""

import argparse
import json
import os
import platform
import runpy
import subprocess
import sys
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))


def _guard_sys_path() -> None:
    """Keep bench/ (the script's own directory) from shadowing anything."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]


_guard_sys_path()

import numpy as np  # noqa: E402

try:
    import torch
except ImportError as exc:  # pragma: no cover - depends on the environment
    torch = None
    TORCH_MISSING = f"torch not installed ({exc})"
else:
    TORCH_MISSING = ""

try:
    import dlpack
except ImportError as exc:  # pragma: no cover
    dlpack = None
    DLPACK_MISSING = f"dlpack not importable ({exc})"
else:
    DLPACK_MISSING = "" if hasattr(dlpack, "copyto") else "this build has no dlpack.copyto"


interleaved = runpy.run_path(os.path.join(HERE, "_bench_timing.py"))["interleaved"]


def case_inputs(name: str):
    """(numpy source view, numpy destination factory, torch source view or None)."""
    rng = np.random.default_rng(0)
    if name == "contiguous":
        base = rng.random(16 * 1024 * 1024, dtype=np.float32)  # 64 MiB
        view = base
        t = torch.from_numpy(base) if torch is not None else None
    elif name == "transpose":
        base = rng.random((4096, 4096), dtype=np.float32)
        view = base.T
        t = torch.from_numpy(base).T if torch is not None else None
    elif name == "permute":
        base = rng.random((64, 64, 64, 64), dtype=np.float32)
        view = base.transpose(3, 1, 2, 0)
        t = torch.from_numpy(base).permute(3, 1, 2, 0) if torch is not None else None
    elif name == "gather":
        base = rng.random(32 * 1024 * 1024, dtype=np.float32)  # 128 MiB, every other item
        view = base[::2]
        t = torch.from_numpy(base)[::2] if torch is not None else None
    elif name in SMALL:
        view = rng.random(SMALL[name] // 4, dtype=np.float32)
        t = None
    else:
        raise ValueError(name)
    return view, t


# Contiguous copies small enough that the call's own cost shows: name -> bytes.
SMALL = {"4k": 4 << 10, "64k": 64 << 10, "1m": 1 << 20}

CASES = {
    "contiguous": "contiguous float32, 64 MiB",
    "transpose": "4096x4096 float32 `src.T`",
    "permute": "64^4 float32 permute (3,1,2,0)",
    "gather": "stride-2 gather `src[::2]`, 64 MiB out",
    "4k": "contiguous float32, 4 KiB",
    "64k": "contiguous float32, 64 KiB",
    "1m": "contiguous float32, 1 MiB",
}


# Cases also timed against a contiguous copy of the same bytes (the limit), and the row's label.
LIMITS = {
    "transpose": "4096x4096 float32 transpose copy / contiguous memcpy of the same bytes "
    "(the limit)",
}
# The contiguous copies that may set the limit: timing key -> label.
LIMIT_KEYS = {"memcpy numpy": "np.copyto", "memcpy dlpack": "dlpack.copyto"}


def run_case(name: str, repeats: int, min_time: float) -> dict:
    src, src_t = case_inputs(name)
    expected = np.ascontiguousarray(src)
    nbytes = expected.nbytes
    fns: dict[str, object] = {}
    skipped: dict[str, str] = {}

    d_np = np.empty_like(expected)
    fns["numpy"] = lambda: np.copyto(d_np, src)
    outputs = {"numpy": d_np}

    if DLPACK_MISSING:
        skipped["dlpack"] = DLPACK_MISSING
    else:
        d_ours = np.empty_like(expected)
        try:
            dlpack.copyto(d_ours, src)
        except Exception as exc:  # noqa: BLE001 - report any failure as a skip reason
            skipped["dlpack"] = f"dlpack.copyto raised {type(exc).__name__}: {exc}"
        else:
            fns["dlpack"] = lambda: dlpack.copyto(d_ours, src)
            outputs["dlpack"] = d_ours

    if name not in ("contiguous", "gather", *SMALL):
        if torch is None:
            skipped["torch"] = TORCH_MISSING
        else:
            d_torch = torch.empty(tuple(expected.shape), dtype=torch.float32)
            fns["torch"] = lambda: d_torch.copy_(src_t)
            outputs["torch"] = d_torch.numpy()

    if name in LIMITS:
        # The same bytes, contiguous on both sides.
        same = np.ascontiguousarray(expected)
        d_np_mem = np.empty_like(same)
        fns["memcpy numpy"] = lambda: np.copyto(d_np_mem, same)
        outputs["memcpy numpy"] = d_np_mem
        if "dlpack" in fns:
            d_ours_mem = np.empty_like(same)
            fns["memcpy dlpack"] = lambda: dlpack.copyto(d_ours_mem, same)
            outputs["memcpy dlpack"] = d_ours_mem

    for key, fn in fns.items():
        fn()
        if not np.array_equal(outputs[key], expected):
            raise AssertionError(f"{name}: {key} produced a wrong result")

    _, times = interleaved({key: timeit.Timer(fn) for key, fn in fns.items()}, repeats, min_time)
    return {"bytes": nbytes, "times": times, "skipped": skipped}


def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def fmt_rate(nbytes: int, seconds: float) -> str:
    return f"{2 * nbytes / seconds / 1e9:.1f} GB/s"


def cell(best: dict, key: str, nbytes: int) -> str:
    if key in best:
        return f"{fmt_time(best[key])} ({fmt_rate(nbytes, best[key])})"
    return "—"


def ratio(best: dict, key: str) -> str:
    if key in best and "dlpack" in best:
        return f"{best[key] / best['dlpack']:.2f}×"
    return "—"


def table(results: dict) -> str:
    lines = [
        "| case | dlpack.copyto | np.copyto | torch copy_ | numpy/ours | torch/ours |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, res in results.items():
        best = {key: min(ts) for key, ts in res["times"].items()}
        cells = " | ".join(cell(best, key, res["bytes"]) for key in ("dlpack", "numpy", "torch"))
        lines.append(
            f"| {CASES[name]} | {cells} | {ratio(best, 'numpy')} | {ratio(best, 'torch')} |"
        )
    return "\n".join(lines)


def limit_table(results: dict) -> str:
    """The cases timed against the limit: ours, each contiguous copy, ours / the fastest."""
    lines = [
        "| ratio | dlpack.copyto | limit (fastest contiguous copy) | "
        + " | ".join(f"{label} contiguous" for label in LIMIT_KEYS.values())
        + " | limit / ours |",
        "|---|---:|---:|" + "---:|" * len(LIMIT_KEYS) + "---:|",
    ]
    for name, res in results.items():
        if name not in LIMITS:
            continue
        best = {key: min(ts) for key, ts in res["times"].items()}
        limits = {key: best[key] for key in LIMIT_KEYS if key in best}
        if "dlpack" not in best or not limits:
            continue
        fastest = min(limits, key=limits.__getitem__)
        cells = " | ".join(cell(best, key, res["bytes"]) for key in LIMIT_KEYS)
        lines.append(
            f"| {LIMITS[name]} | {cell(best, 'dlpack', res['bytes'])} | "
            f"{LIMIT_KEYS[fastest]}: {fmt_time(limits[fastest])} | {cells} | "
            f"{limits[fastest] / best['dlpack']:.2f}× |"
        )
    return "\n".join(lines) if len(lines) > 2 else ""


def cpu_model() -> str:
    """``lscpu``'s model line (or /proc/cpuinfo's), and its L3 line where it has one."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        out = ""
    lines = {k.strip(): v.strip() for k, _, v in (x.partition(":") for x in out.splitlines())}
    if "Model name" in lines:
        l3 = f", L3 {lines['L3 cache']}" if "L3 cache" in lines else ""
        return f"Model name: {lines['Model name']}{l3}"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return "Model name: " + line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load() -> str:
    try:
        return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "load average unknown"


def engine_report() -> list[str]:
    """What the copy engine chose in this run, and what measuring cost."""
    if DLPACK_MISSING:
        return []
    try:
        from dlpack import _dlpack
        from dlpack._report._engine import engine_lines

        return engine_lines(_dlpack._copy_engine())
    except (ImportError, AttributeError) as exc:
        return [f"(this build reports no copy engine choices: {exc})"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repeats")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--json", metavar="PATH", help="also write every repeat as JSON")
    parser.add_argument("cases", nargs="*", choices=[*CASES, []], help="cases (default all)")
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 9)
    min_time = 0.05 if args.quick else 0.2

    before = load()
    results = {}
    for name in args.cases or list(CASES):
        results[name] = run_case(name, repeats, min_time)

    versions = [f"numpy {np.__version__}"]
    if torch is not None:
        versions.append(f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    print(f"{cpu_model()}; {os.cpu_count()} CPUs; {before} before the run, {load()} after")
    print(", ".join(versions) + f", best of {repeats} repeats\n")
    print(table(results))
    print(
        "\nratio = competitor time / ours (higher is better for us); "
        "GB/s = 2 x destination bytes / time"
    )
    limits = limit_table(results)
    if limits:
        print("\n" + limits)
    engine = engine_report()
    if engine:
        print("\n" + "\n".join(engine))
    for name, res in results.items():
        for key, reason in res["skipped"].items():
            print(f"skipped {key} for {name}: {reason}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
