#!/usr/bin/env bash
# cargo as cargo-mutants calls it (its CARGO), for `make mutants` (tools/mutants/run.py sets the
# variables below). Every call goes to the real cargo; a `cargo test` of the extension's crate
# (dlpack-runtime) that passes then builds the extension from the mutated tree and runs the
# Python tests that reach the mutated file's checks (run.py's RUNTIME_PYTESTS), since most of
# those checks guard memory only Python hands them. A mutant those tests fail on is killed, as
# by a Rust test.
set -euo pipefail
: "${MUTANTS_REAL_CARGO:?}" "${MUTANTS_SITE:?}" "${MUTANTS_PYTHON:?}"

"$MUTANTS_REAL_CARGO" "$@"
# (cargo-mutants builds first with `cargo test --no-run`: a mutant that doesn't build is unviable,
# one that builds is then tested)
[[ "${1:-}" == test && " $* " == *dlpack-runtime* && " $* " != *" --no-run "* ]] || exit 0

# The cdylib as maturin builds it (pyproject.toml's features), in the profile cargo-mutants
# tests with; the package's Python files from this tree beside it.
profile=mutants
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
    --profile) profile="${args[i + 1]}" ;;
    --profile=*) profile="${args[i]#--profile=}" ;;
    esac
done
"$MUTANTS_REAL_CARGO" build --quiet --profile "$profile" --lib -p dlpack-runtime \
    --features pyo3/extension-module
target=${CARGO_TARGET_DIR:-target}
rm -rf "$MUTANTS_SITE/dlpack"
cp -r dlpack "$MUTANTS_SITE/dlpack"
cp "$target/$profile/libdlpack_runtime.so" "$MUTANTS_SITE/dlpack/_dlpack.abi3.so"
"$MUTANTS_PYTHON" tools/mutants/run.py --pytest-mutated
