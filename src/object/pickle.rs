//! Pickling `DLPackObject`: host memory travels as a `pickle.PickleBuffer`, so protocol 5 with a
//! `buffer_callback` (Dask distributed, Ray, `pickle.dumps(..., buffer_callback=...)`) sends the
//! memory itself, out of band, without a copy; protocol 5 without one and older protocols put
//! the bytes in the pickle. It unpickles (`_rebuild`, this module's reconstructor) to a
//! `DLPackObject` of the same shape, strides, element type and read-only flag over the buffer
//! pickle hands back, which every `from_dlpack` accepts.
//!
//! Memory that is not dense (strided views, memory behind suboffsets) is first copied densely,
//! in C order, with the copy engine: only the elements travel. Device memory is refused:
//! pickling it would move it to the host unasked.

use std::mem::{ManuallyDrop, MaybeUninit};

use dlpack_core::dtype::Element;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyTuple, PyType};

use super::view::{Described, empty_view, new_view, spelled, tensor_of};
use crate::copy;
use crate::error::{Error, Result};
use crate::ffi::DLDevice;
use crate::ffi::python::{self, Py_buffer};
use crate::tensor::{DType, Device, FilledView, Layout, Owner, Tensor, layout};

/// The reconstructor, as the module holds it (set when the module is made).
static REBUILD: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Add `_rebuild` to the module, and keep it for `reduce_ex`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let rebuild = wrap_pyfunction!(_rebuild, m)?;
    m.add_function(rebuild.clone())?;
    let _ = REBUILD.set(m.py(), rebuild.into_any().unbind());
    Ok(())
}

/// `DLPackObject.__reduce_ex__(protocol)`: rebuild from a buffer of the elements and their
/// layout.
pub fn reduce_ex<'py>(
    object: &Bound<'py, PyAny>,
    protocol: &Bound<'py, PyAny>,
) -> Result<Bound<'py, PyAny>> {
    let py = object.py();
    let tensor = tensor_of(object).expect("`__reduce_ex__` is called on a DLPackObject");
    let device = tensor.device.get()?;
    if !device.is_host() {
        return Err(Error::buffer(format!(
            "a DLPackObject of memory on device ({}, {}) can't be pickled (pickling would move \
             it to the host unasked); copy it to host memory first, or share it between \
             processes of this machine with dlpack.share",
            device.device_type, device.device_id
        )));
    }
    let protocol: i64 = protocol.extract()?;
    let rebuild = REBUILD
        .get(py)
        .ok_or_else(|| Error::runtime("dlpack._dlpack is not initialised"))?;
    let typestr = tensor.dtype.typestr(tensor.swapped);
    let name = tensor.dtype.name();
    let readonly = tensor.readonly;
    let shape = tensor.layout.shape();
    let reduced = |buffer: Bound<'py, PyAny>, strides: &[i64]| -> Result<Bound<'py, PyAny>> {
        let (shape, strides) = (PyTuple::new(py, shape)?, PyTuple::new(py, strides)?);
        let args = (buffer, shape, strides, &typestr, &name, readonly);
        Ok((rebuild, args).into_pyobject(py)?.into_any())
    };
    if tensor.numel() == 0 {
        return reduced(py.None().into_bound(py), tensor.layout.byte_strides());
    }
    let nbytes = usize::try_from(tensor.nbytes()).map_err(|_| Error::value("too large"))?;
    let dense = tensor.exportable().is_ok()
        && (tensor.layout.is_c_contiguous() || tensor.layout.is_f_contiguous());
    if dense {
        let buffer = if protocol >= 5 {
            // Lent as flat bytes: transports join and slice frames as one-dimensional bytes
            // (Dask's TCP comm fails on a Fortran-ordered or multi-dimensional one).
            pickle_buffer(&flat_bytes(object, tensor, nbytes)?)?
        } else {
            // No PickleBuffer: bytes in the pickle, a bytearray if writes are allowed.
            copied_bytes(py, tensor.data.cast(), nbytes, readonly)?
        };
        return reduced(buffer, tensor.layout.byte_strides());
    }
    let strides = layout::dense_strides(shape, &vec![0; shape.len()], tensor.dtype.itemsize())?;
    let copied = PyByteArray::new_with(py, nbytes, |_| Ok(()))?;
    let mut target = Tensor::owned(
        copied.data().cast(),
        Device::CPU,
        tensor.dtype,
        Layout::from_byte_strides(shape, Some(&strides), tensor.dtype.itemsize())?,
        Owner::object(copied.clone().into_any().unbind()),
    );
    target.swapped = tensor.swapped; // the bytes travel as they are stored
    copy::copy_into(py, &target, tensor, None)?;
    drop(target);
    let buffer = match (protocol >= 5, readonly) {
        (true, _) => pickle_buffer(copied.as_any())?,
        (false, true) => PyBytes::new(py, &copied.to_vec()).into_any(),
        (false, false) => copied.into_any(),
    };
    reduced(buffer, &strides)
}

/// The `nbytes` dense bytes of `object`'s `tensor` as a flat, one-dimensional `DLPackObject`
/// of bytes that holds `object`.
fn flat_bytes<'py>(
    object: &Bound<'py, PyAny>,
    tensor: &Tensor,
    nbytes: usize,
) -> Result<Bound<'py, PyAny>> {
    let bytes = Element {
        dtype: DType::from_name("uint8").expect("uint8 is named"),
        swapped: false,
    };
    let described = Described {
        data: tensor.data,
        device: DLDevice::CPU,
        element: bytes,
        layout: Layout::c_order(&[nbytes as i64], 1)?,
        readonly: tensor.readonly,
    };
    // SAFETY: `tensor` is dense, so its `nbytes` bytes from `data` are its host memory, which
    // `object` (held by the new owner) keeps alive, writable unless read-only.
    unsafe {
        new_view(
            object.py(),
            Owner::object(object.clone().unbind()),
            described,
        )
    }
}

/// A copy of the `len` bytes at `data`: `bytes`, or a `bytearray` when writes are allowed.
fn copied_bytes(
    py: Python<'_>,
    data: *const u8,
    len: usize,
    readonly: bool,
) -> Result<Bound<'_, PyAny>> {
    let fill = |dst: &mut [u8]| {
        // SAFETY: `data` is the start of `len` readable bytes of host memory (the caller's
        // dense tensor, alive for the call); `dst` is a new object's buffer of `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(data, dst.as_mut_ptr(), len) };
        Ok(())
    };
    Ok(if readonly {
        PyBytes::new_with(py, len, fill)?.into_any()
    } else {
        PyByteArray::new_with(py, len, fill)?.into_any()
    })
}

fn pickle_buffer<'py>(object: &Bound<'py, PyAny>) -> Result<Bound<'py, PyAny>> {
    static PICKLE_BUFFER: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let ty = PICKLE_BUFFER.import(object.py(), "pickle", "PickleBuffer")?;
    Ok(ty.call1((object,))?)
}

/// Unpickle a `DLPackObject`: a view of the bytes pickle hands back (bytes, bytearray, or the
/// transport's out-of-band buffer), read-only if the original was or the buffer is (as numpy
/// does, the memory is used as it arrives, not copied to make it writable).
#[pyfunction]
pub fn _rebuild<'py>(
    py: Python<'py>,
    buffer: Option<Bound<'py, PyAny>>,
    shape: Vec<i64>,
    strides: Vec<i64>,
    typestr: &str,
    dtype_name: &str,
    readonly: bool,
) -> Result<Bound<'py, PyAny>> {
    let element = element(typestr, dtype_name)?;
    let itemsize = element.dtype.itemsize();
    let layout = Layout::from_byte_strides(&shape, Some(&strides), itemsize)?;
    let Some(buffer) = buffer.filter(|b| !b.is_none()) else {
        return empty_view(py, element, layout, readonly);
    };
    let (view, exporter) = contiguous_view(&buffer)?;
    let (low, high) = layout.byte_extent(itemsize)?;
    if low < 0 || high > view.len as i64 {
        return Err(Error::value(format!(
            "the pickle's shape and strides reach bytes [{low}, {high}) outside its {}-byte \
             buffer",
            view.len
        )));
    }
    let described = Described {
        data: view.buf,
        device: DLDevice::CPU,
        element,
        layout,
        readonly: readonly || view.readonly != 0,
    };
    let owner = Owner::Buffer { view, exporter };
    // SAFETY: the buffer's `len` bytes from `buf` are host memory its view keeps alive until
    // released (by the owner), writable unless the view is read-only; the layout's bytes lie
    // within them (checked just above).
    unsafe { new_view(py, owner, described) }
}

/// A contiguous view of `buffer`'s bytes (`PyBUF_SIMPLE`), and the object exporting it.
fn contiguous_view(buffer: &Bound<'_, PyAny>) -> Result<(FilledView, ManuallyDrop<Py<PyAny>>)> {
    let mut raw = Box::new(MaybeUninit::<Py_buffer>::zeroed());
    // SAFETY: `raw` is writable storage for one Py_buffer; the filled view is released once,
    // by the owner it goes to.
    if !unsafe { python::get_buffer(buffer, raw.as_mut_ptr(), python::PyBUF_SIMPLE) } {
        return Err(PyErr::fetch(buffer.py()).into());
    }
    // SAFETY: the view was filled, so it is initialised.
    let view: Box<Py_buffer> = unsafe { Box::from_raw(Box::into_raw(raw).cast()) };
    // SAFETY: filled just above; only its owner releases it.
    let view = unsafe { FilledView::new(view) };
    Ok((view, ManuallyDrop::new(buffer.clone().unbind())))
}

/// The element type a pickle names: its name, with the byte order its typestr gives.
fn element(typestr: &str, name: &str) -> Result<Element> {
    let dtype = DType::from_name(name)
        .ok_or_else(|| Error::value(format!("unknown element type {name:?}")))?;
    spelled(dtype, typestr)
        .ok_or_else(|| Error::value(format!("typestr {typestr:?} does not spell {name}")))
}
