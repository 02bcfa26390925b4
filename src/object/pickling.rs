//! Pickling a `DLPackObject`: host memory travels as a `pickle.PickleBuffer`, so protocol 5
//! with a `buffer_callback` (Dask distributed, Ray, `pickle.dumps(..., buffer_callback=...)`)
//! sends the memory itself, out of band, without a copy; protocol 5 without one and older
//! protocols put the bytes in the pickle. Unpickling is `_from_buffer` over the bytes pickle
//! hands back: a `DLPackObject` of the same shape, strides, element type and read-only flag.
//!
//! Memory that is not dense (strided views, memory behind suboffsets) is first copied densely,
//! in C order, with the copy engine: only the elements travel. Device memory is refused:
//! pickling it would move it to the host unasked.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyTuple};

use super::copy_into::copyto;
use super::state::DLPackObject;
use crate::error::{Error, Result};
use dlpack_core::layout;

/// The module's `_from_buffer` function object, which pickles name as the reconstructor (by
/// module and name, so unpickling finds it without this process's state).
static RECONSTRUCTOR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
/// `pickle.PickleBuffer`: the limited C API has no constructor for it, so this is the one
/// Python module pickling imports.
static PICKLE_BUFFER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Remember the registered `_from_buffer` (called once, at module registration).
pub fn set_reconstructor(function: &Bound<'_, PyAny>) {
    let _ = RECONSTRUCTOR.set(function.py(), function.clone().unbind());
}

fn pickle_buffer<'py>(py: Python<'py>, memory: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    PICKLE_BUFFER
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(py.import("pickle")?.getattr("PickleBuffer")?.unbind())
        })?
        .bind(py)
        .call1((memory,))
}

/// `__reduce_ex__(protocol)` of `object`, whose state is `state`.
pub fn reduce_ex<'py>(
    object: &Bound<'py, PyAny>,
    state: &DLPackObject,
    protocol: i64,
) -> Result<Bound<'py, PyTuple>> {
    let py = object.py();
    let tensor = state.tensor();
    let device = tensor.device().get()?;
    if !device.is_host() {
        return Err(Error::buffer(format!(
            "a DLPackObject of memory on device ({}, {}) can't be pickled (pickling would move \
             it to the host unasked); copy it to host memory first, or share it between \
             processes of this machine with dlpack.share",
            device.device_type, device.device_id
        )));
    }
    // Set when the module is initialised, before any DLPackObject can exist.
    let reconstructor = RECONSTRUCTOR
        .get(py)
        .ok_or_else(|| Error::runtime("internal error: no reconstructor registered"))?
        .bind(py)
        .clone();
    let reconstructor = &reconstructor;
    let typestr = tensor.dtype().typestr(tensor.swapped());
    let name = tensor.dtype().name();
    let shape = tensor.layout().shape().to_vec();
    let readonly = tensor.readonly();
    let arguments = |memory: Bound<'py, PyAny>, strides: Vec<i64>| {
        let items = (
            memory,
            0,
            shape.clone(),
            strides,
            typestr.clone(),
            name.clone(),
            readonly,
        );
        PyTuple::new(
            py,
            [
                reconstructor.clone().into_any(),
                items.into_pyobject(py)?.into_any(),
            ],
        )
    };
    if tensor.numel() == 0 {
        return Ok(arguments(
            py.None().into_bound(py),
            tensor.layout().byte_strides().to_vec(),
        )?);
    }
    let dense = tensor.exportable().is_ok()
        && (tensor.layout().is_c_contiguous() || tensor.layout().is_f_contiguous());
    let (buffer, strides) = if dense {
        // Lent as flat bytes: transports join and slice frames as one-dimensional bytes (Dask's
        // TCP comm fails on a Fortran-ordered or multi-dimensional one).
        let raw = pickle_buffer(py, object)?.call_method0("raw")?;
        (
            pickle_buffer(py, &raw)?,
            tensor.layout().byte_strides().to_vec(),
        )
    } else {
        let zeros = vec![0; shape.len()];
        let strides = layout::dense_strides(&shape, &zeros, tensor.dtype().itemsize())?;
        let nbytes = usize::try_from(tensor.nbytes())
            .map_err(|_| Error::value("more bytes than an address space has"))?;
        let copied = PyByteArray::new_with(py, nbytes, |_| Ok(()))?.into_any();
        let target = super::from_buffer::_from_buffer(
            &copied,
            0,
            shape.clone(),
            Some(strides.clone()),
            &typestr,
            &name,
            false,
        )?;
        copyto(&target, object, None)?;
        (pickle_buffer(py, &copied)?, strides)
    };
    if protocol >= 5 {
        return Ok(arguments(buffer, strides)?);
    }
    // No PickleBuffer before protocol 5: bytes in the pickle, a bytearray if writes are allowed.
    let raw = buffer.call_method0("raw")?;
    let bytes = if readonly {
        raw.call_method0("tobytes")?
    } else {
        PyByteArray::from(&raw)?.into_any()
    };
    Ok(arguments(bytes, strides)?)
}
