#!/usr/bin/env python
"""Per-call cost of DLPack exchange through ``dlpack.asdlpack`` versus native exchange.

Run from the repository root with the python that has ``dlpack-adapter`` installed::

    python bench/bench_exchange.py            # full run, about a minute and a half
    python bench/bench_exchange.py --quick    # smoke run, under 20 s
    python bench/bench_exchange.py --json out.json

Every row times a small numpy float32 array of shape (12,) (or a torch CPU tensor over the same
data), so the numbers are the fixed per-call overhead of the exchange, not memory traffic.
Each statement is compiled inline by ``timeit`` (no lambda); ``Timer.autorange`` picks its loop
count (scaled to the target time per repeat) and ``Timer.repeat`` times it several times (see
``bench/_bench_timing.py``); "ours" and its anchor are repeated alternately so both see the same
machine noise. The table shows the best repeat; ``--json`` also keeps the median and
every repeat.

The competitor ``pydlpack`` also has the import name ``dlpack``, so it is timed in a separate
subprocess whose ``sys.path`` starts with ``bench/.pydlpack`` (see ``bench/install_pydlpack.sh``
or ``--install-pydlpack``); the subprocess reports its timings back as JSON.

Any row whose library is missing or whose exchange raises is skipped with a printed reason.
"""

import argparse
import json
import os
import platform
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
PYDLPACK_DIR = os.path.join(HERE, ".pydlpack")
PYDLPACK_SPEC = "pydlpack==0.2.1"
CHILD_FLAG = "--_pydlpack-child"


def _same_path(p: str, q: str) -> bool:
    return os.path.abspath(p or os.curdir) == os.path.abspath(q)


def _guard_sys_path(child: bool) -> None:
    """Keep bench/ (the script's own directory) from shadowing anything.

    In the pydlpack child, also put bench/.pydlpack first and drop the repository root, so
    ``import dlpack`` is pydlpack and never our package.
    """
    sys.path[:] = [p for p in sys.path if not _same_path(p, HERE)]
    if child:
        sys.path[:] = [p for p in sys.path if not _same_path(p, REPO_ROOT)]
        sys.path.insert(0, PYDLPACK_DIR)


# --------------------------------------------------------------------------------------------
# timing


interleaved = runpy.run_path(os.path.join(HERE, "_bench_timing.py"))["interleaved"]


def measure(stmts: dict[str, str], namespace: dict, repeats: int, target_s: float) -> dict:
    """Time each statement; repeats of the statements are interleaved. Returns ns per call."""
    timers = {key: timeit.Timer(stmt, globals=namespace) for key, stmt in stmts.items()}
    numbers, per_call = interleaved(timers, repeats, target_s)
    results = {}
    for key, seconds in per_call.items():
        values = [s * 1e9 for s in seconds]
        results[key] = {
            "stmt": stmts[key],
            "best_ns": min(values),
            "median_ns": statistics.median(values),
            "number": numbers[key],
            "repeats_ns": values,
        }
    return results


def fmt_time(ns: float) -> str:
    if ns < 1000:
        return f"{ns:.0f} ns"
    if ns < 100_000:
        return f"{ns / 1000:.2f} µs"
    return f"{ns / 1000:.0f} µs"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# checks: each exchange is run once, and its result checked, before it is timed


def _check_numpy(result, src_ptr: int, expected) -> None:
    import numpy as np

    if not isinstance(result, np.ndarray):
        raise TypeError(f"expected numpy.ndarray, got {type(result).__name__}")
    if result.ctypes.data != src_ptr:
        raise AssertionError("result does not share memory with the source (copied?)")
    if not np.array_equal(result, expected):
        raise AssertionError(f"wrong values: {result!r}")


def _check_torch(result, src_ptr: int, expected) -> None:
    import numpy as np
    import torch

    if not isinstance(result, torch.Tensor):
        raise TypeError(f"expected torch.Tensor, got {type(result).__name__}")
    if result.data_ptr() != src_ptr:
        raise AssertionError("result does not share memory with the source (copied?)")
    if not np.array_equal(result.numpy(), expected):
        raise AssertionError(f"wrong values: {result!r}")


def _check_tvm(result, src_ptr: int, expected) -> None:
    import numpy as np

    _check_numpy(np.from_dlpack(result), src_ptr, expected)


def _check_capsule(result, src_ptr: int, expected) -> None:
    if type(result).__name__ != "PyCapsule":
        raise TypeError(f"expected a PyCapsule, got {type(result).__name__}")
    if not str(result).startswith('<capsule object "dltensor'):
        raise AssertionError(f"not a DLPack capsule: {result!r}")


def _check_memoryview(result, src_ptr: int, expected) -> None:
    import numpy as np

    if not isinstance(result, memoryview):
        raise TypeError(f"expected memoryview, got {type(result).__name__}")
    _check_numpy(np.asarray(result), src_ptr, expected)


def _check_any(result, src_ptr: int, expected) -> None:
    if not (hasattr(result, "__dlpack__") and hasattr(result, "__dlpack_device__")):
        raise TypeError(f"{type(result).__name__} has no __dlpack__/__dlpack_device__")


def try_stmt(stmt: str, namespace: dict, check) -> str | None:
    """Run ``stmt`` once and check its value; return None if fine, else the reason."""
    try:
        result = eval(stmt, namespace)
        check(result, namespace["SRC_PTR"], namespace["EXPECTED"])
    except Exception as exc:
        return f"`{stmt}` failed: {type(exc).__name__}: {exc}"
    return None


# --------------------------------------------------------------------------------------------
# environment


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nproc() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 0


def _version(module_name: str) -> str | None:
    try:
        module = __import__(module_name)
    except Exception:
        return None
    return getattr(module, "__version__", "?")


# --------------------------------------------------------------------------------------------
# the pydlpack child process


def child_main(out_path: str, repeats: int, target_s: float) -> None:
    """Time pydlpack (imported as ``dlpack`` from bench/.pydlpack) and write JSON to out_path."""
    report: dict = {"results": {}, "skipped": [], "repeats": repeats, "target_s": target_s}

    def dump() -> None:
        with open(out_path, "w") as f:
            json.dump(report, f)

    try:
        import numpy as np

        import dlpack as pydlpack

        where = os.path.abspath(pydlpack.__file__)
        if not where.startswith(os.path.abspath(PYDLPACK_DIR) + os.sep):
            raise ImportError(f"`import dlpack` found {where}, not pydlpack in {PYDLPACK_DIR}")
        report["pydlpack_version"] = getattr(pydlpack, "__version__", "?")
        report["pydlpack_file"] = where
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        dump()
        return

    a = np.arange(12, dtype=np.float32)
    ns = {
        "np": np,
        "a": a,
        "asdlpack": pydlpack.asdlpack,
        "SRC_PTR": a.ctypes.data,
        "EXPECTED": a.copy(),
    }
    groups = [
        ("np", {"np": "np.from_dlpack(asdlpack(a))", "np_native": "np.from_dlpack(a)"}),
        ("asdlpack", {"asdlpack": "asdlpack(a)"}),
    ]
    try:
        import torch

        ns["torch"] = torch
        groups.insert(
            1,
            (
                "torch",
                {"torch": "torch.from_dlpack(asdlpack(a))", "torch_native": "torch.from_dlpack(a)"},
            ),
        )
    except Exception as exc:
        report["skipped"].append(f"pydlpack torch rows: torch does not import ({exc})")

    checks = {
        "np": _check_numpy,
        "np_native": _check_numpy,
        "torch": _check_torch,
        "torch_native": _check_torch,
        "asdlpack": _check_any,
    }
    for _name, stmts in groups:
        ok = {}
        for key, stmt in stmts.items():
            reason = try_stmt(stmt, ns, checks[key])
            if reason:
                report["skipped"].append(f"pydlpack: {reason}")
            else:
                ok[key] = stmt
        if ok:
            report["results"].update(measure(ok, ns, repeats, target_s))
    dump()


def run_pydlpack_child(repeats: int, target_s: float, timeout_s: float) -> dict:
    if not os.path.isfile(os.path.join(PYDLPACK_DIR, "dlpack", "__init__.py")):
        return {
            "error": f"pydlpack is not installed in {PYDLPACK_DIR} "
            "(run bench/install_pydlpack.sh, or pass --install-pydlpack)"
        }
    # pydlpack 0.2.1 leaks its DLManagedTensor buffers and ctypes callbacks (several KiB a call,
    # about 1 GB for a full-length run), and at ~40 µs a call it needs far fewer loops for a
    # stable number: cap its repeats and time per repeat.
    repeats, target_s = min(repeats, 7), min(target_s, 0.1)
    fd, out_path = tempfile.mkstemp(prefix="pydlpack-bench-", suffix=".json")
    os.close(fd)
    cmd = [sys.executable, os.path.abspath(__file__), CHILD_FLAG, out_path]
    cmd += ["--repeats", str(repeats), "--target", str(target_s)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        try:
            with open(out_path) as f:
                report = json.load(f)
        except (OSError, ValueError):
            tail = (proc.stdout + proc.stderr).strip()[-2000:]
            return {"error": f"child exited {proc.returncode} without a report: {tail}"}
        # pydlpack prints its own leak warnings from atexit handlers.
        report["child_output"] = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        if proc.returncode:
            report["child_returncode"] = proc.returncode
        return report
    except subprocess.TimeoutExpired:
        return {"error": f"child timed out after {timeout_s:.0f} s"}
    finally:
        os.unlink(out_path)


def install_pydlpack() -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", PYDLPACK_DIR]
    log("$ " + " ".join(cmd + [PYDLPACK_SPEC]))
    subprocess.run(cmd + [PYDLPACK_SPEC], check=True)


# --------------------------------------------------------------------------------------------
# main


def import_ours():
    """Return (asdlpack, version, file) for our package, or raise ImportError with a reason."""
    try:
        import dlpack
    except ImportError:
        dlpack = None
    if dlpack is None or not hasattr(dlpack, "asdlpack"):
        # Not installed into this python: fall back to a build in the repository (maturin
        # develop puts dlpack/_dlpack*.so next to the Python sources).
        for name in [m for m in sys.modules if m == "dlpack" or m.startswith("dlpack.")]:
            del sys.modules[name]
        sys.path.insert(0, REPO_ROOT)
        try:
            import dlpack
        except ImportError as exc:
            raise ImportError(f"`import dlpack` failed: {exc}") from exc
    where = getattr(dlpack, "__file__", None) or ", ".join(getattr(dlpack, "__path__", []))
    where = os.path.abspath(where) if where else "?"
    if where.startswith(os.path.abspath(PYDLPACK_DIR)) or hasattr(dlpack, "capsule"):
        raise ImportError(f"`import dlpack` is pydlpack ({where}), not dlpack-adapter")
    if not hasattr(dlpack, "asdlpack"):
        raise ImportError(f"`dlpack` at {where} has no asdlpack (extension not built yet?)")
    try:
        import importlib.metadata

        version = importlib.metadata.version("dlpack-adapter")
    except Exception:
        version = getattr(dlpack, "__version__", "?")
    return dlpack.asdlpack, version, where


# Rows: key, exchange shown, our statement, anchor label, anchor statement, check, needs.
ROWS = [
    (
        "numpy",
        "np.from_dlpack(asdlpack(a))",
        "np.from_dlpack(asdlpack(a))",
        "np.from_dlpack(a)",
        "np.from_dlpack(a)",
        _check_numpy,
        ("np",),
    ),
    (
        "torch",
        "torch.from_dlpack(asdlpack(a))",
        "torch.from_dlpack(asdlpack(a))",
        "torch.from_dlpack(a)",
        "torch.from_dlpack(a)",
        _check_torch,
        ("np", "torch"),
    ),
    (
        "numpy_from_torch",
        "np.from_dlpack(asdlpack(t))",
        "np.from_dlpack(asdlpack(t))",
        "np.from_dlpack(t)",
        "np.from_dlpack(t)",
        _check_numpy,
        ("np", "torch"),
    ),
    (
        "dunder_dlpack",
        "obj.__dlpack__(max_version=(1, 0))",
        "obj.__dlpack__(max_version=(1, 0))",
        "a.__dlpack__(max_version=(1, 0))",
        "a.__dlpack__(max_version=(1, 0))",
        _check_capsule,
        ("np", "obj"),
    ),
    ("asdlpack", "asdlpack(a)", "asdlpack(a)", None, None, _check_any, ("np",)),
    (
        "tvm_ffi",
        "tvm_ffi.from_dlpack(asdlpack(a))",
        "tvm_ffi.from_dlpack(asdlpack(a))",
        "tvm_ffi.from_dlpack(t)",
        "tvm_ffi.from_dlpack(t)",
        _check_tvm,
        ("np", "torch", "tvm_ffi"),
    ),
    # the other protocols out the buffer protocol and the array interface
    (
        "memoryview",
        "memoryview(obj)",
        "memoryview(obj)",
        "memoryview(a)",
        "memoryview(a)",
        _check_memoryview,
        ("np", "obj"),
    ),
    (
        "asarray",
        "np.asarray(obj)",
        "np.asarray(obj)",
        "np.from_dlpack(obj)",
        "np.from_dlpack(obj)",
        _check_numpy,
        ("np", "obj"),
    ),
    (
        "memoryview_torch",
        "memoryview(asdlpack(t))",
        "memoryview(asdlpack(t))",
        "memoryview(t.numpy())",
        "memoryview(t.numpy())",
        _check_memoryview,
        ("np", "torch"),
    ),
]

# pydlpack rows: our row key, exchange shown, pydlpack result key (in the child).
PYDLPACK_ROWS = [
    ("numpy", "np.from_dlpack(asdlpack(a))", "np"),
    ("torch", "torch.from_dlpack(asdlpack(a))", "torch"),
    ("asdlpack", "asdlpack(a)", "asdlpack"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (< 20 s)")
    parser.add_argument("--json", metavar="PATH", help="also write the raw numbers here")
    parser.add_argument("--repeats", type=int, help="repeats per statement (default 15, quick 5)")
    parser.add_argument("--target", type=float, help="seconds per repeat (default 0.2, quick 0.03)")
    parser.add_argument("--no-pydlpack", action="store_true", help="skip the pydlpack child")
    parser.add_argument(
        "--install-pydlpack",
        action="store_true",
        help=f"pip install {PYDLPACK_SPEC} into bench/.pydlpack first",
    )
    parser.add_argument(CHILD_FLAG, metavar="OUT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    repeats = args.repeats or (5 if args.quick else 15)
    target_s = args.target or (0.03 if args.quick else 0.2)

    child_out = getattr(args, CHILD_FLAG.lstrip("-").replace("-", "_"))
    if child_out:
        child_main(child_out, repeats, target_s)
        return 0

    started = time.perf_counter()
    if args.install_pydlpack:
        install_pydlpack()

    skipped: list[str] = []
    ns: dict = {}
    env = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "nproc": _nproc(),
        "repeats": repeats,
        "target_s_per_repeat": target_s,
    }

    try:
        import numpy as np
    except Exception as exc:
        print(f"numpy does not import ({exc}); nothing to benchmark", file=sys.stderr)
        return 1
    ns["np"] = np
    env["numpy"] = np.__version__
    a = np.arange(12, dtype=np.float32)
    ns.update(a=a, SRC_PTR=a.ctypes.data, EXPECTED=a.copy())

    try:
        import torch

        ns["torch"] = torch
        env["torch"] = torch.__version__
        t = torch.from_numpy(a)  # same memory as `a`, so the checks can compare pointers
        ns["t"] = t
    except Exception as exc:
        skipped.append(f"torch rows: torch does not import ({type(exc).__name__}: {exc})")

    try:
        import tvm_ffi

        ns["tvm_ffi"] = tvm_ffi
        env["tvm_ffi"] = getattr(tvm_ffi, "__version__", "?")
    except Exception as exc:
        skipped.append(f"tvm_ffi row: tvm_ffi does not import ({type(exc).__name__}: {exc})")

    try:
        asdlpack, version, where = import_ours()
        ns["asdlpack"] = asdlpack
        env["dlpack_adapter"] = version
        env["dlpack_adapter_file"] = where
        try:
            ns["obj"] = asdlpack(a)
        except Exception as exc:
            skipped.append(f"`obj = asdlpack(a)` failed: {type(exc).__name__}: {exc}")
    except ImportError as exc:
        skipped.append(f"all `ours` rows: {exc}")

    rows = []
    for key, label, ours_stmt, anchor_label, anchor_stmt, check, needs in ROWS:
        row = {"key": key, "exchange": label, "anchor_label": anchor_label}
        anchor_ok = anchor_stmt is not None and all(n in ns for n in needs if n != "obj")
        if anchor_ok:
            reason = try_stmt(anchor_stmt, ns, check)
            if reason:
                skipped.append(f"anchor of {key}: {reason}")
                anchor_ok = False
        ours_ok = "asdlpack" in ns and all(n in ns for n in needs)
        if ours_ok:
            reason = try_stmt(ours_stmt, ns, check)
            if reason:
                skipped.append(f"{key}: {reason}")
                ours_ok = False
        stmts = {}
        if ours_ok:
            stmts["ours"] = ours_stmt
        if anchor_ok:
            stmts["anchor"] = anchor_stmt
        if not stmts:
            continue
        log(f"timing {key}: {' | '.join(stmts.values())}")
        timings = measure(stmts, ns, repeats, target_s)
        row.update(timings)
        if "ours" in row and "anchor" in row:
            row["ratio_best"] = row["ours"]["best_ns"] / row["anchor"]["best_ns"]
            row["ratio_median"] = row["ours"]["median_ns"] / row["anchor"]["median_ns"]
        rows.append(row)

    pyd: dict = {}
    if args.no_pydlpack:
        skipped.append("pydlpack rows: --no-pydlpack")
    else:
        log("timing pydlpack in a subprocess")
        pyd = run_pydlpack_child(repeats, target_s, timeout_s=60 if args.quick else 240)
        if "error" in pyd:
            skipped.append(f"pydlpack rows: {pyd['error']}")
        else:
            env["pydlpack"] = pyd.get("pydlpack_version")
            skipped.extend(pyd.get("skipped", []))

    print_report(env, rows, pyd, skipped)
    elapsed = time.perf_counter() - started
    log(f"benchmark took {elapsed:.1f} s")

    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"env": env, "rows": rows, "pydlpack": pyd, "skipped": skipped, "wall_s": elapsed},
                f,
                indent=2,
            )
        log(f"raw numbers written to {args.json}")
    return 0


def print_report(env: dict, rows: list[dict], pyd: dict, skipped: list[str]) -> None:
    by_key = {row["key"]: row for row in rows}
    lines = [
        "| exchange | ours | native/anchor | ratio |",
        "|---|---:|---|---:|",
    ]
    for row in rows:
        ours = fmt_time(row["ours"]["best_ns"]) if "ours" in row else "skipped"
        if row.get("anchor_label") is None:
            anchor = "—"
        elif "anchor" in row:
            anchor = f"`{row['anchor_label']}`: {fmt_time(row['anchor']['best_ns'])}"
        else:
            anchor = f"`{row['anchor_label']}`: skipped"
        ratio = f"{row['ratio_best']:.2f}×" if "ratio_best" in row else "—"
        mark = " ¹" if row["key"] in ("dunder_dlpack", "memoryview", "asarray") else ""
        lines.append(f"| `{row['exchange']}`{mark} | {ours} | {anchor} | {ratio} |")

    results = pyd.get("results", {})
    for our_key, label, pyd_key in PYDLPACK_ROWS:
        if pyd_key not in results:
            continue
        theirs = results[pyd_key]["best_ns"]
        ours_row = by_key.get(our_key, {})
        if "ours" in ours_row:
            ours_ns = ours_row["ours"]["best_ns"]
            ratio = f"pydlpack/ours = {theirs / ours_ns:.0f}×"
            ours = fmt_time(ours_ns)
        else:
            ratio, ours = "—", "skipped"
        lines.append(f"| `{label}` vs pydlpack | {ours} | pydlpack: {fmt_time(theirs)} | {ratio} |")

    print()
    print(
        f"Python {env['python']} ({env['implementation']}), numpy {env.get('numpy', '-')}, "
        f"torch {env.get('torch', '-')}, tvm_ffi {env.get('tvm_ffi', '-')}, "
        f"dlpack-adapter {env.get('dlpack_adapter', '-')}, pydlpack {env.get('pydlpack', '-')}"
    )
    print(f"{env['cpu']}, nproc={env['nproc']}, {env['platform']}")
    print(
        f"a = np.arange(12, dtype=np.float32); t = torch.from_numpy(a); "
        f"best of {env['repeats']} repeats of ~{env['target_s_per_repeat']:g} s each"
    )
    print()
    print("\n".join(lines))
    print()
    print("ratio = ours / anchor (1.00× = parity, lower is better).")
    if results:
        print(
            "pydlpack rows: ratio = pydlpack / ours (higher is better); pydlpack is timed in its "
            f"own process, best of {pyd['repeats']} repeats of ~{pyd['target_s']:g} s."
        )
    if "dunder_dlpack" in by_key:
        print("¹ obj = asdlpack(a), built once; a returned capsule or view is dropped each call.")
    if pyd and "results" in pyd:
        native = {k: results[k]["best_ns"] for k in ("np_native", "torch_native") if k in results}
        if native:
            shown = ", ".join(
                f"{k.replace('_native', '')} {fmt_time(v)}" for k, v in native.items()
            )
            print(f"Native anchors in the pydlpack process: {shown}.")
        for line in pyd.get("child_output", []):
            print(f"pydlpack process said: {line}")
    if skipped:
        print()
        print("Skipped:")
        for reason in skipped:
            print(f"- {reason}")


if __name__ == "__main__":
    _guard_sys_path(child=CHILD_FLAG in sys.argv)
    sys.exit(main())
