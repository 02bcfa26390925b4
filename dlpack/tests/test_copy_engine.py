"""The CPU copy engine's choices: threads and store kind measured per kind of copy on the first
copy large enough, fixed by ``DLPACK_COPY_THREADS`` / ``DLPACK_COPY_STORES``, and reported by
``dlpack._dlpack._copy_engine`` (and ``python -m dlpack``). Each case runs in a child process:
the choices are kept per process. Whatever is chosen, the values are numpy's."""

import json
import platform

from ._helpers import leave_out_heavy_libraries, need, run_python

KINDS = ["contiguous", "transpose", "gather", "byte swap"]
MIB = 1 << 20

# Copies of 20 MiB (the large band) of each kind, checked against numpy; then the engine's facts.
# The first copy goes into fresh memory (a new anonymous mapping: numpy's own arrays may reuse
# memory already mapped), whose pages the kernel maps as the copy writes them: it measures for
# fresh memory. The second, into the same memory, measures for mapped memory; the third uses what
# was kept.
CHILD = """
import json
import mmap
import numpy as np
import dlpack
from dlpack import _dlpack

rng = np.random.default_rng(0)
n = 5 * 2**20  # float32: 20 MiB
cases = {
    "contiguous": rng.random(n, dtype=np.float32),
    "transpose": rng.random((2048, n // 2048), dtype=np.float32).T,
    "gather": rng.random(2 * n, dtype=np.float32)[::2],
    "byte swap": rng.random(n, dtype=np.float32).astype(">f4"),
}
wrong = []
first = {}
for name, src in cases.items():
    out = np.frombuffer(mmap.mmap(-1, 4 * n), np.float32).reshape(src.shape)
    for k in range(3):
        if k == 1:  # what the first copy kept
            first[name] = [
                [c["kind"], c["bytes"][1] is None, c["memory"], c["state"]]
                for c in _dlpack._copy_engine()["choices"]
            ]
        if k:
            out[...] = 0
        dlpack.copyto(out, src)
        if not np.array_equal(out, src.astype(np.float32)):
            wrong.append(name)
print(json.dumps({"wrong": wrong, "first": first, "facts": _dlpack._copy_engine()}))
"""


def run_child(env=None):
    proc = run_python("-c", CHILD, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    done = json.loads(proc.stdout)
    assert done["wrong"] == []
    return done


def large(facts, kind, memory="mapped"):
    [entry] = [
        c
        for c in facts["choices"]
        if c["kind"] == kind and c["bytes"][1] is None and c["memory"] == memory
    ]
    return entry


def test_each_kind_is_measured_on_its_first_large_copy_apart_into_fresh_memory():
    need("numpy")
    done = run_child()
    facts = done["facts"]
    # the first copy of each kind, into fresh memory, measured for fresh memory alone
    for k, kind in enumerate(KINDS):
        for other, is_large, memory, state in done["first"][kind]:
            done_before = KINDS.index(other) < k
            if is_large and (done_before or (other == kind and memory == "fresh")):
                assert state == "measured", (kind, other, memory)
            else:
                assert state == "not yet", (kind, other, is_large, memory)
    assert facts["settings"] == {"DLPACK_COPY_THREADS": None, "DLPACK_COPY_STORES": None}
    assert facts["settings_error"] is None
    assert [(c["kind"], c["memory"]) for c in facts["choices"]] == [
        (k, m) for k in KINDS for _ in range(2) for m in ("mapped", "fresh")
    ]
    streaming = platform.machine().lower() in ("x86_64", "amd64")
    for kind in KINDS:
        for memory in ("mapped", "fresh"):
            entry = large(facts, kind, memory)
            assert entry["bytes"] == [facts["large_threshold"], None]
            assert entry["state"] == "measured"
            ways = [(c["threads"], c["stores"]) for c in entry["candidates"]]
            # one thread with regular stores first, the machine's threads, streaming stores
            # where the kernels have them
            assert ways[0] == (1, "regular")
            assert max(t for t, _ in ways) == facts["max_threads"]
            has_streaming = streaming and kind != "byte swap"
            assert any(s == "streaming" for _, s in ways) == has_streaming
            assert (entry["threads"], entry["stores"]) in ways
            # one thread with regular stores always measured; the others unless measuring ran
            # out of its budget first (on a machine busy with other work)
            assert entry["candidates"][0]["gb_per_s"] > 0
            assert all(c["gb_per_s"] is None or c["gb_per_s"] > 0 for c in entry["candidates"])
            # measured on a copy of 20 MiB, part of it in chunks
            assert entry["copy_bytes"] == 20 * MIB
            assert 0 < entry["calibrated_bytes"] <= 20 * MIB
            assert 0 <= entry["cost_seconds"] <= entry["seconds"]
            # the chosen way was measured no slower than one thread with regular stores
            rates = {(c["threads"], c["stores"]): c["gb_per_s"] for c in entry["candidates"]}
            assert rates[(entry["threads"], entry["stores"])] >= rates[(1, "regular")]
    # no copy of the middle band ran: nothing kept there
    for c in facts["choices"]:
        if c["bytes"][1] is not None:
            assert c["bytes"] == [facts["parallel_threshold"], facts["large_threshold"]]
            assert (c["state"], c["threads"], c["stores"], c["copy_bytes"]) == (
                "not yet",
                None,
                None,
                None,
            )


def test_the_environment_fixes_threads_and_stores():
    need("numpy")
    env = {"DLPACK_COPY_THREADS": "2", "DLPACK_COPY_STORES": "regular"}
    facts = run_child(env)["facts"]
    assert facts["settings"] == env
    for c in facts["choices"]:
        assert (c["state"], c["threads"], c["stores"]) == ("fixed", 2, "regular")
        assert c["candidates"] == [{"threads": 2, "stores": "regular", "gb_per_s": None}]
    # the thread count alone: the stores are measured where there is a choice
    facts = run_child({"DLPACK_COPY_THREADS": "1"})["facts"]
    for kind in KINDS:
        entry = large(facts, kind, "fresh")
        assert {c["threads"] for c in entry["candidates"]} == {1}
        assert entry["state"] == ("measured" if len(entry["candidates"]) > 1 else "fixed")
        assert entry["threads"] == 1


def test_settings_that_cant_be_understood_stop_the_import():
    for name, value in [
        ("DLPACK_COPY_THREADS", "two"),
        ("DLPACK_COPY_THREADS", "0"),
        ("DLPACK_COPY_STORES", "fast"),
    ]:
        proc = run_python("-c", "import dlpack", env={name: value})
        assert proc.returncode != 0
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith(f'ValueError: {name}="{value}" is not understood'), proc.stderr
    # empty, or auto in any case: measured
    proc = run_python(
        "-c",
        "from dlpack import _dlpack; print(_dlpack._copy_engine()['settings_error'])",
        env={"DLPACK_COPY_THREADS": "", "DLPACK_COPY_STORES": " Auto"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None"


def test_the_report_says_what_was_chosen(tmp_path):
    leave_out_heavy_libraries(tmp_path)  # slow to import, and no part of the engine's section
    env = {"DLPACK_COPY_STORES": "regular"}
    proc = run_python("-m", "dlpack", path=[tmp_path], env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    [head] = [i for i, line in enumerate(lines) if line.startswith("CPU copy engine")]
    assert "DLPACK_COPY_STORES=regular" in lines[head]
    rows = lines[head + 1 : head + 17]
    assert [r.split()[0] for r in rows] == [k.split()[0] for k in KINDS for _ in range(4)]
    for row in rows:
        assert "regular stores" in row and "streaming" not in row
        # measured by the report itself: each says why
        assert "GB/s" in row or "fixed by the settings" in row, row
    assert sum("fresh memory" in row for row in rows) == 8
    assert lines[head + 17].startswith("  (smaller copies: 1 thread, regular stores")
