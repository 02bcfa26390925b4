#!/usr/bin/env python
"""Instructions per call of the Rust API's functions against rust-numpy's, counted by callgrind:
the figures that don't move with the VM's noise, beside ``bench_rust_api.py``'s timings.

With the comparison extension installed (see ``bench_rust_api.py``) and valgrind on PATH::

    python -P bench/count_rust_api.py

Each function runs under ``valgrind --tool=callgrind``, counting only inside the function's
PyO3 wrapper (``--toggle-collect``), at two numbers of calls; the difference divided by the
difference in calls is the cost of one call with the interpreter's loop and start-up taken out.

Which crate borrows first in a process installs rust-numpy's borrow flags, which decides how the
two crates' borrows meet (docs/internals.md, "rust-numpy's borrows"): each function runs in a
process of its own, alone (``--first each``), or after one borrow of the other kind
(``--first dlpack``: the runtime's table; ``--first rust-numpy``: rust-numpy's).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

PAIRS = [
    ("extraction only", "extract_view", "extract_numpy"),
    ("total(np f64[1000]), typed", "total_typed", "total_numpy"),
    ("total(np f64[1000]), view", "total_view", "total_numpy"),
]

LOOP = """
import sys
import numpy as np
import dlpack_bench_rust_api as b
f = getattr(b, sys.argv[1])
x = np.arange(1000, dtype=np.float64)
if sys.argv[3] == "dlpack":
    b.extract_view(np.zeros(1))
elif sys.argv[3] == "rust-numpy":
    b.extract_numpy(np.zeros(1))
for _ in range(100 + int(sys.argv[2])):
    f(x)
"""


def instructions(name: str, calls: int, workdir: str, first: str = "each") -> int:
    out = os.path.join(workdir, f"{name}.{calls}.out")
    script = os.path.join(workdir, "loop.py")
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            f"--toggle-collect=*__pyfunction_{name}*",
            sys.executable,
            "-P",
            script,
            name,
            str(calls),
            first,
        ],
        check=True,
        capture_output=True,
    )
    with open(out) as f:
        for line in f:
            if m := re.match(r"(?:summary|totals):\s*(\d+)", line):
                return int(m.group(1))
    raise RuntimeError(f"callgrind wrote no totals to {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls between the two runs")
    parser.add_argument(
        "--first",
        choices=["each", "dlpack", "rust-numpy"],
        default="each",
        help="which crate borrows first in each process (installing rust-numpy's flags)",
    )
    args = parser.parse_args()
    per_call: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as workdir:
        with open(os.path.join(workdir, "loop.py"), "w") as f:
            f.write(LOOP)
        for name in sorted({n for _, *names in PAIRS for n in names}):
            low = instructions(name, 5_000, workdir, args.first)
            high = instructions(name, 5_000 + args.calls, workdir, args.first)
            per_call[name] = round((high - low) / args.calls)
    print(f"{'case':30} {'ours':>8} {'rust-numpy':>11} {'ratio':>6}  (instructions per call)")
    for case, ours, theirs in PAIRS:
        a, b = per_call[ours], per_call[theirs]
        print(f"{case:30} {a:8d} {b:11d} {a / b:6.2f}")


if __name__ == "__main__":
    main()
