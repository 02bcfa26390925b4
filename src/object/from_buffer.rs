//! `_from_buffer`: a `DLPackObject` of elements laid out in another object's flat memory (a
//! shared segment's mapping, the bytes a pickle hands back), built from that memory and a layout
//! (offset, shape, byte strides, element type), so no Python code fakes an array interface to
//! describe memory it holds.

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

use super::view::{Described, new_view, spelled};
use crate::error::{Error, Result};
use crate::import::buffer::View;
use dlpack_core::abi::DLDevice;
use dlpack_core::dtype::{DType, StoredType};
use dlpack_core::layout::Layout;

/// The element type `typestr` spells (in either byte order), named `dtype` (the name decides
/// for the types a typestr has no code for: bfloat16, the float8 types).
fn element(typestr: &str, dtype: &str) -> Result<StoredType> {
    let named = DType::from_name(dtype)
        .ok_or_else(|| Error::value(format!("unknown element type {dtype:?}")))?;
    spelled(named, typestr).ok_or_else(|| {
        Error::value(format!(
            "typestr {typestr:?} does not spell elements of type {dtype}"
        ))
    })
}

/// A DLPackObject of the elements at byte `offset` of `memory` (any object exporting flat,
/// contiguous bytes: ``mmap``, ``bytearray``, ``bytes``, ...; None for no elements) with this
/// layout: C order when `byte_strides` is None. It keeps `memory` exported, and so alive, while anything can reach
/// the elements. Read-only when asked, or when `memory` is; ValueError when the elements reach
/// outside `memory`'s bytes.
#[pyfunction]
#[pyo3(signature = (memory, offset, shape, byte_strides, typestr, dtype, readonly))]
pub fn _from_buffer<'py>(
    memory: &Bound<'py, PyAny>,
    offset: i64,
    shape: Vec<i64>,
    byte_strides: Option<Vec<i64>>,
    typestr: &str,
    dtype: &str,
    readonly: bool,
) -> Result<Bound<'py, PyAny>> {
    let py = memory.py();
    let element = element(typestr, dtype)?;
    let empty;
    let memory = if memory.is_none() {
        empty = if readonly {
            PyBytes::new(py, b"").into_any()
        } else {
            PyByteArray::new(py, b"").into_any()
        };
        &empty
    } else {
        memory
    };
    let itemsize = element.dtype.itemsize();
    let layout = Layout::from_byte_strides(&shape, byte_strides.as_deref(), itemsize)?;
    let view = View::acquire(memory)?;
    let raw = view.raw();
    let flat = raw.suboffsets.is_null()
        && match raw.ndim {
            0 => true,
            1 => {
                raw.strides.is_null() || {
                    // SAFETY: a one-dimensional view's non-null strides array has one entry.
                    let stride = unsafe { *raw.strides };
                    stride == raw.itemsize
                }
            }
            _ => false,
        };
    if !flat {
        return Err(Error::value("the memory must be flat, contiguous bytes"));
    }
    let length = i64::try_from(raw.len).map_err(|_| Error::value("buffer too large"))?;
    let (low, high) = layout.byte_extent(itemsize)?;
    let within = if layout.numel() == 0 {
        (0..=length).contains(&offset)
    } else {
        offset.checked_add(low).is_some_and(|start| start >= 0)
            && offset.checked_add(high).is_some_and(|end| end <= length)
    };
    if !within {
        return Err(Error::value(format!(
            "elements at offset {offset} spanning bytes [{low}, {high}) reach outside the \
             {length} bytes of the memory"
        )));
    }
    // In bounds (checked above), so the offset address stays inside the exported memory.
    let data = raw.buf.cast::<u8>().wrapping_offset(offset as isize).cast();
    let described = Described {
        data,
        device: DLDevice::CPU,
        element,
        layout,
        readonly: readonly || view.readonly(),
    };
    // SAFETY: the elements lie inside the exported buffer's bytes (checked above), host memory
    // the view keeps exported while the object lives; writable unless the exporter said
    // read-only (then `readonly` is set); the typestr was checked to spell the element type.
    unsafe { new_view(py, view.into_owner(), described) }
}
