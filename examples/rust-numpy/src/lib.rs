//! An extension on both dlpack-adapter and rust-numpy: its functions take one array through
//! each crate, so a call with the same numpy array twice asks both for overlapping borrows,
//! which are refused whichever crate borrows first.

use dlpack_adapter::{Array, ArrayMut, view, view_mut};
use numpy::{PyReadonlyArrayDyn, PyReadwriteArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;

/// `y += a * x`, `y` borrowed mutably through rust-numpy, then `x` viewed through
/// dlpack-adapter: `axpy_numpy_first(x, a, x)` is a BufferError naming rust-numpy's borrow.
#[pyfunction]
fn axpy_numpy_first(
    mut y: PyReadwriteArrayDyn<'_, f64>,
    a: f64,
    x: Array<'_, f64>,
) -> PyResult<()> {
    let x = x.as_slice()?;
    let y = y.as_slice_mut()?;
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
    Ok(())
}

/// `y += a * x`, `y` viewed mutably through dlpack-adapter, then `x` borrowed through
/// rust-numpy: `axpy_ours_first(x, a, x)` is rust-numpy's error (it is already borrowed).
#[pyfunction]
fn axpy_ours_first(
    mut y: ArrayMut<'_, f64>,
    a: f64,
    x: PyReadonlyArrayDyn<'_, f64>,
) -> PyResult<()> {
    let x = x.as_slice()?;
    let y = y.as_slice_mut()?;
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
    Ok(())
}

/// The dot product of `x` (dlpack-adapter) and `y` (rust-numpy): both shared, so the same
/// array may be passed twice.
#[pyfunction]
fn dot(x: Array<'_, f64>, y: PyReadonlyArrayDyn<'_, f64>) -> PyResult<f64> {
    Ok(x.as_slice()?
        .iter()
        .zip(y.as_slice()?)
        .map(|(x, y)| x * y)
        .sum())
}

/// Call `during()` while dlpack-adapter views `obj` (mutably if `mutable`), and return what it
/// returns.
#[pyfunction]
fn while_viewed<'py>(
    obj: &Bound<'py, PyAny>,
    mutable: bool,
    during: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    if mutable {
        let _held = view_mut(obj)?;
        during.call0()
    } else {
        let _held = view(obj)?;
        during.call0()
    }
}

/// Call `during()` while rust-numpy borrows `array` (mutably if `mutable`: `readwrite`), and
/// return what it returns.
#[pyfunction]
fn while_borrowed<'py>(
    array: &Bound<'py, numpy::PyArrayDyn<f64>>,
    mutable: bool,
    during: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    use numpy::PyArrayMethods;
    if mutable {
        let _held = array.try_readwrite()?;
        during.call0()
    } else {
        let _held = array.try_readonly()?;
        during.call0()
    }
}

/// Borrow `array` through rust-numpy (mutably if `mutable`) and let go: its number of elements.
#[pyfunction]
fn numpy_borrow(array: &Bound<'_, numpy::PyArrayDyn<f64>>, mutable: bool) -> PyResult<usize> {
    use numpy::PyArrayMethods;
    Ok(if mutable {
        array.try_readwrite()?.len()
    } else {
        array.try_readonly()?.len()
    })
}

#[pymodule]
fn dlpack_rust_numpy(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(axpy_numpy_first, m)?)?;
    m.add_function(wrap_pyfunction!(axpy_ours_first, m)?)?;
    m.add_function(wrap_pyfunction!(dot, m)?)?;
    m.add_function(wrap_pyfunction!(while_viewed, m)?)?;
    m.add_function(wrap_pyfunction!(while_borrowed, m)?)?;
    m.add_function(wrap_pyfunction!(numpy_borrow, m)?)?;
    Ok(())
}
