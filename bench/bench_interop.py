#!/usr/bin/env python
"""Conversion speed of ``dlpack.interop`` against torch-jax-interop and the native from_dlpack.

Run from the repository root with the python that has ``dlpack-adapter`` (and torch, JAX,
torch-jax-interop) installed::

    python -P bench/bench_interop.py            # full run
    python -P bench/bench_interop.py --quick    # fewer repeats

Cases, on the CPU:

- a pytree of 1,000 small float32 tensors (500 layers of an (8, 8) weight and an (8,) bias),
  torch -> JAX, JAX -> torch and the round trip, ours against torch-jax-interop's
  ``torch_to_jax`` / ``jax_to_torch`` (goal: ours at least 3x faster on the round trip);
- one 64 MiB float32 tensor, ours against ``jax.dlpack.from_dlpack`` and ``torch.from_dlpack``
  (goal: ours at most 1.1x their time). ``to_torch`` copies JAX arrays by default (they are
  immutable and torch can't mark a tensor read-only); the zero-copy row passes
  ``share_readonly=True``, which is what ``torch.from_dlpack`` does;
- refilling a JAX array from a torch tensor with ``copyto_jax``: 64 MiB float32 against making
  a new JAX array, ``jnp.asarray(np.asarray(t))`` (goal: at most 1.0x its time); the peak
  resident memory one refill adds, measured in a fresh process (``/proc/self/status`` VmHWM
  after resetting it through ``/proc/self/clear_refs``; goal: under 1 MiB, no second buffer);
  and a 4 KiB refill against the jitted ``dst.at[...].set(src)`` with donation called directly
  on the tensor's numpy view (goal: at most 2x its time), and on a JAX array made beforehand.

Each pair is timed with ``timeit``: ``Timer.autorange()`` picks the loop count, then the two
timers' ``Timer.repeat`` runs alternate, one repeat at a time, so both see the same machine noise.
The table shows the best and the median repeat; ratios use the best. Results are checked for
equal values before timing. A row whose library is missing is skipped with a printed reason.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import timeit
import warnings
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))


def _guard_sys_path() -> None:
    """Keep bench/ (the script's own directory) from shadowing anything."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]


_guard_sys_path()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from dlpack.interop import copyto_jax, to_jax, to_torch  # noqa: E402

try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch_jax_interop as tji
except ImportError as exc:  # pragma: no cover - depends on the environment
    tji = None
    TJI_MISSING = f"torch-jax-interop not importable ({exc})"
else:
    TJI_MISSING = ""
    logging.getLogger("torch_jax_interop").setLevel(logging.ERROR)

LEAVES = 1000
BIG_BYTES = 64 << 20


def small_tree() -> dict[str, dict[str, torch.Tensor]]:
    """1,000 small tensors: 500 layers of an (8, 8) weight and an (8,) bias."""
    generator = torch.Generator().manual_seed(0)
    return {
        f"layer{i}": {"w": torch.randn(8, 8, generator=generator), "b": torch.zeros(8)}
        for i in range(LEAVES // 2)
    }


def timings(ours: Callable[[], object], theirs: Callable[[], object], repeats: int):
    """Seconds per call of each repeat, for both, their repeats interleaved."""
    ours_timer, theirs_timer = timeit.Timer(ours), timeit.Timer(theirs)
    ours_number, _ = ours_timer.autorange()
    theirs_number, _ = theirs_timer.autorange()
    ours_times, theirs_times = [], []
    for _ in range(repeats):
        ours_times += [t / ours_number for t in ours_timer.repeat(1, ours_number)]
        theirs_times += [t / theirs_number for t in theirs_timer.repeat(1, theirs_number)]
    return ours_times, theirs_times


def fmt(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def check_same(a, b) -> None:
    """Raise unless two pytrees (any mix of torch and JAX leaves) hold equal values."""
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 repeats instead of 15")
    args = parser.parse_args()
    repeats = 5 if args.quick else 15

    print(
        f"python {platform.python_version()}, torch {torch.__version__}, jax {jax.__version__}, "
        f"numpy {np.__version__}, torch-jax-interop "
        f"{getattr(tji, '__version__', None) or _dist_version('torch-jax-interop')}, "
        f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}"
    )
    tree = small_tree()
    jax_tree = to_jax(tree)
    big = torch.randn(BIG_BYTES // 4)
    big_jax = to_jax(big)
    rows: list[tuple[str, str, list[float], list[float], str, str]] = []
    # (case, anchor name, ours, theirs, ratio kind, goal); ratio kind "speedup" = theirs/ours.

    if TJI_MISSING:
        print(f"skipped the torch-jax-interop rows: {TJI_MISSING}")
    else:
        check_same(to_jax(tree), tji.torch_to_jax(tree))
        check_same(to_torch(jax_tree), tji.jax_to_torch(jax_tree))
        cases = [
            (
                f"pytree of {LEAVES:,} small tensors, torch -> JAX",
                lambda: to_jax(tree),
                lambda: tji.torch_to_jax(tree),
                "",
            ),
            (
                f"pytree of {LEAVES:,} small tensors, JAX -> torch (ours copies)",
                lambda: to_torch(jax_tree),
                lambda: tji.jax_to_torch(jax_tree),
                "",
            ),
            (
                f"pytree of {LEAVES:,} small tensors, JAX -> torch, share_readonly=True",
                lambda: to_torch(jax_tree, share_readonly=True),
                lambda: tji.jax_to_torch(jax_tree),
                "",
            ),
            (
                f"pytree of {LEAVES:,} small tensors, round trip torch -> JAX -> torch",
                lambda: to_torch(to_jax(tree)),
                lambda: tji.jax_to_torch(tji.torch_to_jax(tree)),
                ">= 3x",
            ),
        ]
        for case, ours, theirs, goal in cases:
            ours_times, theirs_times = timings(ours, theirs, repeats)
            rows.append((case, "torch-jax-interop", ours_times, theirs_times, "speedup", goal))

    check_same(to_jax(big), jax.dlpack.from_dlpack(big))
    check_same(to_torch(big_jax, share_readonly=True), torch.from_dlpack(big_jax))
    native = [
        (
            "64 MiB float32, torch -> JAX",
            "jax.dlpack.from_dlpack",
            lambda: to_jax(big),
            lambda: jax.dlpack.from_dlpack(big),
            "<= 1.1x",
        ),
        (
            "64 MiB float32, JAX -> torch, share_readonly=True",
            "torch.from_dlpack",
            lambda: to_torch(big_jax, share_readonly=True),
            lambda: torch.from_dlpack(big_jax),
            "<= 1.1x",
        ),
        (
            "64 MiB float32, JAX -> torch, default (one copy)",
            "torch.from_dlpack",
            lambda: to_torch(big_jax),
            lambda: torch.from_dlpack(big_jax),
            "",
        ),
    ]
    native += refill_cases()
    for case, anchor, ours, theirs, goal in native:
        ours_times, theirs_times = timings(ours, theirs, repeats)
        rows.append((case, anchor, ours_times, theirs_times, "ratio", goal))
    peak = refill_peak()

    print()
    print("| case | ours best | ours median | against | its best | its median | ratio | goal |")
    print("|---|---:|---:|---|---:|---:|---:|---|")
    for case, anchor, ours_times, theirs_times, kind, goal in rows:
        ours_best, theirs_best = min(ours_times), min(theirs_times)
        if kind == "speedup":
            value = theirs_best / ours_best
            ratio = f"{value:.1f}x faster"
            met = goal and value >= float(goal.split()[1].rstrip("x"))
        else:
            value = ours_best / theirs_best
            ratio = f"{value:.2f}x"
            met = goal and value <= float(goal.split()[1].rstrip("x"))
        verdict = f"{goal}: {'met' if met else 'missed'}" if goal else ""
        print(
            f"| {case} | {fmt(ours_best)} | {fmt(statistics.median(ours_times))} | {anchor} | "
            f"{fmt(theirs_best)} | {fmt(statistics.median(theirs_times))} | {ratio} | {verdict} |"
        )
    print()
    print(
        f"{repeats} repeats each, interleaved; 'x faster' = their best / our best, "
        "'x' = our best / their best (lower is better)."
    )
    print()
    print("| peak resident memory added, 64 MiB float32 refill from torch | MiB | goal |")
    print("|---|---:|---|")
    for case, mib, goal in peak:
        verdict = f"{goal}: {'met' if mib < 1 else 'missed'}" if goal else ""
        print(f"| {case} | {mib:.2f} | {verdict} |")
    return 0


def refill_cases() -> list[tuple[str, str, Callable[[], object], Callable[[], object], str]]:
    """copyto_jax against a new array at 64 MiB, and against the jitted donating
    ``at[].set`` it calls, at 4 KiB."""
    from dlpack.interop._refill import _refill_jit

    big = torch.randn(BIG_BYTES // 4)
    small = torch.randn(1024)
    small_jax = jnp.asarray(small.numpy().copy())
    state = {
        "big": jnp.zeros(big.shape, jnp.float32),
        "small": jnp.zeros(small.shape, jnp.float32),
    }
    refill = _refill_jit()

    def ours(key: str, src: torch.Tensor) -> Callable[[], object]:
        def call() -> None:
            state[key] = copyto_jax(state[key], src)

        return call

    def direct(src: object) -> Callable[[], object]:
        def call() -> None:
            state["small"] = refill(state["small"], src).block_until_ready()

        return call

    for key, src in (("big", big), ("small", small)):
        before = state[key].unsafe_buffer_pointer()
        ours(key, src)()
        assert state[key].unsafe_buffer_pointer() == before, "the refill was not in place"
        check_same(state[key], src)
    return [
        (
            "64 MiB float32, copyto_jax(dst, t) (refill)",
            "jnp.asarray(np.asarray(t)) (new)",
            ours("big", big),
            lambda: jnp.asarray(np.asarray(big)).block_until_ready(),
            "<= 1.0x",
        ),
        (
            "4 KiB float32, copyto_jax(dst, t)",
            "jitted donating at[].set(t.numpy())",
            ours("small", small),
            direct(small.numpy()),
            "<= 2x",
        ),
        (
            "4 KiB float32, copyto_jax(dst, t)",
            "the same on a JAX array made before",
            ours("small", small),
            direct(small_jax),
            "",
        ),
    ]


# One 64 MiB refill from a torch tensor in a fresh process: the peak resident memory added by
# the first (which compiles) and by the second, in MiB.
PEAK = """
import json, sys
import jax.numpy as jnp, torch
from dlpack.interop import copyto_jax

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024

def added(refill):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark starts again from what is resident now
    start = status("VmRSS")
    refill()
    return status("VmHWM") - start

state = {"dst": jnp.zeros(BYTES // 4, jnp.float32).block_until_ready()}
src = torch.randn(BYTES // 4)

def refill():
    state["dst"] = copyto_jax(state["dst"], src)

print(json.dumps([added(refill), added(refill)]))
"""


def refill_peak() -> list[tuple[str, float, str]]:
    if not os.access("/proc/self/clear_refs", os.W_OK):
        print("skipped the peak memory rows: /proc/self/clear_refs is not writable here")
        return []
    done = subprocess.run(
        [sys.executable, "-P", "-c", PEAK.replace("BYTES", str(BIG_BYTES))],
        capture_output=True,
        text=True,
        check=True,
    )
    first, second = json.loads(done.stdout.splitlines()[-1])
    return [
        ("the first refill in a process (compiles)", first, ""),
        ("one refill", second, "< 1 MiB"),
    ]


def _dist_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    sys.exit(main())
