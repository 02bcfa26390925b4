//! Hooks for the package's own tests and benchmarks, not its API: the submodule
//! `dlpack._dlpack._testing`, apart from the public functions (and from `_dlpack.pyi`). They ship
//! in the release module because the tests do (`dlpack.tests.run()` checks an installed wheel).
//!
//! ```text
//! footprint           bytes behind our objects, for the memory report (bench_memory.py)
//! share_counts        segments mapped, kept for reuse and pinned in this process, and the
//!                     lender thread's wake-ups (Linux)
//! share_state_fields  a handle's pickled state as a dict, and share_state_pack back (Linux),
//!                     for tests that forge handles
//! ```

#[cfg(target_os = "linux")]
mod share_state;

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Make `dlpack._dlpack._testing` and add it to `parent` (and to `sys.modules`, so that
/// `import dlpack._dlpack._testing` finds it too).
pub fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = parent.py();
    let m = PyModule::new(py, "_testing")?;
    m.add_function(wrap_pyfunction!(footprint, &m)?)?;
    #[cfg(target_os = "linux")]
    {
        m.add_function(wrap_pyfunction!(share_counts, &m)?)?;
        m.add_function(wrap_pyfunction!(share_state::share_state_fields, &m)?)?;
        m.add_function(wrap_pyfunction!(share_state::share_state_pack, &m)?)?;
    }
    // An attribute, not `add_submodule`, which would list it in the module's `__all__`.
    parent.setattr("_testing", &m)?;
    let modules = py.import("sys")?.getattr("modules")?;
    modules
        .cast::<PyDict>()?
        .set_item("dlpack._dlpack._testing", &m)?;
    Ok(())
}

/// Heap bytes behind our objects for a tensor of `ndim` dimensions: `(name, bytes)` pairs.
#[pyfunction]
fn footprint(ndim: usize) -> Vec<(&'static str, usize)> {
    crate::object::footprint(ndim)
}

/// ``(segments mapped, segments kept for reuse, tokens pinned, times the lender's thread
/// woke)`` in this process.
#[cfg(target_os = "linux")]
#[pyfunction]
fn share_counts() -> (usize, usize, usize, u64) {
    crate::share::counts()
}
