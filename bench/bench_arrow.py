#!/usr/bin/env python
"""Arrow columns into torch and torch tensors into Arrow, side by side in one run.

Run from the repository root with the python that has dlpack-adapter, torch, pyarrow and polars::

    python -P bench/bench_arrow.py [--repeats 15]

Rows (median of interleaved repeats, ``_bench_timing``; ratio to the row's reference):

- ``torch.from_dlpack(asdlpack(pl_series))``, a one-chunk float64 polars Series of 10^6
  elements, against ``torch.from_dlpack(pa_array)`` (pyarrow's own DLPack; goal <= 1.5x) and
  against ``torch.from_numpy(pl_series.to_numpy())``, the usual way (goal <= 1.0x);
- ``pyarrow.array(asdlpack(t))`` of a 64 MiB float32 torch tensor and of a 4 KiB one: zero-copy
  is O(1) in the size (goal: the two within noise of each other), with ``pa.array(t.numpy())``
  for reference;
- ``pyarrow.chunked_array(asdlpack(t))`` of the same two tensors, through the stream
  (``__arrow_c_stream__``): O(1) in the size too, with ``pa.chunked_array([t.numpy()])`` for
  reference.
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

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
import pyarrow as pa  # noqa: E402
import torch  # noqa: E402

from dlpack import asdlpack  # noqa: E402


def row(name, timers, reference, goal, repeats, seconds):
    _, per_call = TIMING["interleaved"](timers, repeats, seconds)
    medians = {k: statistics.median(v) * 1e6 for k, v in per_call.items()}
    ref = medians[reference]
    for key, value in medians.items():
        ratio = "" if key == reference else f"{value / ref:6.2f}x"
        mark = goal if key != reference else ""
        print(f"{name if key == 'ours' else '':34} {key:28} {value:10.2f} {ratio:>8}  {mark}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=0.1, help="per repeat")
    args = parser.parse_args()
    print(
        f"# {platform.node()} {platform.machine()}, python {platform.python_version()}, "
        f"torch {torch.__version__}, pyarrow {pa.__version__}, polars {pl.__version__}"
    )
    print(f"{'case':34} {'way':28} {'us/call':>10} {'ratio':>8}  goal")

    series = pl.Series(np.arange(1_000_000, dtype=np.float64))
    column = series.to_arrow()
    assert torch.equal(torch.from_dlpack(asdlpack(series)), torch.from_dlpack(column))
    assert asdlpack(series).data_ptr == series.to_numpy().ctypes.data
    for reference, goal in (("pyarrow's DLPack", "<= 1.5x"), ("from_numpy(to_numpy())", "<= 1.0x")):
        theirs = {
            "pyarrow's DLPack": lambda: torch.from_dlpack(column),
            "from_numpy(to_numpy())": lambda: torch.from_numpy(series.to_numpy()),
        }[reference]
        timers = {
            "ours": timeit.Timer(lambda: torch.from_dlpack(asdlpack(series))),
            reference: timeit.Timer(theirs),
        }
        row("polars f64[1e6] -> torch", timers, reference, goal, args.repeats, args.seconds)

    big = torch.ones(16 << 20, dtype=torch.float32)  # 64 MiB
    small = torch.ones(1024, dtype=torch.float32)  # 4 KiB
    assert pa.array(asdlpack(big)).buffers()[1].address == big.data_ptr()
    timers = {
        "ours 64 MiB": timeit.Timer(lambda: pa.array(asdlpack(big))),
        "ours 4 KiB": timeit.Timer(lambda: pa.array(asdlpack(small))),
        "pa.array(t.numpy()) 64 MiB": timeit.Timer(lambda: pa.array(big.numpy())),
    }
    _, per_call = TIMING["interleaved"](timers, args.repeats, args.seconds)
    for key, values in per_call.items():
        print(f"{'torch f32 -> pyarrow.array':34} {key:28} {statistics.median(values) * 1e6:10.2f}")

    assert pa.chunked_array(asdlpack(big)).chunk(0).buffers()[1].address == big.data_ptr()
    timers = {
        "ours 64 MiB": timeit.Timer(lambda: pa.chunked_array(asdlpack(big))),
        "ours 4 KiB": timeit.Timer(lambda: pa.chunked_array(asdlpack(small))),
        "chunked_array([numpy]) 64 MiB": timeit.Timer(lambda: pa.chunked_array([big.numpy()])),
    }
    _, per_call = TIMING["interleaved"](timers, args.repeats, args.seconds)
    for key, values in per_call.items():
        median = statistics.median(values) * 1e6
        print(f"{'torch f32 -> pa.chunked_array':34} {key:28} {median:10.2f}")


if __name__ == "__main__":
    main()
