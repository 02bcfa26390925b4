#!/usr/bin/env python
"""The import paths' cost in the installed build, for comparing two builds (A/B): run it with
each build's python in turn, a few rounds, each pinned to one CPU, and compare the rows::

    OPENBLAS_NUM_THREADS=1 taskset -c 1 python -P bench/bench_import_ab.py

Rows: best of 7 x 20,000 calls, in µs: ``asdlpack`` of a polars Series (the Arrow stream) and of
a pyarrow array, ``pa.array(asdlpack(t))``, ``np.from_dlpack(asdlpack(a))`` and
``torch.from_dlpack(asdlpack(series))``.
"""

from __future__ import annotations

import timeit

import numpy as np
import polars as pl
import pyarrow as pa
import torch

from dlpack import asdlpack

series = pl.Series(np.arange(1e6))
tensor = torch.arange(1 << 10, dtype=torch.float32)
array = np.arange(1000.0)
pa_array = pa.array(np.arange(1e6))
CASES = {
    "asdlpack(series)": lambda: asdlpack(series),
    "asdlpack(pa.array)": lambda: asdlpack(pa_array),
    "pa.array(asdlpack(t))": lambda: pa.array(asdlpack(tensor)),
    "np.from_dlpack(asdlpack(a))": lambda: np.from_dlpack(asdlpack(array)),
    "torch.from_dlpack(asdlpack(series))": lambda: torch.from_dlpack(asdlpack(series)),
}

if __name__ == "__main__":
    for name, call in CASES.items():
        best = min(timeit.repeat(call, number=20_000, repeat=7)) / 20_000 * 1e6
        print(f"{name:40s} {best:.3f} us")
