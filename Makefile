# Two entry points, both working on a fresh machine with only Rust and Python:
#   make demo  - install, build, and show exchanges with the libraries installed here
#   make test  - install test dependencies, build, run every Rust and Python test on this
#                machine's interpreter (what a contributor runs before a pull request)
# and for maintainers:
#   make test-matrix - the release wheel, and the suite from it in the mixed environment and on
#                every other CPython the wheel claims (CI runs it after make test)
#   make lint  - formatting, clippy, module cycles, message holes, SAFETY notes, ruff, mypy
#   make wheel - the sdist, and the manylinux2014 abi3 release wheel built from it, in dist/
#   make mixed - the suite (the report included), from the wheel, among many more array libraries
#   make pythons - the suite from the wheel on each other CPython this machine has (3.12, 3.13)
#   make debian-pythons - the same on CPythons from Debian's packages, in a chroot (3.14, 3.15)
#   make release-check - what publishing needs: cargo publish --dry-run, twine check, metadata
#   make lock  - recompile requirements/lock*.txt from pyproject.toml's extras (newest versions)
#   make memcheck - the core's tests and a smoke subset of the suite under valgrind's memcheck
# VENV may point elsewhere (CI keeps one in its cache directory), and MIXED_VENV,
# PYTHONS_VENVS and DEBIAN_ROOT too.

PYTHON ?= python3
# Cargo's target folder: CARGO_TARGET_DIR where that is set (CI keeps one in its cache
# directory), else this tree's target/
TARGET_DIR := $(abspath $(or $(CARGO_TARGET_DIR),target))
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
UV := $(PY) -m uv

# pyproject.toml's extras are the one list of dependencies; these pin them (`make lock`):
# test + bench + docs + dev for VENV, test + mixed for MIXED_VENV
LOCK := requirements/lock.txt
LOCK_MIXED := requirements/lock-mixed.txt
# CPython 3.11 on x86_64 Linux; glibc 2.35 is the oldest mlx's wheels run on
LOCK_FOR := --python-version 3.11 --python-platform x86_64-manylinux_2_35
# ... and requirements/lock-py3.X.txt for each of OTHER_PYTHONS and DEBIAN_PYTHONS (below)

# Import names of the libraries the suite must find usable (DLPACK_TESTS_REQUIRE): their tests
# fail instead of skipping when one is missing, broken or crashing. The test extra installs them.
TESTS_REQUIRE := _testbuffer,numpy,ml_dtypes,torch,jax,array_api_strict,tvm_ffi,pyarrow,PIL,torch_jax_interop,hypothesis,distributed,ray,polars,pandas,duckdb,nanoarrow
# ... and in MIXED_VENV, those of the mixed extra too; not paddle, which is installed there but
# crashes the interpreter when imported after TensorFlow (the probe finds it: its tests skip)
MIXED_REQUIRE := $(TESTS_REQUIRE),tensorflow,mlx.core,numba

MIXED_VENV ?= .venv-mixed
# The two tests that probe every installed library for crashing pairs run on the checked build;
# among TensorFlow and Paddle they take about 4 minutes more for nothing new.
MIXED_PYTEST_ARGS ?= -k 'not crashing_libraries'
MIXED_PY := $(MIXED_VENV)/bin/python

# The CPythons the abi3 wheel claims besides VENV's and MIXED_VENV's 3.11 (pyproject.toml's
# classifiers name all of them: tools/check_metadata.py compares), each with a virtualenv of its
# own, its libraries pinned by requirements/lock-py3.X.txt: the test extra, wheels only
# (tools/lock_python.py: a library with no wheel for that CPython is left out, the lock says so,
# and the suite there doesn't require it).
# Those this machine has (PATH, pyenv), in PYTHONS_VENVS, at the versions of LOCK:
OTHER_PYTHONS ?= 3.12 3.13
PYTHONS_VENVS ?= .venvs
# Those newer than any it has: Debian's packages of them from its newest suite, in a chroot of
# its stable suite in DEBIAN_ROOT (tools/debian_chroot.sh; needs root), each with a virtualenv
# inside; at the newest versions with wheels for them (those of LOCK, for 3.11, may have none).
DEBIAN_PYTHONS ?= 3.14 3.15
DEBIAN_ROOT ?= $(HOME)/.cache/dlpack-adapter/debian
# Suites run at once: each keeps to about one core (3.12 and 3.13 side by side: 253 s, against
# 230 s each alone, on 2 cores)
PYTHONS_JOBS ?= 2

.PHONY: demo test lint bench build wheel sdist mixed mixed-venv lock deps rust-test py-test \
	py-test-checked py-test-x64 stubtest mypy venv clean example-test bench-rust-api docs memcheck \
	build-tools checked-build example-build example-run rust-build test-python \
	pythons release-check test-matrix debian-chroot debian-pythons mutants mutants-full mutants-smoke lint-ft

venv: $(PY)
$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip

# uv and maturin at the lock's versions: all that building the extension needs of VENV
build-tools: venv
	$(PIP) install $$(grep -E '^(uv|maturin)==' $(LOCK))

# uv installs the lock: about 40 s from an empty cache, where pip took 204 s. Compiled to
# bytecode as it installs (tools/venv_from_lock.py says why).
deps: build-tools
	$(UV) pip install -q --compile-bytecode --python $(PY) -r $(LOCK)

lock: deps
	$(UV) pip compile -q --upgrade pyproject.toml $(LOCK_FOR) --custom-compile-command "make lock" \
		--extra test --extra bench --extra docs --extra dev -o $(LOCK)
	$(UV) pip compile -q --upgrade pyproject.toml $(LOCK_FOR) --custom-compile-command "make lock" \
		--extra test --extra mixed -o $(LOCK_MIXED)
	for v in $(OTHER_PYTHONS); do \
		$(PY) tools/lock_python.py $$v -c $(LOCK) -o requirements/lock-py$$v.txt || exit 1; \
	done
	for v in $(DEBIAN_PYTHONS); do \
		$(PY) tools/lock_python.py $$v -o requirements/lock-py$$v.txt || exit 1; \
	done

# The sdist, and the release wheel built from it, so building the wheel shows the sdist holds
# everything; both in dist/. The wheel is abi3 (one wheel for every CPython from 3.11) and
# manylinux2014: glibc 2.17 and later, so RHEL/Rocky 8, Ubuntu 20.04, Debian 11 and Amazon Linux 2
# install it. This machine's glibc is newer and its linker would pull in newer symbols, so zig
# (the ziglang package in VENV, found on PATH by maturin) links against glibc 2.17's. auditwheel
# must find the wheel manylinux_2_17, or the build fails. The wheel is built in TARGET_DIR, so
# later builds reuse what was built there: the dependencies. The workspace's own crates are
# built again each time, as the sdist's files all carry one old time (maturin's), which cargo
# would take for older than what it built before (a changed dlpack-core was left out that way).
wheel: sdist
	rm -rf dist/*.whl
	cargo clean --quiet --release --target x86_64-unknown-linux-gnu --target-dir $(TARGET_DIR) \
		-p dlpack-runtime -p dlpack-core -p dlpack-adapter
	PATH="$(abspath $(VENV))/bin:$$PATH" CARGO_TARGET_DIR=$(TARGET_DIR) \
		MATURIN_PEP517_ARGS="--zig --compatibility manylinux2014" \
		$(PIP) wheel --no-deps --no-build-isolation -w dist dist/*.tar.gz
	shown=$$($(PY) -m auditwheel show dist/*.whl) && echo "$$shown" \
		&& echo "$$shown" | grep -q '"manylinux_2_17_x86_64"' \
		|| { echo "make wheel: the wheel is not manylinux_2_17 (manylinux2014)" >&2; exit 1; }

sdist: venv
	rm -rf dist/*.tar.gz
	$(PY) -m maturin sdist -o dist

# Build the release wheel and install it (tests run against the installed wheel, never the
# source tree).
build: wheel
	$(PIP) install --force-reinstall --no-deps dist/*.whl

demo: deps
	$(MAKE) build
	$(PY) -P -m dlpack

# The example and the benchmark extensions have no Rust tests (clippy checks them; make
# example-test builds and tests the example from Python). The `checked` profile, as the Python
# suite's build: the dependencies built for it serve here too, and overflow checks stay on.
# The Rust API crate's tests reach the runtime through the dlpack package installed in VENV
# (`make py-test-checked` installs it), imported by the interpreter they embed.
RUST_TEST_ARGS := --profile checked --workspace --all-features --quiet --exclude dlpack-example \
	--exclude dlpack-rust-numpy-example --exclude dlpack-bench-rust-api
rust-test:
	PYTHONPATH=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
		cargo test $(RUST_TEST_ARGS)

# What rust-test and example-test build, built ahead (`make test` builds it beside the Python
# suite). The example first: rust-test, run next, then builds nothing.
rust-build: build-tools
	$(MAKE) example-build
	cargo test $(RUST_TEST_ARGS) --no-run

# The example extension on the Rust API (examples/rust-api), built against this checkout and
# tested with the libraries the suite uses; beside it the benchmark extension (bench/rust-api),
# a second client of the runtime in the same process, and the extension on both dlpack-adapter
# and rust-numpy (examples/rust-numpy), whose borrows meet. The checked profile: no LTO, so they
# build quickly.
example-build: build-tools
	rm -rf dist-example
	$(PY) -m maturin build --profile checked --quiet -m examples/rust-api/Cargo.toml -o dist-example
	$(PY) -m maturin build --profile checked --quiet -m bench/rust-api/Cargo.toml -o dist-example
	$(PY) -m maturin build --profile checked --quiet -m examples/rust-numpy/Cargo.toml -o dist-example

example-test: example-build
	$(MAKE) example-run

# The wheels in dist-example/ (`make example-build`) installed and tested, then the C example
# built against the installed header and tested.
example-run:
	$(PIP) install --force-reinstall --no-deps dist-example/*.whl
	$(PY) -P -m pytest examples/rust-api/tests examples/rust-numpy/tests -q -ra -p no:cacheprovider
	# the C example (examples/c-api), built by setuptools against the installed dlpack's header
	$(PIP) install --force-reinstall --no-deps --no-build-isolation ./examples/c-api
	$(PY) -P -m pytest examples/c-api/tests -q -ra -p no:cacheprovider
	# the tests' ctypes declaration against the header, with a C compiler required here
	DLPACK_TESTS_REQUIRE=cc $(PY) -P -m pytest --pyargs dlpack.tests.test_c_api -k header -q -ra \
		-p no:cacheprovider

# The Rust API's extraction against rust-numpy's (bench/rust-api), and the C example's.
bench-rust-api: venv
	rm -rf dist-bench
	$(PY) -m maturin build --release --quiet -m bench/rust-api/Cargo.toml -o dist-bench
	$(PIP) install --force-reinstall --no-deps dist-bench/*.whl
	$(PIP) install --force-reinstall --no-deps --no-build-isolation ./examples/c-api
	$(PY) -P bench/bench_rust_api.py

# -P keeps the source tree off sys.path, so `dlpack` is the installed wheel. Through the
# package's runner, which fails a run that ended before pytest finished (a test or library
# calling os._exit(0) would otherwise stop the suite with status 0 and no summary).
py-test:
	DLPACK_TESTS_REQUIRE=$(TESTS_REQUIRE) $(PY) -P -m dlpack.tests -q -ra -p no:cacheprovider $(PYTEST_ARGS)

# The interop tests again with JAX's 64-bit types on (JAX_ENABLE_X64=1, as many JAX users run):
# 64-bit arrays stay 64-bit there instead of narrowing, and the tests expect what JAX holds.
INTEROP_TESTS := test_interop test_interop_functions test_interop_faults test_interop_states \
	test_interop_copyto_jax
py-test-x64:
	JAX_ENABLE_X64=1 DLPACK_TESTS_REQUIRE=$(TESTS_REQUIRE) $(PY) -P -m dlpack.tests $(INTEROP_TESTS) -q -ra -p no:cacheprovider

# Memory errors Rust's checks can't see, found by valgrind's memcheck (Debian's package; Miri
# would need a nightly toolchain): reads and writes out of bounds, uses after free, uses of
# uninitialised values, and in the core definite leaks. Any of them fails the run. About 4
# minutes on 2 cores (220 s in CI).
# First the core's unit tests, the binary `make rust-test` built (same arguments: nothing is built
# again), with no suppressions; every proptest runs 256 cases (PROPTEST_CASES, where some ask for
# up to 2000), about 15 s instead of 40.
# Then a smoke subset of the Python suite, with numpy, on the dlpack installed in VENV (the checked
# build `make py-test-checked` installs): DLPackObjects, from_buffer, numpy's fast path, the C API
# (views, from_memory, copies), copies and exports. Left out: tests needing torch, JAX or tvm-ffi
# (importing them under memcheck takes minutes), the registry test among them, and copyto's
# test of borrowed memory, which takes torch too (3.8 of the subset's 6.8 minutes with it).
# PYTHONMALLOC=malloc makes each Python object a block of its own, as memcheck needs to see reads past it or after
# its free (CPython's allocator carves objects out of large arenas). Child processes (the suite's
# crash probe) run natively. No leak check: at exit CPython leaves objects to the system (numpy's
# module state, the asdlpack method definition each module initialisation leaks on purpose), so
# a block lost there doesn't tell a leak from teardown; the suite checks lifetimes itself.
# .ci/valgrind.supp holds what the interpreter and glibc report, each entry with its reason.
VALGRIND := valgrind --tool=memcheck --error-exitcode=1 --num-callers=30 -q
MEMCHECK_TESTS := dlpack.tests.test_dlpack_object dlpack.tests.test_from_buffer \
	dlpack.tests.test_numpy_fast_path dlpack.tests.test_c_api dlpack.tests.test_copy
MEMCHECK_SKIP := not torch and not jax and not tvm_ffi and not one_registry \
	and not copyto_refuses_memory_a_view_holds
# Left out of the core's: the seqlock's test of readers racing a writer, which memcheck's
# one-thread-at-a-time scheduling turns into a minute of spinning (it checks orderings, which
# memcheck doesn't see; `make rust-test` runs it natively)
MEMCHECK_CORE_SKIP := share::seqlock::tests::threads_read_whole_generations
# The test binary of the core's lib target, from cargo's JSON messages.
CORE_TEST_BINARY := import json, sys; \
	found = {m["executable"] for m in map(json.loads, sys.stdin) \
		if m.get("executable") and m["target"]["name"] == "dlpack_core"}; \
	print(*found) if len(found) == 1 else sys.exit(f"not one dlpack_core test binary: {found}")
memcheck: venv
	core=$$(cargo test $(RUST_TEST_ARGS) --no-run --message-format=json \
		| $(PY) -c '$(CORE_TEST_BINARY)') \
		&& PROPTEST_CASES=256 $(VALGRIND) --leak-check=full --show-leak-kinds=definite \
		--errors-for-leak-kinds=definite "$$core" -q --skip $(MEMCHECK_CORE_SKIP)
	PYTHONMALLOC=malloc DLPACK_TESTS_REQUIRE=$(TESTS_REQUIRE) $(VALGRIND) --leak-check=no \
		--suppressions=.ci/valgrind.supp $(PY) -P -m pytest --pyargs $(MEMCHECK_TESTS) \
		-k '$(MEMCHECK_SKIP)' -q -ra -p no:cacheprovider

# The type stubs must match the built extension.
stubtest:
	cd $(VENV) && $(abspath $(PY)) -P -m mypy.stubtest dlpack._dlpack

# The Python suite against a build with debug assertions and overflow checks on (the `checked`
# profile), installed in place of the release wheel for the run: undefined behaviour that Rust's
# checks can see (null slices, overflows) fails the suite instead of passing silently. Then the
# interop tests in JAX's other mode.
py-test-checked: checked-build
	$(PIP) install --force-reinstall --no-deps dist-checked/*.whl
	$(MAKE) py-test
	$(MAKE) py-test-x64

checked-build: build-tools
	rm -rf dist-checked
	$(PY) -m maturin build --profile checked --quiet -o dist-checked

# What a contributor runs before a pull request, and CI after lint: on this machine's
# interpreter, the suite on the checked build, the stubs, the Rust tests, the Rust API's example.
# Rust builds while the lock installs; the suite runs after the Rust tests' and examples' builds,
# on a machine left to it: beside them (load average 12) a SIGSEGV in test_property's raw layouts
# ended it twice, which no quiet run has shown. The example's wheels go in once the suite is done.
test: build-tools
	$(MAKE) -j2 --output-sync=recurse deps checked-build
	$(PIP) install --force-reinstall --no-deps dist-checked/*.whl
	$(MAKE) rust-build
	$(MAKE) test-python
	$(MAKE) rust-test
	$(MAKE) example-run

test-python:
	$(MAKE) py-test
	$(MAKE) py-test-x64
	$(MAKE) stubtest

# What CI runs after `make test`: the sdist and the release wheel built from it, and the suite
# from that wheel in the mixed environment (3.11), on each of OTHER_PYTHONS and on each of
# DEBIAN_PYTHONS: two suites at a time, one a core (each keeps to about one), the three targets
# sharing make's two job slots, each running its CPythons one after the other; a failure leaves
# the others running (-k), so one run shows every environment's (`make py-test` after
# `make build` runs the suite in VENV instead).
test-matrix: deps
	$(MAKE) wheel
	$(MAKE) -k -j2 --output-sync=recurse mixed pythons debian-pythons PYTHONS_JOBS=1

# The mixed extra's environment, made again from scratch whenever its lock changes (the lock's
# hash is kept inside it).
mixed-venv: venv
	$(PY) tools/venv_from_lock.py --python $(PY) $(MIXED_VENV) $(LOCK_MIXED)

# The wheel in dist/ (`make wheel`), installed in MIXED_VENV, where TensorFlow, Paddle, MLX, numba
# and the test extra's libraries all live together: the whole suite, whose test_report runs the
# report (`python -m dlpack`, and with --json) there and checks it (a run of its own would probe
# every library for crashes once more: a minute among these).
mixed: mixed-venv
	$(UV) pip install -q --python $(MIXED_PY) --reinstall --no-deps dist/*.whl
	DLPACK_TESTS_REQUIRE=$(MIXED_REQUIRE) $(MIXED_PY) -P -m dlpack.tests -q -ra $(MIXED_PYTEST_ARGS)

# The suite from the wheel in dist/ (`make wheel`) on each of OTHER_PYTHONS, each in its own
# virtualenv (made again whenever its lock changes), with TESTS_REQUIRE required. The log ends
# with one line per interpreter: which ran, from where, and how it went. With REQUIRE_PYTHONS=1
# (CI) an interpreter this machine lacks fails the run; without, it is said and skipped.
pythons: venv
	DLPACK_TESTS_REQUIRE=$(TESTS_REQUIRE) $(PY) tools/other_pythons.py --wheel 'dist/*.whl' \
		--venvs $(abspath $(PYTHONS_VENVS)) --jobs $(PYTHONS_JOBS) \
		$(if $(REQUIRE_PYTHONS),--require) $(OTHER_PYTHONS)

# The chroot holding DEBIAN_PYTHONS, made again whenever the stable suite's codename or the list
# changes (about 80 s).
debian-chroot:
	tools/debian_chroot.sh make $(DEBIAN_ROOT) $(DEBIAN_PYTHONS)

# The suite from the wheel in dist/ on each of DEBIAN_PYTHONS, as `make pythons` does, inside
# the chroot with /proc, /dev, /dev/pts and /dev/shm mounted while it runs; each virtualenv made
# again whenever its lock changes (its wheels fetched here: pip can't reach the index from
# inside). Where no chroot can be made (no root; status 3), the log says so, and with
# REQUIRE_PYTHONS=1 the run fails.
debian-pythons: venv
	tools/debian_chroot.sh make $(DEBIAN_ROOT) $(DEBIAN_PYTHONS) || [ $$? = 3 ]
	DLPACK_TESTS_REQUIRE=$(TESTS_REQUIRE) tools/debian_chroot.sh run $(DEBIAN_ROOT) -- \
		$(PY) tools/other_pythons.py --wheel 'dist/*.whl' --chroot $(DEBIAN_ROOT) \
		--jobs $(PYTHONS_JOBS) $(if $(REQUIRE_PYTHONS),--require) $(DEBIAN_PYTHONS)

# What publishing needs besides the tests (docs/releasing.md), on the sdist and wheel in dist/
# (`make wheel`): the crates meant for crates.io package and build from their packaged files
# alone, PyPI will render the sdist's and wheel's metadata, and both sides say the same version,
# license and addresses, and the Python versions the suite runs on.
release-check: venv
	cargo publish --dry-run --quiet -p dlpack-core -p dlpack-adapter
	$(PY) -m twine check --strict dist/*
	$(PY) tools/check_metadata.py --wheel dist/*.whl --pythons 3.11 $(OTHER_PYTHONS) \
		$(DEBIAN_PYTHONS)

mypy:
	$(PY) -m mypy

lint: deps
	cargo fmt --check
	cargo clippy --workspace --all-targets --all-features --quiet -- -D warnings
	# the crates as a client extension takes them: default features, and the core without
	# the runtime's
	cargo clippy -p dlpack-adapter --all-targets --quiet -- -D warnings
	cargo clippy -p dlpack-core --no-default-features --lib --quiet -- -D warnings
	# PyO3's stable ABI is the client extension's choice: the Rust API crate must not turn it on
	! cargo tree -p dlpack-adapter -e features -i pyo3 | grep abi3
	# the C API's header (dlpack/include/dlpack_adapter.h) is what its Rust declaration generates
	cargo run --quiet -p dlpack-header -- --check
	$(MAKE) lint-ft
	$(PY) tools/module_cycles.py
	# messages without holes (a line break left in a literal, words run together)
	$(PY) tools/check_messages.py --self-test
	$(PY) tools/check_messages.py
	# SAFETY notes that say why where they stand
	$(PY) tools/check_safety_notes.py --self-test
	$(PY) tools/check_safety_notes.py
	$(PY) -m ruff check dlpack bench tools examples
	$(PY) -m ruff format --check dlpack bench tools examples
	$(MAKE) mypy

# Clippy on the free-threaded CPython 3.14 build (version-specific: abi3 has no free-threaded
# form before 3.15), which no interpreter here provides: PyO3 is configured by a file instead.
# Its own target folder, so the two configurations don't rebuild each other's dependencies.
PYO3_FT := PYO3_CONFIG_FILE=$(abspath tools/pyo3-ft314.cfg) CARGO_TARGET_DIR=$(TARGET_DIR)/ft
lint-ft:
	$(PYO3_FT) cargo clippy --workspace --all-targets --all-features --quiet -- -D warnings

# Exchange cost against the native paths and pydlpack (installed aside, in bench/.pydlpack).
bench: deps
	$(MAKE) build
	PYTHON=$(PY) bash bench/install_pydlpack.sh
	$(PY) -P bench/bench_exchange.py $(BENCH_ARGS)

clean:
	rm -rf dist dist-checked dist-example dist-bench target $(VENV) $(MIXED_VENV) $(PYTHONS_VENVS)

# The documentation site, built with warnings as errors, every Python example in README.md and
# docs/ run (tools/check_doc_examples.py), and every figure in README.md tied to its row of
# docs/benchmarks.md (tools/check_readme_figures.py). Needs `pip install "dlpack-adapter[docs]"`,
# dlpack built and installed (make build) and the libraries the examples use (the test extra).
docs:
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict
	$(PY) tools/check_doc_examples.py
	$(PY) -P tools/check_import_order.py
	$(PY) tools/check_readme_figures.py --self-test
	$(PY) tools/check_readme_figures.py

# Mutation testing (tools/mutants/run.py): cargo-mutants over the Rust checks that guard memory
# (.cargo/mutants.toml; the extension's mutants also meet the Python tests that reach them) and
# cosmic-ray over the Python front (tools/mutants/python.toml). It prints the score and every
# survivor, and fails on a survivor not argued equivalent in tools/mutants/equivalent.toml. The
# Rust files are mutated in place (each restored after its mutant): leave the tree alone while
# it runs. The tools are installed on first use into MUTANTS_TOOLS, at these versions.
# mutants: one shard of MUTANTS_SHARDS of each tool's mutants, dealt round robin, the one after
# the last run's (target/mutants-out/next-shard), so that MUTANTS_SHARDS runs in a row test every
# mutant once; mutants-full: every mutant at once. Measured at load average about 1 on 2 cores
# (docs/internals.md): shard 0 11.2 min (243 Rust mutants, 23 Python ones), shard 1 11.6 min
# (242, 22), every mutant killed, unviable or argued equivalent. MUTANTS_ARGS=
# "--part python", "--part rust --rust-package dlpack-core" or "--rust-re REGEX" run a part (its
# shard; all of it with mutants-full).
# mutants-smoke: a handful of mutants of each tool (5 Rust ones, 9 Python ones against the
# installed extension: 2.2 min at load average 2), so the tooling can't rot.
MUTANTS_TOOLS ?= target/tools
CARGO_MUTANTS_VERSION := 27.1.0
COSMIC_RAY_VERSION := 8.7.0
CARGO_MUTANTS := $(MUTANTS_TOOLS)/bin/cargo-mutants
COSMIC_RAY := $(MUTANTS_TOOLS)/cosmic-ray/bin/cosmic-ray
MUTANTS_RUN = $(PY) tools/mutants/run.py --cargo-mutants $(CARGO_MUTANTS) --cosmic-ray $(COSMIC_RAY)
$(CARGO_MUTANTS):
	cargo install --locked --quiet --root $(MUTANTS_TOOLS) cargo-mutants@$(CARGO_MUTANTS_VERSION)
$(COSMIC_RAY): | $(PY)
	$(PY) -m venv $(MUTANTS_TOOLS)/cosmic-ray
	$(MUTANTS_TOOLS)/cosmic-ray/bin/python -m pip install -q --disable-pip-version-check \
		cosmic-ray==$(COSMIC_RAY_VERSION)
MUTANTS_SHARDS ?= 2
mutants: deps $(CARGO_MUTANTS) $(COSMIC_RAY)
	$(MUTANTS_RUN) --rotate $(MUTANTS_SHARDS) $(MUTANTS_ARGS)
mutants-full: deps $(CARGO_MUTANTS) $(COSMIC_RAY)
	$(MUTANTS_RUN) $(MUTANTS_ARGS)
mutants-smoke: deps $(CARGO_MUTANTS) $(COSMIC_RAY)
	$(MUTANTS_RUN) --smoke
