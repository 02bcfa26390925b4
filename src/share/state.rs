//! A handle's pickled state (one `bytes`, laid out by `dlpack_core::share::handle_state`),
//! written by `SharedHandle.__reduce__` (`write`) and read where it arrives (`open`, which
//! checks every field, then opens the segment it names).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::lender::{self, Address};
use super::mapped::Mapped;
use super::open::{Named, open_lent, open_mapped};
use super::segment::TRAILER;
use super::views::segment_view;
use crate::error::{Error, Result};
use crate::object::{empty_view, tensor_of};
use crate::tensor::{Owner, Tensor};
use dlpack_core::dtype::DType;
use dlpack_core::dtype::StoredType;
use dlpack_core::layout::Layout;
use dlpack_core::share::handle_state::{self, HandleState, Lent, boot_id_text, malformed};
use dlpack_core::share::system;

/// The state of the handle of `view` (a `DLPackObject` made by `share` or `open`), writable or
/// not: its segment, if it has one, is pinned in this process's lender for the receiver.
pub fn write<'py>(view: &Bound<'py, PyAny>, writable: bool) -> Result<Bound<'py, PyBytes>> {
    let tensor =
        tensor_of(view).ok_or_else(|| Error::type_("a handle's view is a DLPackObject"))?;
    let (lent, offset, pid) = match mapped_of(tensor) {
        Some(mapped) => {
            let segment = mapped.segment();
            let (lender, token, fd) = lender::lend(segment.clone(), writable)?;
            let address = lender.address(); // this process's (a forked child has its own)
            let lent = Lent {
                lender: address.id,
                board_fd: address.board_fd,
                token,
                file: segment.id(),
                size: segment.size(),
                generation: segment.generation(),
                fd,
            };
            (Some(lent), offset_in(tensor, mapped), address.pid)
        }
        None => (None, 0, system::pid()),
    };
    let state = HandleState {
        boot_id: handle_state::boot_id()?,
        pid,
        writable,
        lent,
        offset,
        dtype: tensor.dtype().0,
        swapped: tensor.swapped(),
        shape: tensor.layout().shape().to_vec(),
        strides: tensor.layout().byte_strides().to_vec(),
    };
    Ok(PyBytes::new(view.py(), &state.encode()))
}

/// The mapping a handle's view lies in (`None` for a view without elements).
pub fn mapped_of(tensor: &Tensor) -> Option<&Mapped> {
    match tensor.owner() {
        Owner::RustValue(value) => value.downcast_ref::<Mapped>(),
        _ => None,
    }
}

/// The mapping a view lies in, as its owner holds it.
pub fn mapped_arc(tensor: &Tensor) -> Option<Arc<Mapped>> {
    match tensor.owner() {
        Owner::RustValue(value) => value.clone().downcast::<Mapped>().ok(),
        _ => None,
    }
}

/// Where a view's elements start, in bytes into its mapping.
fn offset_in(tensor: &Tensor, mapped: &Mapped) -> i64 {
    (tensor.data() as usize).wrapping_sub(mapped.base_ptr() as usize) as i64
}

/// Unpickle a handle: check its state, then open what it names in this process (the segment,
/// mapped and locked, its token released): a view of its elements, and whether receivers of
/// the handle may write.
pub fn open<'py>(state: &Bound<'py, PyAny>) -> Result<(Bound<'py, PyAny>, bool)> {
    let py = state.py();
    let bytes = state
        .cast::<PyBytes>()
        .map_err(|_| malformed("its state is not bytes"))?;
    let state = HandleState::decode(bytes.as_bytes())?;
    let here = handle_state::boot_id()?;
    if state.boot_id != here {
        return Err(Error::buffer(format!(
            "this handle was made on another machine (boot id {}, this one's is {}): shared \
             memory can't cross machines; send the array itself instead (a DLPackObject \
             pickles its data), e.g. through Dask distributed",
            boot_id_text(&state.boot_id),
            boot_id_text(&here),
        )));
    }
    let element = element(&state)
        .ok_or_else(|| malformed(format!("an element type it can't name {:?}", state.dtype)))?;
    let writable = state.writable;
    let itemsize = element.dtype.itemsize();
    let layout = Layout::from_byte_strides(&state.shape, Some(&state.strides), itemsize)
        .map_err(|_| malformed("a layout that addresses more than 2**63 bytes"))?;
    let Some(lent) = state.lent else {
        if layout.numel() != 0 {
            return Err(malformed("elements without memory").into());
        }
        return Ok((empty_view(py, element, layout, !writable)?, writable));
    };
    if lent.size <= TRAILER || lent.fd < 0 {
        return Err(malformed("a malformed segment").into());
    }
    if writable && lender::lent_writable(&lent.token) != Some(true) {
        return Err(
            malformed("it asks for writable memory, but the memory was lent read-only").into(),
        );
    }
    within(state.offset, itemsize, &layout, lent.size - TRAILER)?;
    let named = Named {
        address: Address {
            pid: state.pid,
            id: lent.lender,
            board_fd: lent.board_fd,
        },
        token: &lent.token,
        writable,
        id: lent.file,
        size: lent.size,
        generation: lent.generation,
        lent_fd: lent.fd,
    };
    let mapped = match open_mapped(&named)? {
        Some(mapped) => mapped,
        None => py.detach(|| open_lent(&named))?,
    };
    let view = segment_view(py, mapped, state.offset, element, layout, !writable)?;
    Ok((view, writable))
}

/// The element type a state names, if it is one a handle can carry (a type `share` shares,
/// in the other byte order only where it has one).
fn element(state: &HandleState) -> Option<StoredType> {
    let dtype = DType::from_dlpack(state.dtype).ok()?;
    // As the array interface spells it: bytes and raw (`V`) types have no byte order.
    let has_order = dtype.itemsize() > 1 && dtype.typekind() != b'V';
    (has_order || !state.swapped).then_some(StoredType {
        dtype,
        swapped: state.swapped,
    })
}

/// A value error unless the layout's elements, `offset` bytes in, lie in the `size` bytes of
/// its memory.
fn within(offset: i64, itemsize: usize, layout: &Layout, size: u64) -> Result<()> {
    let (low, high) = layout.byte_extent(itemsize)?;
    let (low, high) = (offset.saturating_add(low), offset.saturating_add(high));
    if low != high && (low < 0 || high as u64 > size) {
        return Err(Error::value(format!(
            "the handle's layout reaches bytes [{low}, {high}) of its {size}-byte memory (a \
             forged or corrupted handle)"
        )));
    }
    Ok(())
}
