//! Exporter to DLPack capsules, legacy (`"dltensor"`) and versioned (`"dltensor_versioned"`).
//!
//! Each capsule is one allocation: the managed tensor, a reference to what keeps its memory alive
//! (the Python object holding the tensor, or a tensor of its own), and the shape and strides arrays
//! right behind them. The managed tensor's deleter frees that allocation and drops the
//! reference; the capsule's destructor calls the deleter only if no consumer took the tensor (a
//! consumer renames the capsule `"used_..."` and calls the deleter itself when done).

use std::alloc::{self, Layout};
use std::ffi::{CStr, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::{self, NonNull};
use std::sync::Arc;

use pyo3::prelude::*;

use crate::error::{Error, Result};
use crate::ffi::python::{self, GilState, PyObject};
use crate::ffi::{CAPSULE_LEGACY, CAPSULE_VERSIONED};
use crate::tensor::{Exportable, Tensor};
use dlpack_core::abi::DLDevice;
use dlpack_core::abi::DLManagedTensor;
use dlpack_core::abi::DLManagedTensorVersioned;
use dlpack_core::abi::DLPACK_MAJOR_VERSION;
use dlpack_core::abi::DLPackVersion;
use dlpack_core::abi::DLTensor;

/// Which capsule to make.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Legacy,
    Versioned { minor: u32, flags: u64 },
}

/// The tensor an export describes, and what keeps its memory alive for as long as the export
/// lives.
pub enum Described<'a> {
    /// A tensor a Python object (a `DLPackObject`) lends, made by `Described::lent`.
    Lent(Lent<'a>),
    /// A tensor of the export's own: a copy, or a fresh export from the producer.
    Own(Arc<Tensor>),
}

/// A tensor and the Python object that keeps it alive and unchanged, of which the export keeps
/// a strong reference; made while attached to Python (the export is then allocated and freed
/// under the GIL, see `new_export`).
pub struct Lent<'a> {
    holder: Py<PyAny>,
    tensor: &'a Tensor,
    _attached: Python<'a>,
}

impl<'a> Described<'a> {
    /// `tensor`, kept alive by a reference to `holder`.
    ///
    /// # Safety
    /// `holder` keeps `tensor` alive and unchanged for as long as it lives.
    pub unsafe fn lent(py: Python<'a>, holder: Py<PyAny>, tensor: &'a Tensor) -> Self {
        Described::Lent(Lent {
            holder,
            tensor,
            _attached: py,
        })
    }

    fn tensor(&self) -> &Tensor {
        match self {
            Described::Lent(lent) => lent.tensor,
            Described::Own(tensor) => tensor,
        }
    }

    /// What keeps the memory alive, as an address, and whether it is a Python object (for the
    /// export's head).
    fn into_raw(self) -> (*const c_void, bool) {
        match self {
            Described::Lent(lent) => (lent.holder.into_ptr().cast_const().cast(), true),
            Described::Own(tensor) => (Arc::into_raw(tensor).cast(), false),
        }
    }
}

/// The head of a capsule's single allocation; `ndim` shape entries then `ndim` strides follow.
#[repr(C)]
struct Export<M> {
    managed: M,
    /// What keeps the memory alive, as `Described::into_raw` gave it.
    holder: *const c_void,
    ndim: u32,
    holder_is_object: bool,
}

fn export_layout<M>(ndim: usize) -> (Layout, usize) {
    let dims = Layout::array::<i64>(2 * ndim).expect("ndim is at most 64");
    let (layout, dims_offset) = Layout::new::<Export<M>>()
        .extend(dims)
        .expect("small layout");
    (layout, dims_offset)
}

/// Bytes of one capsule's allocation for a tensor of `ndim` dimensions (legacy or versioned).
pub fn export_bytes(ndim: usize, versioned: bool) -> usize {
    if versioned {
        export_layout::<DLManagedTensorVersioned>(ndim).0.size()
    } else {
        export_layout::<DLManagedTensor>(ndim).0.size()
    }
}

/// Allocate and fill one export of the described tensor; `make` wraps the finished `DLTensor`
/// in the managed struct. Fails for a tensor DLPack can't describe as it is (the export policy
/// copies those first).
fn new_export<M>(
    described: Described<'_>,
    device: DLDevice,
    make: impl FnOnce(DLTensor) -> M,
) -> Result<NonNull<Export<M>>> {
    let tensor = described.tensor().exportable().map_err(Error::buffer)?;
    let ndim = tensor.shape.len();
    let (layout, dims_offset) = export_layout::<M>(ndim);
    let lent = matches!(described, Described::Lent(_));
    // An export held by an object is only made and freed under the GIL (see `free_export`), so
    // it can come from Python's small-object allocator, cheaper than the C heap's.
    // The layout has non-zero size (it holds at least the managed struct).
    let base = if lent {
        // SAFETY: a lent tensor was made attached (`Lent` carries the token) and lives no
        // longer, so the GIL is held; Python's allocator aligns to 16 bytes, more than the
        // layout needs.
        unsafe { python::mem_alloc(layout.size()) }
    } else {
        // SAFETY: a layout of non-zero size.
        unsafe { alloc::alloc(layout) }
    };
    let Some(base) = NonNull::new(base) else {
        alloc::handle_alloc_error(layout)
    };
    // `base` is a fresh allocation of `layout`: the head fits at offset 0, the 2 * ndim i64s
    // at `dims_offset`; each is written once before anyone reads it.
    let shape = base.as_ptr().wrapping_add(dims_offset).cast::<i64>();
    let strides = shape.wrapping_add(ndim);
    // SAFETY: the first `ndim` of the 2 * ndim i64s `layout` holds at `dims_offset`, in our
    // fresh allocation; the tensor's shape has `ndim` entries.
    unsafe { ptr::copy_nonoverlapping(tensor.shape.as_ptr(), shape, ndim) };
    // SAFETY: the last `ndim` of the 2 * ndim i64s `layout` holds at `dims_offset`, in our
    // fresh allocation; the tensor's strides have one per dimension, `ndim`.
    unsafe { ptr::copy_nonoverlapping(tensor.strides.as_ptr(), strides, ndim) };
    let dl_tensor = dl_tensor(tensor, device, shape, strides);
    let (holder, holder_is_object) = described.into_raw();
    let head = base.cast::<Export<M>>();
    let export = Export {
        managed: make(dl_tensor),
        holder,
        ndim: ndim as u32, // at most MAX_NDIM
        holder_is_object,
    };
    // SAFETY: the head at offset 0 of our fresh allocation of `layout`, which starts with an
    // `Export<M>` and is aligned for it.
    unsafe { head.as_ptr().write(export) };
    Ok(head)
}

/// The `DLTensor` of `tensor` on `device`, whose shape and strides (`ndim` each) are at `shape`
/// and `strides` (null for a 0-d tensor, as DLPack allows).
pub fn dl_tensor(
    tensor: Exportable<'_>,
    device: DLDevice,
    shape: *mut i64,
    strides: *mut i64,
) -> DLTensor {
    let scalar = tensor.shape.is_empty();
    DLTensor {
        data: tensor.data,
        device,
        ndim: tensor.shape.len() as i32, // at most MAX_NDIM
        dtype: tensor.dtype.0,
        shape: if scalar { ptr::null_mut() } else { shape },
        strides: if scalar { ptr::null_mut() } else { strides },
        byte_offset: 0,
    }
}

/// Free an export made by `new_export`, releasing its holder. One held by an object came from
/// Python's allocator: it is freed, and the object released, while attached to Python: directly
/// when the caller holds the GIL (`attached`: a capsule destructor), otherwise under `GilState`
/// (a consumer's deleter, on any thread). Once the interpreter is gone both are left to the
/// process' exit, as `Owner` does. A copy's export needs no Python at all.
///
/// # Safety
/// `head` came from `new_export::<M>` and is freed only once; `attached` only when this thread
/// holds the GIL.
unsafe fn free_export<M>(head: *mut Export<M>, attached: bool) {
    // SAFETY: per the contract, `head` is a live export; its fields are read before it is
    // freed.
    let Export {
        holder,
        ndim,
        holder_is_object,
        ..
    } = unsafe { &*head };
    let (holder, ndim, holder_is_object) = (*holder, *ndim, *holder_is_object);
    if !holder_is_object {
        // SAFETY: a tensor's export came from `alloc::alloc` with this layout, freed once.
        unsafe { alloc::dealloc(head.cast(), export_layout::<M>(ndim as usize).0) };
        // SAFETY: a tensor holder came from `Arc::into_raw`, and is released once.
        drop(unsafe { Arc::from_raw(holder.cast::<Tensor>()) });
        return;
    }
    // An object's export came from Python's allocator; its holder is our strong reference to a
    // live object. Both go while this thread holds the GIL (`attached`, or the `GilState`
    // below); the decref may run the object's deallocator, which releases the source.
    let release = || {
        // SAFETY: an object's export came from `python::mem_alloc` (`new_export`), freed once
        // (this function's contract); `release` runs only while this thread holds the GIL.
        unsafe { python::mem_free(head.cast()) };
        // SAFETY: `holder` is our strong reference to a live object, given up once (the export
        // is freed once); `release` runs only while this thread holds the GIL.
        unsafe { python::decref(holder.cast_mut().cast()) };
    };
    if attached {
        release();
    } else if python::interpreter_alive() {
        // SAFETY: the interpreter is alive (checked just above).
        let _gil = unsafe { GilState::ensure() };
        release();
    }
}

/// Free the export behind a managed tensor (null: nothing to do).
///
/// # Safety
/// A non-null `managed` is the first field of an `Export<M>` made by `new_export`, freed once;
/// `attached` only when this thread holds the GIL.
unsafe fn delete<M>(managed: *mut M, attached: bool) {
    if managed.is_null() {
        return;
    }
    // A panic must not unwind into C; there is none expected here, and leaking beats aborting.
    // SAFETY: a non-null `managed` heads (is the first field of) an `Export<M>` from
    // `new_export`, freed once, `attached` only under the GIL (this function's contract).
    let _ = catch_unwind(AssertUnwindSafe(|| unsafe {
        free_export(managed.cast::<Export<M>>(), attached)
    }));
}

/// The legacy managed tensor's deleter: consumers call it on any thread, with or without the GIL.
unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    // SAFETY: DLPack calls the deleter once, on the managed tensor we made.
    unsafe { delete(managed, false) }
}

pub unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    // SAFETY: DLPack calls the deleter once, on the managed tensor we made; not attached.
    unsafe { delete(managed, false) }
}

/// The pointer of a capsule that still has the unused `name`, or null if a consumer renamed it.
/// Our capsules keep the very `name` pointer they were made with until a consumer renames them,
/// so comparing addresses settles the common case; other addresses are compared by contents.
///
/// # Safety
/// Called with the GIL held on a live capsule.
unsafe fn unused_pointer(capsule: *mut PyObject, name: &CStr) -> *mut c_void {
    // IsValid/GetName/GetPointer with the capsule's own name touch no error state.
    // SAFETY: `capsule` is a live capsule and this thread holds the GIL (this function's
    // contract).
    let same_name = unsafe { python::capsule_name(capsule) } == name.as_ptr();
    // SAFETY: `capsule` is live and the GIL held (this function's contract); `name` is a C
    // string.
    if same_name || unsafe { python::capsule_is_valid(capsule, name.as_ptr()) } {
        // SAFETY: `capsule` is live and the GIL held (this function's contract); `name` is a C
        // string, the capsule's own name here.
        unsafe { python::capsule_pointer(capsule, name.as_ptr()) }
    } else {
        ptr::null_mut()
    }
}

/// Capsule destructor: free the export unless a consumer renamed the capsule (took it).
unsafe extern "C" fn destroy_legacy_capsule(capsule: *mut PyObject) {
    // SAFETY: Python calls this with the GIL held on a live capsule.
    let managed = unsafe { unused_pointer(capsule, CAPSULE_LEGACY) };
    // SAFETY: an unused capsule still owns its export; the GIL is held.
    unsafe { delete::<DLManagedTensor>(managed.cast(), true) }
}

unsafe extern "C" fn destroy_versioned_capsule(capsule: *mut PyObject) {
    // SAFETY: Python calls this with the GIL held on a live capsule.
    let managed = unsafe { unused_pointer(capsule, CAPSULE_VERSIONED) };
    // SAFETY: an unused capsule still owns its export; the GIL is held.
    unsafe { delete::<DLManagedTensorVersioned>(managed.cast(), true) }
}

/// A new versioned managed tensor of the described tensor on `device`, outside any capsule (the C
/// exchange API hands these out directly). Its deleter frees it.
pub fn new_versioned(
    described: Described<'_>,
    device: DLDevice,
    minor: u32,
    flags: u64,
) -> Result<NonNull<DLManagedTensorVersioned>> {
    let head = new_export(described, device, |dl_tensor| DLManagedTensorVersioned {
        version: DLPackVersion {
            major: DLPACK_MAJOR_VERSION,
            minor,
        },
        manager_ctx: ptr::null_mut(),
        deleter: Some(delete_versioned),
        flags,
        dl_tensor,
    })?;
    // SAFETY: the head is fully written; manager_ctx points at it for consumers.
    unsafe { (*head.as_ptr()).managed.manager_ctx = head.as_ptr().cast() };
    Ok(head.cast())
}

fn new_legacy(described: Described<'_>, device: DLDevice) -> Result<NonNull<DLManagedTensor>> {
    let head = new_export(described, device, |dl_tensor| DLManagedTensor {
        dl_tensor,
        manager_ctx: ptr::null_mut(),
        deleter: Some(delete_legacy),
    })?;
    // SAFETY: `head` is the export `new_export` just wrote whole, ours alone; manager_ctx points
    // at it for consumers.
    unsafe { (*head.as_ptr()).managed.manager_ctx = head.as_ptr().cast() };
    Ok(head.cast())
}

/// Export the described tensor on `device` as a new capsule.
pub fn to_capsule<'py>(
    py: Python<'py>,
    described: Described<'_>,
    device: DLDevice,
    kind: Kind,
) -> Result<Bound<'py, PyAny>> {
    // The managed struct is the first field of its export, so its address is the export's.
    let (pointer, name, destructor, delete): (
        *mut c_void,
        &CStr,
        python::CapsuleDestructor,
        unsafe fn(*mut c_void),
    ) = match kind {
        Kind::Legacy => (
            new_legacy(described, device)?.as_ptr().cast(),
            CAPSULE_LEGACY,
            destroy_legacy_capsule,
            // SAFETY: called only where `capsule_new` fails, on this export, once, holding the
            // GIL (`py`).
            |p| unsafe { delete::<DLManagedTensor>(p.cast(), true) },
        ),
        Kind::Versioned { minor, flags } => (
            new_versioned(described, device, minor, flags)?
                .as_ptr()
                .cast(),
            CAPSULE_VERSIONED,
            destroy_versioned_capsule,
            // SAFETY: called only where `capsule_new` fails, on this export, once, holding the
            // GIL (`py`).
            |p| unsafe { delete::<DLManagedTensorVersioned>(p.cast(), true) },
        ),
    };
    // SAFETY: we hold the GIL (`py`); `pointer` is non-null, `name` is a 'static C string, and
    // `destructor` matches the name.
    let capsule = unsafe { python::capsule_new(pointer, name, destructor) };
    if capsule.is_null() {
        // The capsule does not exist, so we free the export ourselves, after taking the error
        // (the release may run Python code).
        let err = PyErr::fetch(py);
        // SAFETY: the export is ours alone, freed once, holding the GIL.
        unsafe { delete(pointer) };
        return Err(Error::Python(err));
    }
    // SAFETY: a new reference to a live capsule.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
}
