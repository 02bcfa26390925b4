"""Mutation testing of the checks that guard memory, with cargo-mutants and cosmic-ray.

cargo-mutants (scope: .cargo/mutants.toml) mutates the Rust checks one at a time in place and
runs the mutated crate's tests; for the extension's crate, tools/mutants/cargo.sh then builds the
extension and runs the Python tests that reach its checks (RUNTIME_PYTESTS). cosmic-ray (scope:
tools/mutants/python.toml) mutates the Python front in a scratch copy of the package. Both scores
are printed with every surviving mutant; the run fails if a survivor is not argued equivalent in
tools/mutants/equivalent.toml.

    python tools/mutants/run.py --cargo-mutants PATH --cosmic-ray PATH [--part rust|python]
    python tools/mutants/run.py ... --rotate N   # one shard of N, the one after the last run's
    python tools/mutants/run.py ... --smoke      # a handful of mutants: the tooling still works

Run from the repository root with the development environment's Python (`make mutants`). The
Rust files are mutated in the work tree (cargo-mutants --in-place, restoring each file after its
mutant and on interruption), so that builds reuse target/: leave the tree alone while it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
HERE = ROOT / "tools" / "mutants"
OUT = ROOT / "target" / "mutants-out"
# .cargo/mutants.toml's, which the Python part builds its extension in too
PROFILE = "mutants"

# The Python tests a mutant of the extension's crate must pass besides its Rust tests, by the
# file it mutates: those that reach the imports' field checks (Arrow's C structs, the array
# interface, DLPack) and the C API's borrow registry. Left out: the Arrow fuzzer (12 s; the
# hand-written hostile cases stay) and the check that failing C API calls leak nothing (16 s of
# repeated calls).
RUNTIME_PYTESTS = {
    "src/import/arrow_check.rs": ("test_arrow_hostile", "test_arrow_in"),
    "src/import/array_interface.rs": ("test_bad_input", "test_providers"),
    "src/import/dlpack.rs": ("test_bad_input", "test_exchange_api"),
    "src/api/borrows.rs": ("test_c_api",),
}
RUNTIME_PYTEST_K = "not fuzzed and not failing_calls_leave_nothing_behind"

# --rotate: the shard the next run takes (target/mutants-out/next-shard)
NEXT_SHARD = OUT / "next-shard"

# --smoke: a few mutants of each tool (the Python ones include two argued equivalent).
SMOKE_RUST = ["--file", "crates/dlpack-core/src/layout/derived.rs", "--re", r"\bdense_strides\b"]
SMOKE_PYTHON = "site/dlpack/interop/_convert.py"


@dataclass
class Score:
    tool: str
    killed: int = 0
    timeouts: int = 0  # counted as killed: a mutant that hangs the tests is noticed
    unviable: int = 0  # didn't build (Rust) or couldn't run (Python): no test was asked
    survivors: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.killed + self.timeouts + len(self.survivors)


def run(cmd: list[str], **kwargs: object) -> int:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=False, **kwargs).returncode  # type: ignore[call-overload,no-any-return]


def build_site(site: Path, installed: bool) -> None:
    """The package from this tree in `site`, with the extension built from it, or with
    `installed`, the one installed beside this Python where there is one (no build: the smoke
    run after `make test`)."""
    extension = None
    if installed:
        found = subprocess.run(
            [sys.executable, "-P", "-c", "import dlpack._dlpack as m; print(m.__file__)"],
            capture_output=True,
            text=True,
        )
        extension = Path(found.stdout.strip()) if found.returncode == 0 else None
    if extension is None:
        cargo = shutil.which("cargo") or "cargo"
        build = [cargo, "build", "--quiet", "--profile", PROFILE, "--lib", "-p", "dlpack-runtime"]
        if run([*build, "--features", "pyo3/extension-module"], cwd=ROOT) != 0:
            sys.exit("mutants: the extension doesn't build")
        target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
        extension = target / PROFILE / "libdlpack_runtime.so"
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    shutil.copytree(ROOT / "dlpack", site / "dlpack", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(extension, site / "dlpack" / "_dlpack.abi3.so")


def rust(
    cargo_mutants: str,
    smoke: bool,
    packages: list[str],
    names: str | None,
    shard: tuple[int, int] | None,
) -> Score:
    part = [*packages, re.sub(r"\W+", "_", names)] if names else packages
    out = OUT / ("rust-smoke" if smoke else "-".join(["rust", *part]))
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = dict(
        os.environ,
        CARGO=str(HERE / "cargo.sh"),
        MUTANTS_REAL_CARGO=shutil.which("cargo") or "cargo",
        MUTANTS_SITE=str(out / "site"),
        MUTANTS_PYTHON=sys.executable,
        # a failing proptest writes no regression file into the tree, and doesn't shrink; the
        # same cases every run, so a mutant only some random cases catch doesn't come and go
        PROPTEST_DISABLE_FAILURE_PERSISTENCE="1",
        PROPTEST_MAX_SHRINK_ITERS="0",
        PROPTEST_RNG_SEED="1",
    )
    (out / "site").mkdir()
    # in place: one mutant at a time (the --jobs 1 the machine allows), and builds reuse target/
    cmd = [cargo_mutants, "mutants", "--workspace", "--in-place"]
    cmd += ["--output", str(out), "--no-shuffle", "--colors", "never"]
    for package in packages:
        cmd += ["--package", package]
    if names:
        cmd += ["--re", names]
    if shard:
        # dealt round robin: each shard takes a share of every file
        cmd += ["--shard", f"{shard[0]}/{shard[1]}", "--sharding", "round-robin"]
    rc = run([*cmd, *(SMOKE_RUST if smoke else [])], cwd=ROOT, env=env)
    results = out / "mutants.out"
    if not (results / "outcomes.json").exists():
        sys.exit(f"mutants: cargo-mutants ended ({rc}) without outcomes")

    def lines(name: str) -> list[str]:
        path = results / name
        text = path.read_text() if path.exists() else ""
        return [_rust_mutant(line) for line in text.splitlines()]

    if not (results / "caught.txt").exists() and rc not in (0, 2, 3):
        sys.exit(f"mutants: cargo-mutants failed ({rc}); see {results / 'debug.log'}")
    return Score(
        "cargo-mutants",
        killed=len(lines("caught.txt")),
        timeouts=len(lines("timeout.txt")),
        unviable=len(lines("unviable.txt")),
        survivors=lines("missed.txt"),
    )


def python(cosmic_ray: str, smoke: bool, shard: tuple[int, int] | None) -> Score:
    work = OUT / ("python-smoke" if smoke else "python")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    build_site(work / "site", installed=smoke)
    config = tomllib.loads((HERE / "python.toml").read_text())
    if smoke:
        config["cosmic-ray"]["module-path"] = [SMOKE_PYTHON]
    (work / "config.toml").write_text(_toml(config))
    bin_dir = Path(cosmic_ray).parent
    # `python` in the test command is the development environment's, as this script's
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=str(work / "site"),
        # a library missing fails the baseline instead of skipping the tests that kill
        DLPACK_TESTS_REQUIRE="numpy,torch,jax",
    )
    session = "session.sqlite"
    steps = [
        [cosmic_ray, "init", "config.toml", session],
        [str(bin_dir / "cr-filter-operators"), session, "config.toml"],
        [cosmic_ray, "baseline", "config.toml"],
        [cosmic_ray, "exec", "config.toml", session],
    ]
    if shard:
        shard_filter = [str(bin_dir / "python"), str(HERE / "cosmic_ray_shard.py"), session]
        steps.insert(2, [*shard_filter, *map(str, shard)])
    for cmd in steps:
        if run(cmd, cwd=work, env=env) != 0:
            sys.exit(f"mutants: {' '.join(cmd[:2])} failed")
    dump = subprocess.run(
        [cosmic_ray, "dump", session], cwd=work, env=env, check=True, capture_output=True, text=True
    ).stdout
    score = Score("cosmic-ray")
    for line in dump.splitlines():
        item, result = json.loads(line)
        if result is None or result["worker_outcome"] == "skipped":
            continue
        if result["worker_outcome"] != "normal":
            score.unviable += 1
        elif result["test_outcome"] == "survived":
            score.survivors.append(_python_mutant(work, item["mutations"][0]))
        elif result["output"] == "timeout":
            score.timeouts += 1
        else:
            score.killed += 1
    return score


def _rust_mutant(line: str) -> str:
    """A mutant as the equivalents file names it: cargo-mutants' "src/x.rs:12:5: replace < with
    <= in f" with the source line it mutates in place of its position, which shifts with every
    edit above it."""
    path, number, _, what = line.split(":", 3)
    source = (ROOT / path).read_text().splitlines()[int(number) - 1].strip()
    return f"{path}: {what.strip()}: {source}"


def _python_mutant(work: Path, mutation: dict[str, object]) -> str:
    """A mutant as the equivalents file names it: its file, operator and line of source (not
    the line's number, which shifts with every edit above it)."""
    path = str(mutation["module_path"])
    line = int(mutation["start_pos"][0])  # type: ignore[index]
    source = (work / path).read_text().splitlines()[line - 1].strip()
    return f"{path.removeprefix('site/')}: {mutation['operator_name']}: {source}"


def _toml(config: dict[str, object], prefix: str = "") -> str:
    """Enough TOML for cosmic-ray's config: tables of strings, numbers and lists of strings."""
    plain, tables = [], []
    for key, value in config.items():
        if isinstance(value, dict):
            tables.append(f"\n[{prefix}{key}]\n" + _toml(value, f"{prefix}{key}."))
        else:
            plain.append(f"{key} = {json.dumps(value)}")
    return "\n".join(plain) + "".join(tables) + "\n"


def pytest_mutated() -> int:
    """The Python tests of the extension's mutated file (cargo.sh, in place: the file that
    differs from the last commit), against the extension in MUTANTS_SITE."""
    changed = subprocess.run(
        ["git", "diff", "--name-only", "HEAD", "--", *RUNTIME_PYTESTS],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    modules = sorted({f"dlpack.tests.{m}" for path in changed for m in RUNTIME_PYTESTS[path]})
    if not modules:  # the baseline: every one
        modules = sorted({f"dlpack.tests.{m}" for ms in RUNTIME_PYTESTS.values() for m in ms})
    env = dict(
        os.environ,
        PYTHONPATH=os.environ["MUTANTS_SITE"],
        PYTHONDONTWRITEBYTECODE="1",
        DLPACK_TESTS_REQUIRE="numpy,pyarrow",
    )
    cmd = [sys.executable, "-P", "-m", "pytest", "--pyargs", *modules, "-k", RUNTIME_PYTEST_K]
    return run([*cmd, "-x", "-q", "-p", "no:cacheprovider"], env=env)


def main() -> int:
    if sys.argv[1:] == ["--pytest-mutated"]:
        return pytest_mutated()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cargo-mutants", required=True, help="the cargo-mutants binary")
    parser.add_argument("--cosmic-ray", required=True, help="the cosmic-ray script")
    parser.add_argument("--part", choices=("rust", "python", "all"), default="all")
    parser.add_argument("--smoke", action="store_true", help="a handful of mutants")
    parser.add_argument(
        "--rotate",
        type=int,
        metavar="N",
        help="only one shard of N of each tool's mutants, the one after the last run's "
        f"({NEXT_SHARD.relative_to(ROOT)}): N runs in a row test every mutant once",
    )
    parser.add_argument(
        "--rust-package",
        action="append",
        default=[],
        metavar="NAME",
        help="only the Rust mutants of this crate (dlpack-core, dlpack-runtime): a run in parts",
    )
    parser.add_argument(
        "--rust-re",
        metavar="REGEX",
        help="only the Rust mutants whose name (file: what) this matches: a run in parts",
    )
    args = parser.parse_args()

    equivalent = {
        entry["mutant"]: entry["why"]
        for entry in tomllib.loads((HERE / "equivalent.toml").read_text()).get("equivalent", [])
    }
    shard = None
    if args.rotate and args.rotate > 1:
        try:
            shard = (int(NEXT_SHARD.read_text()) % args.rotate, args.rotate)
        except (FileNotFoundError, ValueError):
            shard = (0, args.rotate)
        print(f"mutants: shard {shard[0]} of 0..{shard[1] - 1}", flush=True)
    start = time.monotonic()
    scores = []
    # the tools' paths as given from the current folder; they run from others
    args.cargo_mutants = str(Path(args.cargo_mutants).resolve())
    args.cosmic_ray = str(Path(args.cosmic_ray).resolve())
    if args.part in ("rust", "all"):
        scores.append(rust(args.cargo_mutants, args.smoke, args.rust_package, args.rust_re, shard))
    if args.part in ("python", "all"):
        scores.append(python(args.cosmic_ray, args.smoke, shard))
    minutes = (time.monotonic() - start) / 60
    if shard:
        # a run that ends (survivors or not) hands the next shard on; an interrupted one doesn't
        NEXT_SHARD.parent.mkdir(parents=True, exist_ok=True)
        NEXT_SHARD.write_text(f"{(shard[0] + 1) % shard[1]}\n")

    unargued = 0
    covered = "smoke" if args.smoke else "every mutant"
    if shard:
        covered = f"shard {shard[0]} of 0..{shard[1] - 1}"
    print(
        f"\nmutants: {covered}, {minutes:.1f} min, load average {os.getloadavg()[0]:.1f} at the end"
    )
    for score in scores:
        print(
            f"{score.tool}: {score.killed + score.timeouts} killed of {score.total} "
            f"({score.timeouts} of them by a timeout), {len(score.survivors)} survived, "
            f"{score.unviable} unviable"
        )
        for mutant in score.survivors:
            argued = mutant in equivalent
            unargued += not argued
            print(f"  {'equivalent' if argued else 'SURVIVED  '} {mutant}")
    if unargued:
        print(
            f"mutants: {unargued} survivor(s) neither killed by a test nor argued equivalent in "
            "tools/mutants/equivalent.toml"
        )
    return 1 if unargued else 0


if __name__ == "__main__":
    sys.exit(main())
