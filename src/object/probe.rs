//! A measurement probe, built only with the `pyclass-probe` feature: `DLPackObject`'s state in a
//! PyO3 `#[pyclass(frozen, freelist)]`, with PyO3's argument extraction, so that
//! `bench/bench_pyclass.py` can time the exchanges through it and through the hand-written type
//! in one process. Each method calls what the hand-written type's entry point calls (`pytype`'s
//! `dlpack_in_place` and `lend_buffer`, the state's exports); only the type, its allocation and
//! its calls' dispatch differ. It has what the benchmark's rows use: `__dlpack__`,
//! `__dlpack_device__`, the buffer protocol, the array interfaces and the C exchange API.

use std::ffi::c_int;
use std::mem::MaybeUninit;
use std::ptr;

use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyModule};

use super::pytype::{dlpack_in_place, lend_buffer};
use super::state::{DLPackObject, PyClassObject, probe_state as state};
use super::{arguments, exchange_api};
use crate::ffi::python;
use crate::import;
use crate::tensor::Tensor;

/// A pointer to `value`'s object, or null for `None` (as `dlpack_in_place` takes them).
fn raw(value: &Option<Bound<'_, PyAny>>) -> *mut python::PyObject {
    value.as_ref().map_or(ptr::null_mut(), Bound::as_ptr)
}

#[pymethods]
impl PyClassObject {
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<Bound<'py, PyAny>>,
        dl_device: Option<Bound<'py, PyAny>>,
        copy: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let object = &slf.get().0;
        let values = [raw(&stream), raw(&max_version), raw(&dl_device), raw(&copy)];
        let py = slf.py();
        // SAFETY: we hold the GIL (`py`); `slf` is the object whose state `object` is; the values
        // are null or live arguments this call holds.
        let in_place = unsafe { dlpack_in_place(py, object, slf.as_ptr(), values) };
        if let Some(exported) = in_place {
            // SAFETY: a new reference to the capsule, and we hold the GIL (`py`).
            return Ok(unsafe { Bound::from_owned_ptr(py, exported?) });
        }
        let request = arguments::parse_request(
            stream.as_ref(),
            max_version.as_ref(),
            dl_device.as_ref(),
            copy.as_ref(),
        )?;
        Ok(object.export(slf.as_any(), request)?)
    }

    fn __dlpack_device__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: we hold the GIL (`py`).
        if let Some(tuple) = unsafe { self.0.cached_dlpack_device() } {
            // SAFETY: a new reference to a live tuple, and we hold the GIL (`py`).
            return Ok(unsafe { Bound::from_owned_ptr(py, tuple) });
        }
        Ok(self.0.dlpack_device(py)?.into_any())
    }

    /// # Safety
    /// CPython passes a writable `view`.
    unsafe fn __getbuffer__(
        slf: &Bound<'_, Self>,
        view: *mut python::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        // SAFETY: CPython passes a writable `view`; a null `obj` is what a failed request leaves.
        unsafe { (*view).obj = ptr::null_mut() };
        // SAFETY: `view` is writable; `slf` is the object whose state this is.
        unsafe { lend_buffer(slf.as_any().as_borrowed(), &slf.get().0, view, flags) }
    }

    #[getter]
    fn __array_interface__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        slf.get().0.array_interface(slf.as_any())
    }

    #[getter]
    fn __array_struct__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        slf.get().0.array_struct(slf.as_any())
    }

    #[classattr]
    fn __dlpack_c_exchange_api__(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
        exchange_api::capsule(py)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // SAFETY: the collector traverses holding the GIL.
        let py = unsafe { Python::assume_attached() };
        let mut result = Ok(());
        self.0.for_each_reference(|object| {
            // SAFETY: `object` is a live object the state references, borrowed for the visit.
            let object = unsafe { Bound::ref_from_ptr(py, &object) };
            match visit.call(object.as_unbound()) {
                Ok(()) => 0,
                Err(err) => {
                    result = Err(err);
                    1
                }
            }
        });
        result
    }
}

/// `asdlpack` for the probe: an exact numpy array of a known dtype read the way `asdlpack`'s
/// fast path reads it (then moved into the new object, as a `#[pyclass]` takes its value), or
/// anything else imported as `asdlpack` imports it.
#[pyfunction]
fn _pyclass_asdlpack<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    if state(obj).is_some() {
        return Ok(obj.clone());
    }
    let mut tensor = MaybeUninit::<Tensor>::uninit();
    // SAFETY: `tensor` is valid for writes of a `Tensor`.
    let state = if unsafe { import::import_known_into(obj, tensor.as_mut_ptr()) } {
        // SAFETY: `import_known_into` said it wrote the tensor whole.
        DLPackObject::new(unsafe { tensor.assume_init() })
    } else {
        let import::Imported { tensor, producer } = import::import(obj)?;
        DLPackObject { tensor, producer }
    };
    Ok(Bound::new(obj.py(), PyClassObject(state))?.into_any())
}

/// Add the probe's type and function to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyClassObject>()?;
    m.add_function(wrap_pyfunction!(_pyclass_asdlpack, m)?)
}
