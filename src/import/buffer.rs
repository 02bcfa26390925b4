//! Importer for the Python buffer protocol (bytes, bytearray, memoryview, array.array, mmap,
//! ctypes, numpy, ...).

use std::ffi::CStr;
use std::mem::{ManuallyDrop, MaybeUninit};

use crate::ffi::python::{self, Py_buffer};
use pyo3::prelude::*;

use crate::error::{Error, Result};
use crate::tensor::{Device, FilledView, Owner, Storage, Tensor};
use dlpack_core::dtype;
use dlpack_core::layout::Layout;

/// A held `Py_buffer`: released by its `Owner` exactly once.
pub struct View {
    owner: Owner,
}

impl View {
    /// Request a full (strided, formatted, possibly indirect) read-only-or-better view, so we see
    /// the exporter's real layout and writability, and suboffsets when it has them.
    pub fn acquire(obj: &Bound<'_, PyAny>) -> Result<View> {
        let mut raw = Box::new(MaybeUninit::<Py_buffer>::zeroed());
        // SAFETY: `raw` is writable storage for one Py_buffer; the filled view is released
        // once, by its `Owner`.
        if !unsafe { python::get_buffer(obj, raw.as_mut_ptr(), python::PyBUF_FULL_RO) } {
            return Err(PyErr::fetch(obj.py()).into());
        }
        // SAFETY: the view was filled, so it is initialised.
        let view: Box<Py_buffer> = unsafe { Box::from_raw(Box::into_raw(raw).cast()) };
        Ok(View {
            owner: Owner::Buffer {
                // SAFETY: filled just above; only its owner releases it.
                view: unsafe { FilledView::new(view) },
                exporter: ManuallyDrop::new(obj.clone().unbind()),
            },
        })
    }

    pub fn raw(&self) -> &Py_buffer {
        match &self.owner {
            Owner::Buffer { view, .. } => view,
            _ => unreachable!("a View always owns a buffer"),
        }
    }

    pub fn readonly(&self) -> bool {
        self.raw().readonly != 0
    }

    pub fn into_owner(self) -> Owner {
        self.owner
    }
}

/// Import any object that exports a buffer.
pub fn import(obj: &Bound<'_, PyAny>) -> Result<Tensor> {
    let view = View::acquire(obj)?;
    let raw = view.raw();
    let ndim = usize::try_from(raw.ndim).map_err(|_| Error::value("negative buffer ndim"))?;
    // SAFETY: a non-null suboffsets array has `ndim` entries.
    let indirect = !raw.suboffsets.is_null()
        && unsafe { dlpack_core::abi::c_array(raw.suboffsets, ndim) }
            .iter()
            .any(|&s| s >= 0);
    let itemsize = usize::try_from(raw.itemsize).unwrap_or(0);
    let format: &[u8] = if raw.format.is_null() {
        b"B"
    } else {
        // SAFETY: the exporter gives a NUL-terminated format string valid while the view lives.
        unsafe { CStr::from_ptr(raw.format) }.to_bytes()
    };
    let element = dtype::parse_buffer_format(format, itemsize)?;
    let layout = if ndim > 0 && raw.shape.is_null() {
        // Only possible for exporters ignoring the request; treat the memory as 1-D bytes.
        let extent = [raw.len as i64 / itemsize.max(1) as i64];
        Layout::from_byte_strides(&extent, None, itemsize)?
    } else {
        // SAFETY: shape (and strides, when present) have `ndim` entries while the view lives.
        let shape = unsafe { dlpack_core::abi::c_array(raw.shape, ndim) };
        // SAFETY: non-null strides (checked) have `ndim` entries while the view lives, which
        // it does here.
        let strides = (!raw.strides.is_null())
            .then(|| unsafe { dlpack_core::abi::c_array(raw.strides, ndim) });
        Layout::build(
            ndim,
            itemsize,
            |k| shape[k] as i64,
            strides.map(|s| move |k: usize| Ok(s[k] as i64)),
        )?
    };
    Tensor::check_data(raw.buf, &layout)?;
    let storage = Storage {
        data: raw.buf,
        device: Device::CPU,
        dtype: element.dtype,
        readonly: view.readonly(),
        swapped: element.swapped,
        indirect,
        stream: None,
    };
    let owner = view.into_owner();
    // SAFETY: the exporter's word, which nothing can check: per the buffer protocol, the
    // view's buffer, shape and strides (through its suboffsets when `indirect`) address its
    // elements in host memory while the view, released by the owner, is held; writable unless
    // the view is read-only.
    Ok(unsafe { Tensor::new(storage, layout, owner) })
}

/// Whether `obj` exports buffers.
pub fn supports(obj: &Bound<'_, PyAny>) -> bool {
    python::supports_buffer(obj)
}
