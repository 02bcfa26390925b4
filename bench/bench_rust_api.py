#!/usr/bin/env python
"""The Rust API's extraction against rust-numpy's, from Python, in one run.

Build the comparison extension (bench/rust-api: one function each way) and the C example
(examples/c-api: the same view and sum through the C header), and run from the repository root
with the python that has numpy, torch and JAX::

    maturin build --release -m bench/rust-api/Cargo.toml -o /tmp/bench-dist
    pip install /tmp/bench-dist/dlpack_bench_rust_api-*.whl
    pip install --no-build-isolation ./examples/c-api
    python -P bench/bench_rust_api.py [--repeats 15]

Rows: ``total(x)`` of a float64 numpy vector (1,000 elements) read in place, through the
typed argument ``dlpack_adapter::Array<f64>``, through ``view(obj)?.as_slice::<f64>()``, and
through rust-numpy's ``PyReadonlyArray1<f64>`` with ``as_slice()`` (goal: ours at most 1.0x), and
through the C API from C (``examples/c-api``'s ``total``: a view, the sum in place);
the same with nothing read (extraction alone); and our extraction of what rust-numpy doesn't
take (torch, JAX, bytes). Every view goes through the installed dlpack's C API. Each row
reports the median of interleaved repeats (``_bench_timing``) and the ratio to rust-numpy.
"""

from __future__ import annotations

import argparse
import os
import platform
import runpy
import statistics
import sys
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
TIMING = runpy.run_path(os.path.join(HERE, "_bench_timing.py"))

import dlpack_bench_rust_api as b  # noqa: E402
import dlpack_c_example  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=0.1, help="per repeat")
    args = parser.parse_args()

    x = np.arange(1000, dtype=np.float64)
    others = {
        "torch": torch.arange(1000, dtype=torch.float64),
        "jax": jnp.arange(1000.0),
        "bytes": x.tobytes(),
    }
    c_total = dlpack_c_example.total
    assert b.total_view(x) == b.total_typed(x) == b.total_numpy(x) == c_total(x) == x.sum()
    rows = [
        ("total(np f64[1000]), typed", b.total_typed, b.total_numpy, x),
        ("total(np f64[1000]), view", b.total_view, b.total_numpy, x),
        ("total(np f64[1000]), C", c_total, b.total_numpy, x),
        ("extraction only", b.extract_view, b.extract_numpy, x),
    ]
    print(
        f"# {platform.node()} {platform.processor() or platform.machine()}, "
        f"python {platform.python_version()}, numpy {np.__version__}"
    )
    print(f"{'case':32} {'ours (ns)':>10} {'rust-numpy (ns)':>16} {'ratio':>6}  goal")
    for name, ours_f, theirs_f, arg in rows:
        timers = {
            "ours": timeit.Timer(lambda f=ours_f, a=arg: f(a)),
            "theirs": timeit.Timer(lambda f=theirs_f, a=arg: f(a)),
        }
        _, per_call = TIMING["interleaved"](timers, args.repeats, args.seconds)
        o, t = (statistics.median(per_call[k]) * 1e9 for k in ("ours", "theirs"))
        goal = "<= 1.0x"
        print(f"{name:32} {o:10.1f} {t:16.1f} {o / t:6.2f}  {goal}")
    for name, arg in others.items():
        timers = {"ours": timeit.Timer(lambda a=arg: b.extract_view(a))}
        _, per_call = TIMING["interleaved"](timers, args.repeats, args.seconds)
        o = statistics.median(per_call["ours"]) * 1e9
        print(f"{'extraction only, ' + name:32} {o:10.1f} {'(not accepted)':>16}")


if __name__ == "__main__":
    main()
