#!/usr/bin/env python
"""Memory cost of DLPack exchange through ``dlpack``: bytes per object, and growth over many
exchanges.

    python bench/bench_memory.py [--n 1000000]

Prints the bytes behind one ``DLPackObject`` and one capsule (Python object plus the Rust
allocations behind it), then runs each exchange ``--n`` times and reports the resident-set growth,
which should stay near zero: every capsule freed exactly once, every source released.
"""

import argparse
import gc
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]

import numpy as np  # noqa: E402

from dlpack import _dlpack, asdlpack  # noqa: E402


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def footprint(a) -> list[tuple[str, int]]:
    obj = asdlpack(a)
    rust = dict(_dlpack._testing.footprint(a.ndim))
    capsule = obj.__dlpack__(max_version=(1, 3))
    rows = [
        (
            "DLPackObject (Python object + tensor description + dims)",
            sys.getsizeof(obj) + rust["tensor description"] + rust["tensor dims"],
        ),
        (
            "versioned capsule (PyCapsule + managed tensor, shape, strides)",
            sys.getsizeof(capsule) + rust["versioned capsule allocation"],
        ),
        (
            "legacy capsule (PyCapsule + managed tensor, shape, strides)",
            sys.getsizeof(capsule) + rust["legacy capsule allocation"],
        ),
    ]
    return rows


def growth(label: str, step, n: int) -> tuple[str, float]:
    for _ in range(min(n, 10_000)):  # warm up allocator pools
        step()
    gc.collect()
    before = rss_bytes()
    for _ in range(n):
        step()
    gc.collect()
    return label, (rss_bytes() - before) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    n = parser.parse_args().n
    a = np.arange(12, dtype=np.float32)
    print(f"a = np.arange(12, dtype=np.float32) (1-d); {n} exchanges per row\n")
    print("| object | bytes |\n|---|---:|")
    for name, size in footprint(a):
        print(f"| {name} | {size} |")
    obj = asdlpack(a)
    steps = [
        ("np.from_dlpack(asdlpack(a))", lambda: np.from_dlpack(asdlpack(a))),
        (
            "unconsumed obj.__dlpack__(max_version=(1, 3))",
            lambda: obj.__dlpack__(max_version=(1, 3)),
        ),
        ("unconsumed obj.__dlpack__() (legacy)", lambda: obj.__dlpack__()),
        ("asdlpack(bytearray) -> np.from_dlpack", lambda: np.from_dlpack(asdlpack(bytearray(48)))),
    ]
    try:
        import torch

        t = torch.arange(12, dtype=torch.float32)
        steps += [
            ("torch.from_dlpack(asdlpack(a))", lambda: torch.from_dlpack(asdlpack(a))),
            (
                "np.from_dlpack(asdlpack(t)), t torch (C exchange API)",
                lambda: np.from_dlpack(asdlpack(t)),
            ),
        ]
    except ImportError:
        print("\n(torch not installed: its rows are skipped)")
    print("\n| exchange | RSS growth (MiB) |\n|---|---:|")
    for label, step in steps:
        label, mib = growth(label, step, n)
        print(f"| {label} | {mib:+.2f} |")


if __name__ == "__main__":
    main()
