//! `DLPackObject`s over memory that Rust owns or holds (a shared segment's mapping, a pickle's
//! buffer), described by the caller instead of read from a Python protocol; and what such an
//! object's owner is.

use std::ffi::c_void;

use dlpack_core::dtype::{StoredType, TypeStr, parse_typestr};
use dlpack_core::memory::AlignedBuffer;
use pyo3::prelude::*;

use super::instance::{new_object, state};
use super::state::DLPackObject;
use crate::error::{Error, Result};
use crate::tensor::{Device, Owner, Storage, Tensor};
use dlpack_core::abi::DLDevice;
use dlpack_core::dtype::DType;
use dlpack_core::layout::Layout;

/// Where a view's elements are, what they are, and whether they may be written.
pub struct Described {
    /// The address of the first element.
    pub data: *mut c_void,
    pub device: DLDevice,
    pub element: StoredType,
    pub layout: Layout,
    pub readonly: bool,
}

/// A `DLPackObject` of the elements `described` describes, kept alive by `owner` (released when
/// the object and every export of it are gone).
///
/// # Safety
/// While `owner` lives, the bytes `described.layout` addresses from `described.data` (its
/// `byte_extent` for the element's size, relative to `data`) are memory of `described.device`,
/// readable, writable unless `described.readonly`, holding elements of `described.element`'s
/// type in its byte order.
pub unsafe fn new_view(
    py: Python<'_>,
    owner: Owner,
    described: Described,
) -> Result<Bound<'_, PyAny>> {
    let Described {
        data,
        device,
        element,
        layout,
        readonly,
    } = described;
    Tensor::check_data(data, &layout)?;
    let storage = Storage {
        data,
        device: Device::Known(device),
        dtype: element.dtype,
        readonly,
        swapped: element.swapped,
        indirect: false,
        stream: None,
    };
    // SAFETY: this function's contract is the memory invariant for these parts.
    let tensor = unsafe { Tensor::new(storage, layout, owner) };
    Ok(new_object(py, DLPackObject::new(tensor))?)
}

/// A host view of no elements.
pub fn empty_view<'py>(
    py: Python<'py>,
    element: StoredType,
    layout: Layout,
    readonly: bool,
) -> Result<Bound<'py, PyAny>> {
    if layout.numel() != 0 {
        return Err(Error::value("elements without memory"));
    }
    let buffer = AlignedBuffer::new(0)?;
    let described = Described {
        data: buffer.as_ptr().cast(),
        device: DLDevice::CPU,
        element,
        layout,
        readonly,
    };
    // SAFETY: no elements: the layout addresses no bytes.
    unsafe { new_view(py, Owner::Allocation(buffer), described) }
}

/// The element type `dtype` stored in the byte order `typestr` spells, if `typestr` spells
/// `dtype` (its kind and size, or raw bytes of its size).
pub fn spelled(dtype: DType, typestr: &str) -> Option<StoredType> {
    match parse_typestr(typestr).ok()? {
        TypeStr::Known(element) if element.dtype == dtype => Some(element),
        TypeStr::Opaque { itemsize, swapped } if itemsize == dtype.itemsize() => {
            Some(StoredType { dtype, swapped })
        }
        _ => None,
    }
}

/// The tensor of `object`, if it is a `DLPackObject`.
pub fn tensor_of<'a>(object: &'a Bound<'_, PyAny>) -> Option<&'a Tensor> {
    state(object).map(DLPackObject::tensor)
}
