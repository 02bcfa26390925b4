#!/usr/bin/env python
"""Instructions per call of the Rust API's functions against rust-numpy's, and of the C
example's, counted by callgrind: the figures that don't move with the VM's noise, beside
``bench_rust_api.py``'s timings.

With the comparison extension and the C example installed (see ``bench_rust_api.py``) and
valgrind on PATH::

    python -P bench/count_rust_api.py

Each function runs under ``valgrind --tool=callgrind``, counting only inside the function (a
Rust one's PyO3 wrapper, the C one itself, ``--toggle-collect``), at two numbers of calls; the
difference divided by the difference in calls is the cost of one call with the interpreter's
loop and start-up taken out.

Which crate borrows first in a process installs rust-numpy's borrow flags, which decides how the
two crates' borrows meet (docs/internals.md, "rust-numpy's borrows"): each function runs in a
process of its own, alone (``--first each``), or after one borrow of the other kind
(``--first dlpack``: the runtime's table; ``--first rust-numpy``: rust-numpy's).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CALLGRIND = runpy.run_path(os.path.join(HERE, "_callgrind.py"))

PAIRS = [
    ("extraction only", "extract_view", "extract_numpy"),
    ("total(np f64[1000]), typed", "total_typed", "total_numpy"),
    ("total(np f64[1000]), view", "total_view", "total_numpy"),
    ("total(np f64[1000]), C", "c:total", "total_numpy"),
]

LOOP = """
import sys
import numpy as np
import dlpack_bench_rust_api
import dlpack_c_example
module, _, name = sys.argv[1].rpartition(":")
f = getattr(dlpack_c_example if module == "c" else dlpack_bench_rust_api, name)
b = dlpack_bench_rust_api
if sys.argv[3] == "dlpack":
    b.extract_view(np.zeros(1))
elif sys.argv[3] == "rust-numpy":
    b.extract_numpy(np.zeros(1))
x = np.arange(1000, dtype=np.float64)
for _ in range(100 + int(sys.argv[2])):
    f(x)
"""


# The runtime's two C API functions a view takes (as callgrind names them): what every client pays
# for a view whatever its language.
RUNTIME_VIEW = ["dlpack_runtime::api::capi::view", "dlpack_runtime::api::capi::release_view"]
# The function whose calls are counted, and what of them: its view and release in the runtime.
RUNTIME_FROM = [("C", "c:total"), ("Rust", "total_view")]


def instructions(
    name: str, calls: int, workdir: str, runtime: bool = False, first: str = "each"
) -> int:
    """Instructions inside ``name`` (``c:NAME``, the C example's static function, or a Rust
    one's PyO3 wrapper), or with ``runtime`` only inside the runtime's view and release_view it
    calls, over ``calls`` calls and the loop's 100 first."""
    module, _, function = name.rpartition(":")
    if runtime:
        collect = RUNTIME_VIEW
    else:
        collect = [function if module == "c" else f"*__pyfunction_{function}*"]
    out = os.path.join(workdir, f"{function}.{runtime}.{calls}.out")
    script = os.path.join(workdir, "loop.py")
    command = [sys.executable, "-P", script, name, str(calls), first]
    options = [f"--toggle-collect={pattern}" for pattern in collect]
    return CALLGRIND["process_total"](command, out, options=options)


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
    per_call: dict[tuple[str, bool], int] = {}
    with tempfile.TemporaryDirectory() as workdir:
        with open(os.path.join(workdir, "loop.py"), "w") as f:
            f.write(LOOP)
        counted = {(n, False) for _, *names in PAIRS for n in names}
        counted |= {(name, True) for _, name in RUNTIME_FROM}
        for name, runtime in sorted(counted):
            low = instructions(name, 5_000, workdir, runtime, args.first)
            high = instructions(name, 5_000 + args.calls, workdir, runtime, args.first)
            per_call[name, runtime] = round((high - low) / args.calls)
    print(f"{'case':30} {'ours':>8} {'rust-numpy':>11} {'ratio':>6}  (instructions per call)")
    for case, ours, theirs in PAIRS:
        a, b = per_call[ours, False], per_call[theirs, False]
        print(f"{case:30} {a:8d} {b:11d} {a / b:6.2f}")
    print("of which the runtime's view + release_view, the same whoever calls:")
    for language, name in RUNTIME_FROM:
        print(f"  {'from ' + language + ' (' + name + ')':28} {per_call[name, True]:8d}")


if __name__ == "__main__":
    main()
