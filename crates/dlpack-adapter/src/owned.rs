//! `from_vec`: a `DLPackObject` (the runtime's one type) over memory a Rust value owns, freed
//! when the last consumer lets go (on whichever thread that is, without Python).

use std::ffi::c_void;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::capi::{self, DLPackAdapterMemory};
use crate::element::Element;

/// A `Vec`'s heap memory, taken apart so that consumers may write it through the raw address
/// the `DLPackObject` hands out; rebuilt and freed when the runtime releases it.
struct VecMemory<T> {
    ptr: *mut T,
    len: usize,
    capacity: usize,
}

impl<T> Drop for VecMemory<T> {
    fn drop(&mut self) {
        // SAFETY: the parts of a `Vec` taken apart in `from_vec`, rebuilt once.
        drop(unsafe { Vec::from_raw_parts(self.ptr, self.len, self.capacity) });
    }
}

/// The runtime's release callback for a `VecMemory<T>` boxed as `context`.
///
/// # Safety
/// `context` is a `Box<VecMemory<T>>` made by `from_vec`, released once (the runtime's word);
/// `T: Send` lets that happen on any thread.
unsafe extern "C" fn release<T: Element>(context: *mut c_void) {
    // SAFETY: `context` is a `Box<VecMemory<T>>` from `from_vec`, released once (this
    // function's contract), so it is ours to rebuild and drop.
    drop(unsafe { Box::from_raw(context.cast::<VecMemory<T>>()) });
}

/// A `DLPackObject` owning `data` (no copy), of `shape` in C order: writable host memory that
/// numpy, torch, JAX and every other `from_dlpack` accept. A `ValueError` unless the shape
/// holds exactly `data.len()` elements.
///
/// ```
/// # pyo3::Python::initialize();
/// # pyo3::Python::attach(|py| -> pyo3::PyResult<()> {
/// let obj = dlpack_adapter::from_vec(py, vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
/// let view = dlpack_adapter::view(&obj)?;
/// assert_eq!(view.shape(), &[2, 3]);
/// assert_eq!(view.dtype().name(), "float32");
/// assert_eq!(view.as_slice::<f32>()?[5], 6.0);
/// # Ok(()) }).unwrap();
/// ```
pub fn from_vec<'py, T: Element>(
    py: Python<'py>,
    data: Vec<T>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    let count = shape.iter().try_fold(1usize, |n, &k| n.checked_mul(k));
    if count != Some(data.len()) {
        return Err(PyValueError::new_err(format!(
            "shape {shape:?} holds {} elements, the data {}",
            count.map_or_else(|| "too many".to_owned(), |n| n.to_string()),
            data.len()
        )));
    }
    let extents = shape
        .iter()
        .map(|&n| i64::try_from(n).map_err(|_| PyValueError::new_err("shape too large")))
        .collect::<PyResult<Vec<i64>>>()?;
    let api = capi::api(py)?;
    let mut data = std::mem::ManuallyDrop::new(data);
    let memory = Box::new(VecMemory {
        ptr: data.as_mut_ptr(),
        len: data.len(),
        capacity: data.capacity(),
    });
    let described = DLPackAdapterMemory {
        size: size_of::<DLPackAdapterMemory>() as u32,
        flags: 0,
        data: memory.ptr.cast(),
        dtype: T::DTYPE.0,
        ndim: extents.len() as i32,
        shape: extents.as_ptr(),
        byte_strides: std::ptr::null(),
        release: Some(release::<T>),
        context: Box::into_raw(memory).cast(),
    };
    // SAFETY: the GIL is held; `described` addresses the `Vec`'s `len` elements of `T`'s type
    // in C order (the shape holds exactly that many, checked): host memory, writable, owned by
    // the boxed context until the runtime calls `release` once.
    let object = unsafe { (api.from_memory)(&described) };
    if object.is_null() {
        // Refused: the runtime never calls `release`, so the memory is still ours to free.
        // SAFETY: the box made above, released here once instead.
        unsafe { release::<T>(described.context) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference the runtime made.
    Ok(unsafe { Bound::from_owned_ptr(py, object) })
}

/// `from_vec` for a boxed slice.
pub fn from_boxed_slice<'py, T: Element>(
    py: Python<'py>,
    data: Box<[T]>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    from_vec(py, data.into_vec(), shape)
}

/// `from_vec` for an `ndarray` array: its memory as it is when in standard (C) order and
/// whole, else one C-ordered copy.
#[cfg(feature = "ndarray")]
pub fn from_ndarray<'py, T: Element>(
    py: Python<'py>,
    array: ndarray::ArrayD<T>,
) -> PyResult<Bound<'py, PyAny>> {
    let shape = array.shape().to_vec();
    let len = array.len();
    if array.is_standard_layout() {
        let (data, offset) = array.into_raw_vec_and_offset();
        if data.len() == len && offset.unwrap_or(0) == 0 {
            return from_vec(py, data, &shape);
        }
        // A slice of a larger array: only its elements go.
        let view = ndarray::ArrayView::from_shape(shape.clone(), &data[offset.unwrap_or(0)..]);
        let data = view
            .map_err(|e| PyValueError::new_err(e.to_string()))?
            .iter()
            .copied()
            .collect();
        return from_vec(py, data, &shape);
    }
    from_vec(py, array.iter().copied().collect(), &shape)
}
