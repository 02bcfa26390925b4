//! Segments' memory as `DLPackObject`s, each holding its segment (`Owner::RustValue`), and what
//! `share` and `empty_shared` make of them: the view a handle holds (see `handle`).

use std::sync::Arc;

use dlpack_core::dtype::StoredType;
use pyo3::prelude::*;

use super::lender;
use super::mapped::Mapped;
use super::pool::Reuse;
use crate::copy;
use crate::error::{Error, Result};
use crate::object::{Described, empty_view, new_view};
use crate::tensor::{Device, Owner, Tensor};
use dlpack_core::abi::DLDevice;
use dlpack_core::dtype::DType;
use dlpack_core::layout;
use dlpack_core::layout::Layout;
use dlpack_core::share::private_pages_written;

/// Below this, faulting pages in as the copy writes them costs less than starting threads.
pub const POPULATE_MIN_BYTES: u64 = 4 << 20;

/// A view of the elements `layout` lays out `offset` bytes into `segment`, read-only if asked.
pub fn segment_view(
    py: Python<'_>,
    mapped: Arc<Mapped>,
    offset: i64,
    element: StoredType,
    layout: Layout,
    readonly: bool,
) -> Result<Bound<'_, PyAny>> {
    let (low, high) = layout.byte_extent(element.dtype.itemsize())?;
    let capacity = mapped.segment().capacity();
    let inside = low == high
        || (offset.checked_add(low).is_some_and(|low| low >= 0)
            && offset
                .checked_add(high)
                .is_some_and(|high| high as u64 <= capacity));
    if !inside {
        return Err(Error::value(format!(
            "bytes [{low}, {high}) past offset {offset} lie outside a {capacity}-byte segment"
        )));
    }
    let described = Described {
        data: mapped.base_ptr().wrapping_offset(offset as isize).cast(),
        device: DLDevice::CPU,
        element,
        layout,
        readonly,
    };
    // SAFETY: the elements lie inside the mapping (checked just above), which the owner holds,
    // readable and writable while it lives; read-only views are flagged so.
    unsafe { new_view(py, Owner::RustValue(mapped), described) }
}

/// The view a handle to `tensor`'s memory holds if it is host memory, `None` otherwise: shared
/// as it is if it has no elements or lies in shared memory already, else (read-only only)
/// copied into shared memory.
pub fn share_host<'py>(
    py: Python<'py>,
    tensor: &Tensor,
    writable: bool,
) -> Result<Option<Bound<'py, PyAny>>> {
    if !tensor.device().get()?.is_host() {
        return Ok(None);
    }
    if !nameable(tensor.dtype()) {
        return Err(unnameable(tensor.dtype()).into());
    }
    if writable && tensor.readonly() {
        return Err(Error::value("read-only memory can't be shared writable"));
    }
    if let Some(handle) = find(py, tensor, writable)? {
        return Ok(Some(handle));
    }
    if writable {
        return Err(Error::value(
            "writable sharing needs memory that is shared already (receivers' writes would land \
             in a copy): allocate it with dlpack.empty_shared(), or share read-only",
        ));
    }
    copy(py, tensor).map(Some)
}

/// Whether `dtype` is one of the types a receiver can name.
pub fn nameable(dtype: DType) -> bool {
    DType::named().any(|(_, named)| named == dtype)
}

// Out of line: the list of names, unrolled into the caller, made LLVM's optimiser take minutes.
#[cold]
#[inline(never)]
pub fn unnameable(dtype: DType) -> dlpack_core::error::Error {
    let names: Vec<&str> = DType::named().map(|(name, _)| name).collect();
    dlpack_core::error::Error::buffer(format!(
        "elements of type {} can't be shared (the receiving side could not name them); these \
         can: {}",
        dtype.name(),
        names.join(", ")
    ))
}

/// The handle's view of `tensor`'s memory if it has no elements, or lies in a segment mapped
/// here (shared as it is, layout and all; a value error when `writable` is asked of a
/// read-only mapping); `None` when it needs a copy.
fn find<'py>(
    py: Python<'py>,
    tensor: &Tensor,
    writable: bool,
) -> Result<Option<Bound<'py, PyAny>>> {
    let element = StoredType {
        dtype: tensor.dtype(),
        swapped: tensor.swapped(),
    };
    let (low, high) = tensor.layout().byte_extent(tensor.dtype().itemsize())?;
    if low == high {
        return Ok(Some(empty_view(
            py,
            element,
            tensor.layout().clone(),
            !writable,
        )?));
    }
    // Memory behind suboffsets has no address to look up (only a copy can serve it).
    if tensor.indirect() {
        return Ok(None);
    }
    let data = tensor.data() as usize;
    let span = |reach: i64| data.checked_add_signed(reach as isize);
    let (Some(first), Some(end)) = (span(low), span(high)) else {
        return Ok(None);
    };
    let Some(mapped) = Mapped::at(first, end) else {
        return Ok(None);
    };
    if writable && !mapped.segment().writable() {
        return Err(Error::value(
            "this memory is a read-only mapping of another process's segment; it can only be \
             shared read-only",
        ));
    }
    // A copy-on-write mapping (of a read-only handle) that this process wrote into shows other
    // bytes than the segment: what is shared must be what this process sees, so that is copied.
    if mapped.is_private() && private_pages_written(first, end - first) {
        return Ok(None);
    }
    let offset = (data - mapped.base_ptr() as usize) as i64;
    let view = segment_view(
        py,
        mapped,
        offset,
        element,
        tensor.layout().clone(),
        !writable,
    )?;
    Ok(Some(view))
}

/// Copy `tensor` (host memory with elements) into a new segment, or a kept one of the same
/// size, packed densely in the order of its dimensions in memory, with the copy engine: the
/// read-only view of the copy.
fn copy<'py>(py: Python<'py>, tensor: &Tensor) -> Result<Bound<'py, PyAny>> {
    let itemsize = tensor.dtype().itemsize();
    let shape = tensor.layout().shape();
    let strides = layout::dense_strides(shape, tensor.layout().byte_strides(), itemsize)?;
    let dense = Layout::from_byte_strides(shape, Some(&strides), itemsize)?;
    let nbytes = u64::try_from(tensor.nbytes()).map_err(|_| Error::value("negative size"))?;
    // Segments whose handles were released since the lender last looked may be reused now.
    lender::sweep();
    let mapped = match Mapped::reuse(nbytes, Reuse::Copy)? {
        Some(mapped) => mapped,
        None => {
            let mapped = Mapped::create(nbytes, Some(Reuse::Copy))?;
            if nbytes >= POPULATE_MIN_BYTES {
                let len = nbytes as usize;
                py.detach(|| mapped.populate(len))?;
            }
            mapped
        }
    };
    // SAFETY: the mapping, writable and held by the owner, has room for `nbytes` bytes from its
    // base, which is what `dense` addresses (the tensor's elements packed densely).
    let mut target = unsafe {
        Tensor::owned(
            mapped.base_ptr().cast(),
            Device::CPU,
            tensor.dtype(),
            dense.clone(),
            Owner::RustValue(mapped.clone()),
        )
    };
    target.set_swapped(tensor.swapped()); // the bytes are shared as they are stored
    copy::copy_into(py, &target, tensor, None)?;
    drop(target);
    // Never written again until reused: sealed, so no process maps it writable.
    mapped.freeze()?;
    let element = StoredType {
        dtype: tensor.dtype(),
        swapped: tensor.swapped(),
    };
    segment_view(py, mapped, 0, element, dense, true)
}

/// A writable, zero-filled, C-ordered array of `shape` elements of type `name` in a new
/// segment.
pub fn empty<'py>(py: Python<'py>, shape: &[i64], name: &str) -> Result<Bound<'py, PyAny>> {
    let dtype = DType::from_name(name)
        .ok_or_else(|| Error::value(format!("unknown element type {name:?}")))?;
    let element = StoredType {
        dtype,
        swapped: false,
    };
    let layout = Layout::c_order(shape, dtype.itemsize())?;
    let nbytes = layout
        .numel()
        .checked_mul(dtype.itemsize() as i64)
        .ok_or_else(|| Error::value(format!("shape {shape:?} of {name} is too large")))?;
    if nbytes == 0 {
        return empty_view(py, element, layout, false);
    }
    let mapped = Mapped::create(nbytes as u64, None)?;
    segment_view(py, mapped, 0, element, layout, false)
}
