//! The same function, `total(x)` of a contiguous float64 vector, through each way a PyO3
//! extension can take an array: dlpack-adapter's `view` and typed `Array<f64>` argument, and
//! rust-numpy's `PyReadonlyArray1`.
//! Both read the elements in place; only the extraction differs.

use numpy::PyReadonlyArray1;
use pyo3::prelude::*;

#[pyfunction]
fn total_view(obj: &Bound<'_, PyAny>) -> PyResult<f64> {
    Ok(dlpack_adapter::view(obj)?.as_slice::<f64>()?.iter().sum())
}

#[pyfunction]
fn total_typed(x: dlpack_adapter::Array<'_, f64>) -> PyResult<f64> {
    Ok(x.as_slice()?.iter().sum())
}

#[pyfunction]
fn total_numpy(array: PyReadonlyArray1<'_, f64>) -> PyResult<f64> {
    Ok(array.as_slice()?.iter().sum())
}

/// Only the extraction, nothing read: what each costs per call.
#[pyfunction]
fn extract_view(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    Ok(dlpack_adapter::view(obj)?.len())
}

#[pyfunction]
fn extract_numpy(array: PyReadonlyArray1<'_, f64>) -> usize {
    array.len().unwrap_or(0)
}

#[pymodule]
fn dlpack_bench_rust_api(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(total_view, m)?)?;
    m.add_function(wrap_pyfunction!(total_typed, m)?)?;
    m.add_function(wrap_pyfunction!(total_numpy, m)?)?;
    m.add_function(wrap_pyfunction!(extract_view, m)?)?;
    m.add_function(wrap_pyfunction!(extract_numpy, m)?)?;
    Ok(())
}
