//! `from_vec`: a `DLPackObject` over memory a Rust value owns, freed when the last consumer
//! lets go (on whichever thread that is, without Python).

use std::sync::Arc;

use dlpack_core::abi::DLDevice;
use dlpack_core::dtype::Element as Stored;
use pyo3::prelude::*;

use super::element::Element;
use crate::error::{Error, Result};
use crate::object::{Described, new_view, type_object};
use crate::tensor::{Layout, Owner};

/// A `Vec`'s heap memory, taken apart so that consumers may write it through the raw address
/// the `DLPackObject` hands out; rebuilt and freed on drop.
struct VecMemory<T> {
    ptr: *mut T,
    len: usize,
    capacity: usize,
}

// SAFETY: the memory is the `Vec`'s, owned by this value alone; `T` is `Send + Sync`
// (`Element`).
unsafe impl<T: Element> Send for VecMemory<T> {}
// SAFETY: shared access hands out nothing (consumers reach the memory by its address only).
unsafe impl<T: Element> Sync for VecMemory<T> {}

impl<T> Drop for VecMemory<T> {
    fn drop(&mut self) {
        // SAFETY: the parts of a `Vec` taken apart in `from_vec`, rebuilt once.
        drop(unsafe { Vec::from_raw_parts(self.ptr, self.len, self.capacity) });
    }
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
    let layout = c_layout::<T>(shape, data.len())?;
    let mut data = std::mem::ManuallyDrop::new(data);
    let memory = VecMemory {
        ptr: data.as_mut_ptr(),
        len: data.len(),
        capacity: data.capacity(),
    };
    let described = Described {
        data: memory.ptr.cast(),
        device: DLDevice::CPU,
        element: Stored {
            dtype: T::DTYPE,
            swapped: false,
        },
        layout,
        readonly: false,
    };
    type_object(py)?; // the type exists once the module is loaded, or this crate is linked in
    // SAFETY: the layout (C order, checked against the length) addresses the `Vec`'s `len`
    // elements of `T`'s type in native byte order: host memory, writable, which the owner
    // keeps until the last holder lets go.
    Ok(unsafe { new_view(py, Owner::Held(Arc::new(memory)), described) }?)
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
            .map_err(|e| Error::value(e.to_string()))?
            .iter()
            .copied()
            .collect();
        return from_vec(py, data, &shape);
    }
    from_vec(py, array.iter().copied().collect(), &shape)
}

/// The C-ordered layout of `shape` for `len` elements of `T`.
fn c_layout<T: Element>(shape: &[usize], len: usize) -> Result<Layout> {
    let count = shape.iter().try_fold(1usize, |n, &k| n.checked_mul(k));
    if count != Some(len) {
        return Err(Error::value(format!(
            "shape {shape:?} holds {} elements, the data {len}",
            count.map_or_else(|| "too many".to_owned(), |n| n.to_string())
        )));
    }
    let extents = shape
        .iter()
        .map(|&n| i64::try_from(n).map_err(|_| Error::value("shape too large")))
        .collect::<Result<Vec<i64>>>()?;
    Ok(Layout::c_order(&extents, T::DTYPE.itemsize())?)
}
