//! An extension whose functions accept any array Python holds (numpy, torch, JAX, CuPy on the
//! host, bytes, array.array, Arrow columns, a `DLPackObject`) and return arrays every library
//! takes, through `dlpack_adapter`.

use dlpack_adapter::{Array, ArrayMut, from_ndarray, from_vec, view, view_mut};
use pyo3::prelude::*;

/// The sum of a float64 array of any layout (a C-ordered copy when not contiguous): a typed
/// argument, so another element type is a TypeError naming `x`.
#[pyfunction]
fn total(x: Array<'_, f64>) -> PyResult<f64> {
    Ok(x.to_vec()?.iter().sum())
}

/// Add `value` to every element of a writable, contiguous float64 array, in place.
#[pyfunction]
fn add_in_place(mut y: ArrayMut<'_, f64>, value: f64) -> PyResult<()> {
    for v in y.as_slice_mut()? {
        *v += value;
    }
    Ok(())
}

/// Call `during()` while a mutable view of `obj` is held, and return what it returns: any other
/// view of that memory meanwhile, in this extension or another, is a BufferError.
#[pyfunction]
fn while_held_mutably<'py>(
    obj: &Bound<'py, PyAny>,
    during: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let _held = view_mut(obj)?;
    during.call0()
}

/// Call `during()` while a shared view of `obj` is held, and return what it returns: a mutable
/// view of that memory meanwhile, or `dlpack.copyto` into it, is a BufferError.
#[pyfunction]
fn while_held<'py>(
    obj: &Bound<'py, PyAny>,
    during: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let _held = view(obj)?;
    during.call0()
}

/// The sum of a contiguous float64 array, read in place.
#[pyfunction]
fn total_in_place(obj: &Bound<'_, PyAny>) -> PyResult<f64> {
    Ok(view(obj)?.as_slice::<f64>()?.iter().sum())
}

/// The first element of contiguous float32 memory.
#[pyfunction]
fn first(obj: &Bound<'_, PyAny>) -> PyResult<f32> {
    Ok(view(obj)?.as_slice::<f32>()?[0])
}

/// Shape, byte strides, element type name, device and read-only flag.
type Description = (Vec<i64>, Vec<i64>, String, (i32, i32), bool);

/// What the view sees of an array.
#[pyfunction]
fn describe(obj: &Bound<'_, PyAny>) -> PyResult<Description> {
    let v = view(obj)?;
    let device = v.device()?;
    Ok((
        v.shape().to_vec(),
        v.byte_strides().to_vec(),
        v.dtype().name(),
        (device.device_type, device.device_id),
        v.is_readonly(),
    ))
}

/// The bytes of any array of unsigned bytes (`bytes`, `bytearray`, a uint8 array), C order.
#[pyfunction]
fn byte_values(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    view(obj)?.to_vec::<u8>()
}

/// Copy a float64 array into a Rust buffer (any layout). `to_vec` asks the runtime whether the
/// buffer can be had before allocating it: a buffer made by hand (`vec![0.0; v.len()]`) would
/// panic, or meet the OOM killer, for a broadcast view of 2**62 elements.
#[pyfunction]
fn copy_out(obj: &Bound<'_, PyAny>) -> PyResult<Vec<f64>> {
    view(obj)?.to_vec::<f64>()
}

/// Copy a float64 array into the first `v.len()` elements of a buffer the caller keeps (any
/// layout); `copy_to_slice` takes a slice of exactly the array's length.
#[pyfunction]
fn copy_into_prefix(obj: &Bound<'_, PyAny>, capacity: usize) -> PyResult<Vec<f64>> {
    let v = view(obj)?;
    let mut buffer = vec![-1.0; capacity];
    let Some(prefix) = buffer.get_mut(..v.len()) else {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "{} elements don't fit a buffer of {capacity}",
            v.len()
        )));
    };
    v.copy_to_slice(prefix)?;
    Ok(buffer)
}

/// Multiply a writable, contiguous float32 array by `factor`, in place.
#[pyfunction]
fn scale(obj: &Bound<'_, PyAny>, factor: f32) -> PyResult<()> {
    let mut v = view_mut(obj)?;
    for x in v.as_slice_mut::<f32>()? {
        *x *= factor;
    }
    Ok(())
}

/// Fill a writable float64 array of any layout with 0, 1, 2, ... in C order.
#[pyfunction]
fn fill_counting(obj: &Bound<'_, PyAny>) -> PyResult<()> {
    let mut v = view_mut(obj)?;
    let values: Vec<f64> = (0..v.len()).map(|i| i as f64).collect();
    v.copy_from_slice(&values)
}

/// `y += a * x` for float64 arrays of one shape, any layouts: `y` is viewed mutably, so `x` may
/// not be (any of) the same memory.
#[pyfunction]
fn axpy(y: &Bound<'_, PyAny>, a: f64, x: &Bound<'_, PyAny>) -> PyResult<()> {
    let mut y = view_mut(y)?;
    let x = view(x)?.to_vec::<f64>()?;
    let mut values = y.to_vec::<f64>()?;
    for (v, x) in values.iter_mut().zip(&x) {
        *v += a * x;
    }
    y.copy_from_slice(&values)
}

/// The sum along the last axis of a float64 array of any strides, through `ndarray`.
#[pyfunction]
fn row_sums(obj: &Bound<'_, PyAny>) -> PyResult<Vec<f64>> {
    let v = view(obj)?;
    let array = v.as_array::<f64>()?;
    let last = array.ndim().checked_sub(1).ok_or_else(|| {
        pyo3::exceptions::PyValueError::new_err("row_sums needs at least one dimension")
    })?;
    Ok(array
        .sum_axis(ndarray::Axis(last))
        .iter()
        .copied()
        .collect())
}

/// `arange(n)` as float32, owned by a `DLPackObject` (the `Vec` is freed when the last consumer
/// lets go).
#[pyfunction]
fn arange<'py>(py: Python<'py>, n: usize) -> PyResult<Bound<'py, PyAny>> {
    from_vec(py, (0..n).map(|i| i as f32).collect(), &[n])
}

/// An `rows x cols` int64 matrix whose element (i, j) is `i * cols + j`, made with `ndarray`.
#[pyfunction]
fn matrix<'py>(py: Python<'py>, rows: usize, cols: usize) -> PyResult<Bound<'py, PyAny>> {
    let array = ndarray::Array2::from_shape_fn((rows, cols), |(i, j)| (i * cols + j) as i64);
    from_ndarray(py, array.into_dyn())
}

/// A `Vec` handed over with a shape that doesn't hold it (for the error).
#[pyfunction]
fn mismatched<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
    from_vec(py, vec![1u8, 2, 3], &[2, 2])
}

#[pymodule]
fn dlpack_example(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(total, m)?)?;
    m.add_function(wrap_pyfunction!(add_in_place, m)?)?;
    m.add_function(wrap_pyfunction!(while_held_mutably, m)?)?;
    m.add_function(wrap_pyfunction!(while_held, m)?)?;
    m.add_function(wrap_pyfunction!(total_in_place, m)?)?;
    m.add_function(wrap_pyfunction!(first, m)?)?;
    m.add_function(wrap_pyfunction!(describe, m)?)?;
    m.add_function(wrap_pyfunction!(byte_values, m)?)?;
    m.add_function(wrap_pyfunction!(copy_out, m)?)?;
    m.add_function(wrap_pyfunction!(copy_into_prefix, m)?)?;
    m.add_function(wrap_pyfunction!(scale, m)?)?;
    m.add_function(wrap_pyfunction!(fill_counting, m)?)?;
    m.add_function(wrap_pyfunction!(axpy, m)?)?;
    m.add_function(wrap_pyfunction!(row_sums, m)?)?;
    m.add_function(wrap_pyfunction!(arange, m)?)?;
    m.add_function(wrap_pyfunction!(matrix, m)?)?;
    m.add_function(wrap_pyfunction!(mismatched, m)?)?;
    Ok(())
}
