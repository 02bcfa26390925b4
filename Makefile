# Two entry points, both working on a fresh machine with only Rust and Python:
#   make demo  - install, build, and show exchanges with the libraries installed here
#   make test  - install test dependencies, build the wheel, run every Rust and Python test
# VENV may point elsewhere (CI keeps one in its cache directory).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: demo test lint bench bench-rust-api build rust-test example-test py-test py-test-checked stubtest venv clean

venv: $(PY)
$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip

# Build a release wheel and install it (tests run against the installed wheel, never the
# source tree).
build: venv
	rm -rf dist
	$(PY) -m maturin build --release --quiet -o dist
	$(PIP) install --force-reinstall --no-deps dist/*.whl

demo: venv
	$(PIP) install -r requirements/demo.txt
	$(MAKE) build
	$(PY) -P -m dlpack

# The example and the benchmark extensions have no Rust tests (clippy checks them; make
# example-test builds and tests the example from Python).
rust-test:
	cargo test --workspace --all-features --quiet --exclude dlpack-example --exclude dlpack-bench-rust-api

# The example extension on the Rust API (examples/rust-api), built against this checkout and
# tested with the libraries the suite uses. The checked profile: no LTO, so it builds quickly.
example-test: venv
	rm -rf dist-example
	$(PY) -m maturin build --profile checked --quiet -m examples/rust-api/Cargo.toml -o dist-example
	$(PIP) install --force-reinstall --no-deps dist-example/*.whl
	$(PY) -P -m pytest examples/rust-api/tests -q -ra -p no:cacheprovider

# The Rust API's extraction against rust-numpy's (bench/rust-api).
bench-rust-api: venv
	rm -rf dist-bench
	$(PY) -m maturin build --release --quiet -m bench/rust-api/Cargo.toml -o dist-bench
	$(PIP) install --force-reinstall --no-deps dist-bench/*.whl
	$(PY) -P bench/bench_rust_api.py

# -P keeps the source tree off sys.path, so `dlpack` is the installed wheel.
py-test:
	DLPACK_TESTS_REQUIRE=numpy,ml_dtypes,torch,jax,array_api_strict,tvm_ffi,pyarrow,PIL,torch_jax_interop,hypothesis,distributed,polars,pandas,duckdb,nanoarrow $(PY) -P -m pytest --pyargs dlpack.tests -q -ra -p no:cacheprovider $(PYTEST_ARGS)

# The type stubs must match the built extension.
stubtest:
	cd $(VENV) && $(abspath $(PY)) -P -m mypy.stubtest dlpack._dlpack

# The Python suite against a build with debug assertions and overflow checks on (the `checked`
# profile), installed in place of the release wheel for the run: undefined behaviour that Rust's
# checks can see (null slices, overflows) fails the suite instead of passing silently.
py-test-checked: venv
	rm -rf dist-checked
	$(PY) -m maturin build --profile checked --quiet -o dist-checked
	$(PIP) install --force-reinstall --no-deps dist-checked/*.whl
	$(MAKE) py-test

test: venv
	$(PIP) install -r requirements/test.txt
	$(MAKE) py-test-checked
	$(MAKE) build
	$(MAKE) rust-test
	$(MAKE) stubtest
	$(MAKE) py-test
	$(MAKE) example-test

lint: venv
	$(PIP) install ruff
	cargo fmt --check
	cargo clippy --workspace --all-targets --all-features --quiet -- -D warnings
	$(PY) tools/module_cycles.py
	$(PY) -m ruff check dlpack bench tools examples
	$(PY) -m ruff format --check dlpack bench tools examples

# Exchange cost against the native paths and pydlpack (installed aside, in bench/.pydlpack).
bench: venv
	$(PIP) install -r requirements/test.txt
	$(MAKE) build
	PYTHON=$(PY) bash bench/install_pydlpack.sh
	$(PY) -P bench/bench_exchange.py $(BENCH_ARGS)

clean:
	rm -rf dist dist-checked dist-example dist-bench target $(VENV)

# The documentation site, built with warnings as errors, and every Python example in README.md and
# docs/ run (tools/check_doc_examples.py). Needs `pip install "dlpack-adapter[docs]"`, dlpack built
# and installed (make build) and the libraries the examples use (requirements/test.txt).
.PHONY: docs
docs:
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict
	$(PY) tools/check_doc_examples.py
