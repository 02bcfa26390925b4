"""Hand-made mutants: break the code on purpose, one fault at a time, and check the suite notices.

Each mutant replaces one exact snippet of one file (it must occur exactly once) with a fault a
real change could bring: a read-only flag dropped, an extent off by one, a release skipped. The
tests named beside it then run against the mutated package; the mutant is killed when they fail
(or crash), and survives when they pass. The file is restored whatever happens.

    python tools/mutants.py            # every mutant (Rust ones rebuild the extension: ~1 min each)
    python tools/mutants.py --list
    python tools/mutants.py --only readonly-flag-dropped ai-extent-off-by-one

Run from the repository root with the development environment's Python (`.venv/bin/python`):
the `checked` build is made with maturin from it, and the suite runs from a scratch copy of the
package, so the installed wheel and the work tree are left as they were.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]  # modules of dlpack.tests
    why: str
    # Why no test can kill it, where a later check refuses the same inputs with the same error
    # (defence in depth): its survival is expected, and said.
    equivalent: str = ""

    @property
    def rust(self) -> bool:
        return self.path.endswith(".rs")

    @property
    def core(self) -> bool:
        """In the pyo3-free core, whose own Rust tests run first."""
        return self.path.startswith("crates/dlpack-core/")


MUTANTS = [
    # --------------------------------------------------------------- read-only memory
    Mutant(
        "readonly-flag-dropped",
        "src/export/policy.rs",
        "flags |= FLAG_READ_ONLY;",
        "flags |= 0;",
        ("test_consumers", "test_dlpack_object", "test_exports"),
        "versioned capsules of read-only memory lose DLPACK_FLAG_BITMASK_READ_ONLY",
    ),
    Mutant(
        "legacy-consumers-trusted",
        "src/export/policy.rs",
        "honours_read_only: versioned_minor.is_some(),",
        "honours_read_only: true,",
        ("test_consumers", "test_dlpack_object", "test_exports"),
        "legacy consumers (no read-only flag) get read-only memory itself, not a copy",
    ),
    Mutant(
        "buffer-readonly-dropped",
        "src/export/buffer.rs",
        "readonly: c_int::from(tensor.readonly()),",
        "readonly: 0,",
        ("test_exports",),
        "the buffer protocol lends read-only memory as writable",
    ),
    Mutant(
        "buffer-writable-request-served",
        "src/export/buffer.rs",
        "if writable && tensor.readonly() {",
        "if false && writable && tensor.readonly() {",
        ("test_exports",),
        "a PyBUF_WRITABLE request of read-only memory is served",
    ),
    Mutant(
        "c-api-lends-readonly",
        "src/object/exchange_api.rs",
        "        if tensor.readonly() {\n            return Err(Error::buffer(\n"
        "                \"read-only memory can't be lent as a bare DLTensor",
        "        if false && tensor.readonly() {\n            return Err(Error::buffer(\n"
        "                \"read-only memory can't be lent as a bare DLTensor",
        ("test_exchange_api",),
        "the C exchange API lends read-only memory as a bare (writable) DLTensor",
    ),
    Mutant(
        "shared-view-writable",
        "src/share/views.rs",
        "if writable && tensor.readonly() {",
        "if false && writable && tensor.readonly() {",
        ("test_sharing", "test_sharing_states", "test_sharing_requests"),
        "a writable view of a read-only shared handle is given",
    ),
    Mutant(
        "numpy-scalars-mutable",
        "src/import/protocols.rs",
        '}) || in_mro(ty, "generic", |m| m == "numpy"),',
        "}),",
        ("test_copyto_edges", "test_providers"),
        "numpy scalars (immutable) are imported as writable memory",
    ),
    # --------------------------------------------------------------- extents and bounds
    Mutant(
        "ai-extent-off-by-one",
        "src/import/array_interface.rs",
        "high.saturating_add(offset) > raw.len as i64",
        "high.saturating_add(offset) > raw.len as i64 + 1",
        ("test_bad_input", "test_providers", "test_property"),
        "an __array_interface__ over a buffer may reach one byte past its end",
    ),
    Mutant(
        "core-extent-off-by-one",
        "crates/dlpack-core/src/layout/strided.rs",
        "Ok((low, high.checked_add(item).ok_or_else(overflow)?))",
        "Ok((low, high.checked_add(item - 1).ok_or_else(overflow)?))",
        ("test_bad_input", "test_providers", "test_property"),
        "the byte extent of a layout ends one byte short (the core's tests run first)",
    ),
    Mutant(
        "arrow-offset-length-unchecked",
        "src/import/arrow_check.rs",
        "        .checked_add(fields.length)\n        .ok_or_else(|| too_large(fields))?;",
        "        .wrapping_add(fields.length);",
        ("test_arrow_hostile", "test_arrow_in"),
        "an Arrow array's offset + length may overflow",
        equivalent="both are non-negative, so a wrapped sum is at least 2**63 as an unsigned "
        "end, which the buffers' extent check refuses with the same error",
    ),
    # --------------------------------------------------------------- releases
    Mutant(
        "versioned-deleter-skipped",
        "src/tensor/owner.rs",
        "                    // SAFETY: as for `Legacy`.\n"
        "                    unsafe { deleter(managed.as_ptr()) };",
        "                    let _ = deleter;",
        ("test_lifetime", "test_other_devices", "test_growth"),
        "a consumed versioned capsule's deleter is never called",
    ),
    Mutant(
        "capsule-not-marked-used",
        "src/import/dlpack.rs",
        "if !unsafe { python::capsule_rename(ptr, used) } {",
        "if false && !unsafe { python::capsule_rename(ptr, used) } {",
        ("test_providers", "test_lifetime", "test_bad_input"),
        "a consumed capsule keeps its name, so its deleter can run twice",
    ),
    # --------------------------------------------------------------- copies
    Mutant(
        "copyto-writes-into-a-copy",
        "src/object/functions.rs",
        "    if let Some(why) = target.copied() {\n        return Err(Error::value(format!(\n"
        "            \"copyto can't write into this",
        "    if let Some(why) = target.copied().filter(|_| false) {\n"
        "        return Err(Error::value(format!(\n"
        "            \"copyto can't write into this",
        ("test_copyto", "test_copyto_edges"),
        "copyto writes into a copy of the destination, silently swallowing the write",
    ),
    # --------------------------------------------------------------- the C API
    Mutant(
        "capi-copy-from-overlap-unchecked",
        "src/api/capi.rs",
        "        check_disjoint(tensor)?;",
        "        let _ = check_disjoint;",
        ("test_c_api",),
        "copy_from writes element by element into elements that share bytes",
    ),
    Mutant(
        "capi-mutable-view-held-shared",
        "src/api/held.rs",
        "view._borrow = Borrow::take(start, end, exclusive)?;",
        "view._borrow = Borrow::take(start, end, false)?;",
        ("test_c_api",),
        "a mutable view holds its memory as shared: another view may alias it",
    ),
    Mutant(
        "capi-refused-memory-released",
        "src/api/capi.rs",
        "                release.disarmed.store(true, Ordering::Release);",
        "                let _ = &release;",
        ("test_c_api",),
        "memory from_memory refused is released all the same (the caller frees it too)",
    ),
    # --------------------------------------------------------------- Python front
    Mutant(
        "share-always-writable",
        "dlpack/_sharing/handles.py",
        "    return _share(obj, writable)",
        "    return _share(obj, True)",
        ("test_sharing", "test_sharing_states", "test_sharing_requests"),
        "share() hands out writable handles when asked for read-only ones",
    ),
    Mutant(
        "empty-shared-extent-unchecked",
        "dlpack/_sharing/handles.py",
        "if not -(2**63) <= n < 2**63:",
        "if not -(2**63) <= n < 2**64:",
        ("test_sharing", "test_sharing_requests"),
        "empty_shared hands the extension an extent past 64 bits (an OverflowError, unclear)",
    ),
    Mutant(
        "interop-deleted-array-unchecked",
        "dlpack/interop/_jax.py",
        "    if array.is_deleted():",
        "    if False and array.is_deleted():",
        ("test_interop_states",),
        "a deleted or donated JAX array reaches jaxlib, whose error is a RuntimeError",
    ),
    Mutant(
        "interop-x64-ignored",
        "dlpack/interop/_leaves.py",
        "    narrowed = None if x64 else _X32_NARROWING.get(name)",
        "    narrowed = _X32_NARROWING.get(name)",
        ("test_interop", "test_interop_functions"),
        "64-bit arrays are narrowed to 32 bits even with jax_enable_x64 on",
    ),
]


def build_extension(scratch: Path) -> Path:
    """The `checked` build of the extension as it is in the work tree: the path of its .so."""
    out = scratch / "wheel"
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "maturin", "build", "--profile", "checked", "--quiet", "-o", out],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        (member,) = [
            n for n in zf.namelist() if n.startswith("dlpack/_dlpack.") and n.endswith(".so")
        ]
        target = scratch / Path(member).name
        target.write_bytes(zf.read(member))
    return target


def run_tests(scratch: Path, extension: Path, tests: tuple[str, ...], timeout: int) -> int:
    """The named test modules against the work tree's package with `extension` beside it."""
    site = scratch / "site"
    shutil.rmtree(site, ignore_errors=True)
    shutil.copytree(ROOT / "dlpack", site / "dlpack", ignore=shutil.ignore_patterns("*.so"))
    shutil.copy(extension, site / "dlpack" / extension.name)
    env = dict(os.environ, PYTHONPATH=str(site))
    modules = [f"dlpack.tests.{t}" for t in tests]
    cmd = [sys.executable, "-P", "-m", "pytest", "--pyargs", *modules, "-x", "-q"]
    cmd += ["-p", "no:cacheprovider"]
    try:
        proc = subprocess.run(
            cmd, cwd=scratch, env=env, timeout=timeout, capture_output=True, text=True
        )
    except subprocess.TimeoutExpired:
        return -1
    return proc.returncode


def run_core_tests(timeout: int) -> int:
    # proptest saves the failures a mutant causes as seeds for later runs: put them back as
    # they were, or the unmutated tests would replay a mutant's cases.
    seeds = ROOT / "crates/dlpack-core/proptest-regressions"
    before = {p: p.read_bytes() for p in seeds.rglob("*") if p.is_file()}
    cmd = ["cargo", "test", "-p", "dlpack-core", "--quiet"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, timeout=timeout, capture_output=True)
    except subprocess.TimeoutExpired:
        return -1
    finally:
        for path in [p for p in seeds.rglob("*") if p.is_file()]:
            if path in before:
                path.write_bytes(before[path])
            else:
                path.unlink()
    return proc.returncode


def apply(mutant: Mutant) -> str:
    path = ROOT / mutant.path
    text = path.read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise SystemExit(f"{mutant.name}: the snippet occurs {count} times in {mutant.path}")
    path.write_text(text.replace(mutant.old, mutant.new))
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="names of the mutants to run")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per mutant's tests")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list or not chosen:
        for m in MUTANTS:
            print(f"{m.name:32} {m.path}: {m.why}")
        return 0 if chosen else 2
    for m in chosen:  # every snippet is found before anything runs
        found = (ROOT / m.path).read_text().count(m.old)
        if found != 1:
            raise SystemExit(f"{m.name}: the snippet occurs {found} times in {m.path}")

    results = []
    with tempfile.TemporaryDirectory(prefix="dlpack-mutants-") as tmp:
        scratch = Path(tmp)
        (scratch / "clean").mkdir()
        print("building the unmutated extension ...", flush=True)
        clean = build_extension(scratch / "clean")
        modules = tuple(sorted({t for m in chosen for t in m.tests}))
        print(f"the unmutated package against {', '.join(modules)} ...", flush=True)
        rc = run_tests(scratch, clean, modules, args.timeout * 2)
        if rc != 0:  # else a mutant would count as killed by tests that fail anyway
            raise SystemExit(f"the tests fail without any mutant (exit status {rc})")
        for m in chosen:
            start = time.monotonic()
            original = apply(m)
            try:
                extension = clean
                if m.rust:
                    (scratch / "mutant").mkdir(exist_ok=True)
                    try:
                        extension = build_extension(scratch / "mutant")
                    except subprocess.CalledProcessError:
                        results.append((m, "killed (does not build)", time.monotonic() - start))
                        continue
                rc = run_core_tests(args.timeout) if m.core else 0
                if rc == 0:
                    rc = run_tests(scratch, extension, m.tests, args.timeout)
            finally:
                (ROOT / m.path).write_text(original)
            if rc == 0:
                verdict = "equivalent" if m.equivalent else "SURVIVED"
            elif rc == 5:  # pytest collected nothing: a wrong module name, not a kill
                raise SystemExit(f"{m.name}: no tests collected from {', '.join(m.tests)}")
            elif rc == -1:
                verdict = "killed (timeout)"
            elif rc < 0:
                verdict = f"killed (signal {-rc})"
            else:
                verdict = "killed"
            results.append((m, verdict, time.monotonic() - start))
            print(f"{verdict:24} {m.name} ({time.monotonic() - start:.0f} s)", flush=True)

    killed = sum(1 for _, v, _ in results if v.startswith("killed"))
    equivalent = [m for m, v, _ in results if v == "equivalent"]
    print(f"\n{killed} of {len(results)} mutants killed, {len(equivalent)} equivalent")
    for m in equivalent:
        print(f"  equivalent: {m.name}: {m.equivalent}")
    survivors = [m for m, v, _ in results if v == "SURVIVED"]
    for m in survivors:
        print(f"  survived: {m.name}: {m.why}")
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main())
