//! What a view of an object's memory holds, for the C API: the source that keeps the memory
//! alive and the memory's borrow in the process's one registry (`borrows`).

use dlpack_core::layout::{SelfOverlap, self_overlap};
use pyo3::prelude::*;

use super::borrows::Borrow;
use crate::error::{Error, Result};
use crate::import;
use crate::object::tensor_of;
use crate::tensor::Tensor;

/// What a view holds, free of the interpreter's lifetime (the C API hands it out boxed): the
/// source that keeps the memory alive, and the memory's borrow. Dropped with the GIL held.
pub(crate) struct Held {
    source: Source,
    _borrow: Option<Borrow>,
    exclusive: bool,
}

enum Source {
    /// A `DLPackObject`: its own tensor, read in place.
    Object(Py<PyAny>),
    Imported(Tensor),
}

impl Held {
    /// `obj`'s memory, held shared, or `exclusive`ly (writable host memory only).
    pub(crate) fn new(obj: &Bound<'_, PyAny>, exclusive: bool) -> Result<Self> {
        let source = if tensor_of(obj).is_some() {
            Source::Object(obj.clone().unbind())
        } else {
            Source::Imported(import::import_in_place(obj)?.tensor)
        };
        let mut view = Held {
            source,
            _borrow: None,
            exclusive,
        };
        let tensor = view.tensor(obj.py());
        if exclusive {
            host_memory(tensor)?;
            if tensor.readonly() || import::is_immutable(obj) {
                return Err(Error::buffer(
                    "this array's memory is read-only, so it can't be viewed mutably; \
                     view() reads it, or copy it first",
                ));
            }
            if tensor.indirect() {
                return Err(not_direct());
            }
        }
        // Only host memory is read in place by Rust, so only host memory is held.
        if host_memory(tensor).is_ok() && !tensor.indirect() {
            let (low, high) = tensor.layout().byte_extent(tensor.dtype().itemsize())?;
            let start = (tensor.data() as usize).wrapping_add_signed(low as isize);
            let end = (tensor.data() as usize).wrapping_add_signed(high as isize);
            view._borrow = Borrow::take(start, end, exclusive)?;
        }
        Ok(view)
    }

    /// The memory held, as described when the view was made (a `DLPackObject`'s tensor never
    /// changes).
    pub(crate) fn tensor<'a>(&'a self, py: Python<'a>) -> &'a Tensor {
        match &self.source {
            Source::Object(object) => tensor_of(object.bind(py))
                .expect("a DLPackObject when the view was made, and still"),
            Source::Imported(tensor) => tensor,
        }
    }

    /// Whether the memory is held exclusively (a mutable view).
    pub(crate) fn exclusive(&self) -> bool {
        self.exclusive
    }

    /// Give the hold back, the GIL held (`_py`): an imported tensor's owner is released
    /// directly, where dropping it would first ask whether this thread may attach.
    pub(crate) fn release(self: Box<Self>, _py: Python<'_>) {
        let raw = Box::into_raw(self);
        // SAFETY: the box's contents, live and ours alone; each field is dropped or released
        // once below, and the box is then freed as uninitialised memory.
        let held = unsafe { &mut *raw };
        match &mut held.source {
            // SAFETY: the GIL is held (`_py`); the tensor is live and never used again.
            Source::Imported(tensor) => unsafe { Tensor::release_attached_in_place(tensor) },
            // SAFETY: dropped once, here.
            Source::Object(object) => unsafe { std::ptr::drop_in_place(object) },
        }
        // SAFETY: dropped once, here.
        unsafe { std::ptr::drop_in_place(&raw mut held._borrow) };
        // SAFETY: the allocation `Box::into_raw` gave, its contents released above.
        drop(unsafe { Box::from_raw(raw.cast::<std::mem::MaybeUninit<Held>>()) });
    }
}

// -- what a view checks ------------------------------------------------------------------------

/// A `BufferError` unless the CPU reads the memory directly (the CPU's, or pinned host memory).
fn host_memory(tensor: &Tensor) -> Result<()> {
    let device = tensor.device().get()?;
    if !device.is_host() {
        return Err(Error::buffer(format!(
            "this array's memory is on {}, which Rust can't read in place; copy it to the host \
             first (e.g. .cpu() in torch, jax.device_get, .get() in CuPy)",
            device.name()
        )));
    }
    Ok(())
}

#[cold]
fn not_direct() -> Error {
    Error::buffer(
        "this buffer reaches its rows through pointers (suboffsets), so it can't be read in \
         place; to_vec() copies it",
    )
}

/// A `BufferError` if two of the elements lie in the same bytes (a broadcast view), which no
/// write can serve faithfully.
pub(super) fn check_disjoint(tensor: &Tensor) -> Result<()> {
    let layout = tensor.layout();
    let dims = layout.shape().iter().zip(layout.byte_strides());
    let overlap = self_overlap(
        dims.map(|(&n, &s)| (n as u64, s)),
        tensor.dtype().itemsize() as u64,
    );
    if overlap != SelfOverlap::Disjoint {
        return Err(Error::buffer(
            "elements of this array share memory (a broadcast view), so it can't be written \
             element by element",
        ));
    }
    Ok(())
}
