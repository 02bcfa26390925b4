"""Callgrind counts for the ``count_*.py`` scripts: instructions per call of Python statements,
figures that don't move with the machine's load as timings do.

The scripts load this file by its path (``runpy.run_path``), as they keep bench/ off
``sys.path``. Two ways of counting:

- ``count_in_process``: one process runs under ``valgrind --tool=callgrind --instr-atstart=no``;
  a small C helper (compiled here, loaded with ctypes) switches counting on around each loop of
  a statement and dumps the count after it. Each statement runs ``WARM`` times uncounted, then
  ``LOW`` and ``HIGH`` times counted; the difference divided by ``HIGH - LOW`` is one call with
  the helper's calls taken out.
- ``process_total``: the instructions of a whole process (start-up included), for scripts that
  count a loop at two numbers of calls in two processes and take the difference.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import re
import runpy
import subprocess
import sys
import tempfile
from collections.abc import Sequence

HELPER = r"""
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void cg_stop(void) { CALLGRIND_DUMP_STATS; CALLGRIND_STOP_INSTRUMENTATION; }
"""

HERE = os.path.dirname(os.path.abspath(__file__))
WARM, LOW, HIGH = 1_000, 5_000, 25_000
CHILD_FLAG = "--_callgrind-child"


def totals(path: str) -> int:
    """The instruction total callgrind wrote into ``path``."""
    with open(path) as f:
        for line in f:
            if m := re.match(r"(?:summary|totals):\s*(\d+)", line):
                return int(m.group(1))
    raise RuntimeError(f"callgrind wrote no totals to {path}")


def exchange_rows(
    only: set[str] | None,
) -> tuple[dict, list[tuple[str, str, str | None, Sequence[str]]]]:
    """In the child: what ``bench_exchange.py``'s rows run in (numpy's ``a``, a torch tensor
    ``t`` over the same memory and tvm_ffi where they are installed; the caller adds ``asdlpack``
    and ``obj``), and its rows as ``(key, statement, anchor, the names it needs)``, ``only``
    those keys where given."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
    exchange = runpy.run_path(os.path.join(HERE, "bench_exchange.py"), run_name="bench_exchange")
    import numpy as np

    a = np.arange(12, dtype=np.float32)
    base: dict = {"np": np, "a": a}
    for name in ("torch", "tvm_ffi"):
        try:
            base[name] = __import__(name)
        except Exception:
            pass
    if "torch" in base:
        base["t"] = base["torch"].from_numpy(a)
    rows = [
        (key, stmt, anchor, needs)
        for key, _label, stmt, _anchor_label, anchor, _check, needs in exchange["ROWS"]
        if not only or key in only
    ]
    return base, rows


def run_cases(argv: Sequence[str], cases: Sequence[tuple[str, str, dict]]) -> None:
    """In the child (``argv``: the helper's path and the plan's, after ``CHILD_FLAG``): run each
    ``(name, statement, namespace)`` case's loops, counted, and write their order."""
    helper, plan_path = argv
    lib = ctypes.CDLL(helper)
    plan = []
    for name, stmt, ns in cases:
        exec(f"def _run(n):\n    for _ in range(n):\n        {stmt}\n", ns)
        ns["_run"](WARM)
        for calls in (LOW, HIGH):
            lib.cg_start()
            ns["_run"](calls)
            lib.cg_stop()
            plan.append([name, stmt, calls])
    with open(plan_path, "w") as f:
        json.dump(plan, f)


def count_in_process(
    script: str, args: Sequence[str] = (), keep: str | None = None
) -> tuple[dict[str, float], dict[str, str]]:
    """Run ``script`` under callgrind with ``CHILD_FLAG HELPER PLAN *args`` (it calls
    ``run_cases``), and give each case's instructions per call, and its statement. ``keep``: a
    folder to keep the dumps in (``callgrind_annotate`` reads them; the last one is the last
    case's longer loop)."""
    with tempfile.TemporaryDirectory() as work:
        helper = os.path.join(work, "cg_helper.so")
        source = os.path.join(work, "cg_helper.c")
        with open(source, "w") as f:
            f.write(HELPER)
        subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", helper, source], check=True)
        out_dir = keep or work
        os.makedirs(out_dir, exist_ok=True)
        out = os.path.join(out_dir, "callgrind.out")
        for old in glob.glob(out + ".*"):
            os.remove(old)
        plan_path = os.path.join(work, "plan.json")
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-P",
            os.path.abspath(script),
            CHILD_FLAG,
            helper,
            plan_path,
            *args,
        ]
        subprocess.run(command, check=True, capture_output=True)
        with open(plan_path) as f:
            plan = json.load(f)
        dumps = sorted(glob.glob(out + ".*"), key=lambda p: int(p.rsplit(".", 1)[1]))
        if len(dumps) != len(plan):
            raise RuntimeError(f"{len(dumps)} dumps for {len(plan)} loops")
        counts: dict[str, dict[int, int]] = {}
        statements: dict[str, str] = {}
        for (name, stmt, calls), path in zip(plan, dumps, strict=True):
            counts.setdefault(name, {})[calls] = totals(path)
            statements[name] = stmt
    per_call = {name: (c[HIGH] - c[LOW]) / (HIGH - LOW) for name, c in counts.items()}
    return per_call, statements


def process_total(
    command: Sequence[str],
    out: str,
    *,
    options: Sequence[str] = (),
    prefix: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> int:
    """Instructions of the whole process ``command`` runs under callgrind (``options`` passed to
    it, ``prefix`` before valgrind, such as ``setarch``), its output in ``out``; ``env`` replaces
    the environment where given."""
    subprocess.run(
        [
            *prefix,
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            *options,
            *command,
        ],
        check=True,
        capture_output=True,
        env=env,
    )
    return totals(out)
