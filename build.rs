//! Build script: tells the crate which Python it is built for (PyO3's configuration cfgs), so
//! that `src/ffi/python.rs` can refuse a free-threaded interpreter at compile time.

fn main() {
    pyo3_build_config::use_pyo3_cfgs();
    pyo3_build_config::print_expected_cfgs();
}
