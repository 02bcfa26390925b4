//! Typed arguments, as rust-numpy's `PyReadonlyArray1<f64>` are: `fn total(x: Array<'_, f64>)`
//! takes any array of float64 elements, and anything else is an error that names the argument
//! (PyO3 names it for a `TypeError`, so every refusal here is one, the cause chained).

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::array::{ArrayView, ArrayViewMut, view, view_mut};
use crate::element::Element;

/// A read-only view of an array argument whose elements are `T`s (any layout, any device:
/// `as_slice`, `to_vec` and the rest say what they need).
pub struct Array<'py, T: Element> {
    view: ArrayView<'py>,
    _element: PhantomData<T>,
}

/// A mutable view of an array argument whose elements are `T`s: writable host memory no other
/// view holds.
pub struct ArrayMut<'py, T: Element> {
    view: ArrayViewMut<'py>,
    _element: PhantomData<T>,
}

/// What an argument of `T`s must be, for its errors (written only when one is raised).
fn what<T: Element>(writable: bool) -> String {
    let writable = if writable { "a writable" } else { "an" };
    format!("{writable} array of {}", T::DTYPE.name())
}

/// The argument's refusal as a `TypeError` (which PyO3 names the argument in), with the view's
/// own error as its cause.
fn refused<T: Element>(py: Python<'_>, writable: bool, err: PyErr) -> PyErr {
    let wrapped = PyTypeError::new_err(format!(
        "expected {}: {}",
        what::<T>(writable),
        err.value(py)
    ));
    wrapped.set_cause(py, Some(err));
    wrapped
}

fn element_type<T: Element>(view: &ArrayView<'_>, writable: bool) -> PyResult<()> {
    if view.dtype() == T::DTYPE {
        return Ok(());
    }
    Err(PyTypeError::new_err(format!(
        "expected {}, got an array of {}",
        what::<T>(writable),
        view.dtype().name()
    )))
}

impl<'a, 'py, T: Element> FromPyObject<'a, 'py> for Array<'py, T> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let view = view(&obj).map_err(|err| refused::<T>(obj.py(), false, err))?;
        element_type::<T>(&view, false)?;
        Ok(Array {
            view,
            _element: PhantomData,
        })
    }
}

impl<'a, 'py, T: Element> FromPyObject<'a, 'py> for ArrayMut<'py, T> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let view = view_mut(&obj).map_err(|err| refused::<T>(obj.py(), true, err))?;
        element_type::<T>(&view, true)?;
        Ok(ArrayMut {
            view,
            _element: PhantomData,
        })
    }
}

impl<'py, T: Element> Array<'py, T> {
    /// The elements in place (C-contiguous host memory, native order, aligned).
    pub fn as_slice(&self) -> PyResult<&[T]> {
        self.view.as_slice::<T>()
    }

    /// The elements in C order (one copy, any layout).
    pub fn to_vec(&self) -> PyResult<Vec<T>> {
        self.view.to_vec::<T>()
    }

    /// An `ndarray` view in place (feature `ndarray`).
    #[cfg(feature = "ndarray")]
    pub fn as_array(&self) -> PyResult<::ndarray::ArrayViewD<'_, T>> {
        self.view.as_array::<T>()
    }
}

impl<'py, T: Element> ArrayMut<'py, T> {
    /// The elements in place, writable.
    pub fn as_slice_mut(&mut self) -> PyResult<&mut [T]> {
        self.view.as_slice_mut::<T>()
    }

    /// Write `src` (C order, exactly `len()` elements) into the memory, any layout.
    pub fn copy_from_slice(&mut self, src: &[T]) -> PyResult<()> {
        self.view.copy_from_slice(src)
    }

    /// A writable `ndarray` view in place (feature `ndarray`).
    #[cfg(feature = "ndarray")]
    pub fn as_array_mut(&mut self) -> PyResult<::ndarray::ArrayViewMutD<'_, T>> {
        self.view.as_array_mut::<T>()
    }
}

impl<'py, T: Element> Deref for Array<'py, T> {
    type Target = ArrayView<'py>;
    fn deref(&self) -> &ArrayView<'py> {
        &self.view
    }
}

impl<'py, T: Element> Deref for ArrayMut<'py, T> {
    type Target = ArrayViewMut<'py>;
    fn deref(&self) -> &ArrayViewMut<'py> {
        &self.view
    }
}

impl<T: Element> DerefMut for ArrayMut<'_, T> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.view
    }
}
