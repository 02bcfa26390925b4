//! Exporter to DLPack capsules, legacy (`"dltensor"`) and versioned (`"dltensor_versioned"`).
//!
//! Each capsule is one allocation: the managed tensor, a reference to the shared `Tensor`, and
//! the shape and strides arrays right behind them. The managed tensor's deleter frees that
//! allocation and drops the reference; the capsule's destructor calls the deleter only if no
//! consumer took the tensor (a consumer renames the capsule `"used_..."` and calls the deleter
//! itself when done).

use std::alloc::{self, Layout};
use std::ffi::{CStr, c_void};
use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::{self, NonNull};
use std::sync::Arc;

use pyo3::ffi;
use pyo3::prelude::*;

use crate::error::{Error, Result};
use crate::ffi::{
    CAPSULE_LEGACY, CAPSULE_VERSIONED, DLDevice, DLManagedTensor, DLManagedTensorVersioned,
    DLPACK_MAJOR_VERSION, DLPackVersion, DLTensor,
};
use crate::tensor::Tensor;

/// Which capsule to make.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Legacy,
    Versioned { minor: u32, flags: u64 },
}

/// The head of a capsule's single allocation; `ndim` shape entries then `ndim` strides follow.
#[repr(C)]
struct Export<M> {
    managed: M,
    tensor: ManuallyDrop<Arc<Tensor>>,
    ndim: usize,
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

/// Allocate and fill one export; `make` wraps the finished `DLTensor` in the managed struct.
fn new_export<M>(
    tensor: &Arc<Tensor>,
    device: DLDevice,
    make: impl FnOnce(DLTensor) -> M,
) -> NonNull<Export<M>> {
    let ndim = tensor.layout.ndim();
    let (layout, dims_offset) = export_layout::<M>(ndim);
    // SAFETY: the layout has non-zero size (it holds at least the managed struct).
    let base = unsafe { alloc::alloc(layout) };
    let Some(base) = NonNull::new(base) else {
        alloc::handle_alloc_error(layout)
    };
    // SAFETY: `base` is a fresh allocation of `layout`: the head fits at offset 0, the
    // 2 * ndim i64s at `dims_offset`; we write each field once before anyone reads it.
    unsafe {
        let dims = base.as_ptr().add(dims_offset).cast::<i64>();
        ptr::copy_nonoverlapping(tensor.layout.shape().as_ptr(), dims, ndim);
        // The exporter only hands out tensors DLPack can express (`copy_reason` is None).
        if let Some(strides) = tensor.layout.strides() {
            ptr::copy_nonoverlapping(strides.as_ptr(), dims.add(ndim), ndim);
        }
        let dl_tensor = DLTensor {
            data: tensor.data,
            device,
            ndim: ndim as i32,
            dtype: tensor.dtype.0,
            shape: if ndim == 0 { ptr::null_mut() } else { dims },
            strides: if ndim == 0 {
                ptr::null_mut()
            } else {
                dims.add(ndim)
            },
            byte_offset: 0,
        };
        let head = base.cast::<Export<M>>();
        head.as_ptr().write(Export {
            managed: make(dl_tensor),
            tensor: ManuallyDrop::new(Arc::clone(tensor)),
            ndim,
        });
        head
    }
}

/// Free an export made by `new_export`, dropping its reference to the tensor.
///
/// # Safety
/// `head` came from `new_export::<M>` and is freed only once.
unsafe fn free_export<M>(head: *mut Export<M>) {
    // SAFETY: per the contract, `head` is a live export; we read its fields before freeing.
    unsafe {
        let ndim = (*head).ndim;
        let tensor = ManuallyDrop::take(&mut (*head).tensor);
        alloc::dealloc(head.cast(), export_layout::<M>(ndim).0);
        // Dropping the last reference releases the source (taking the GIL if it must).
        drop(tensor);
    }
}

unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if managed.is_null() {
        return;
    }
    // A panic must not unwind into C; there is none expected here, and leaking beats aborting.
    // SAFETY: the managed tensor is the first field of an `Export` made by `new_export`, and
    // DLPack calls the deleter once.
    let _ = catch_unwind(AssertUnwindSafe(|| unsafe {
        free_export(managed.cast::<Export<DLManagedTensor>>())
    }));
}

pub unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if managed.is_null() {
        return;
    }
    // SAFETY: as in `delete_legacy`.
    let _ = catch_unwind(AssertUnwindSafe(|| unsafe {
        free_export(managed.cast::<Export<DLManagedTensorVersioned>>())
    }));
}

/// The pointer of a capsule that still has the unused `name`, or null if a consumer renamed it.
/// Our capsules keep the very `name` pointer they were made with until a consumer renames them,
/// so comparing addresses settles the common case; other addresses are compared by contents.
///
/// # Safety
/// Called with the GIL held on a live capsule.
unsafe fn unused_pointer(capsule: *mut ffi::PyObject, name: &CStr) -> *mut c_void {
    // SAFETY: per the contract; IsValid/GetName/GetPointer with the capsule's own name touch no
    // error state.
    unsafe {
        if ffi::PyCapsule_GetName(capsule) == name.as_ptr()
            || ffi::PyCapsule_IsValid(capsule, name.as_ptr()) == 1
        {
            ffi::PyCapsule_GetPointer(capsule, name.as_ptr())
        } else {
            ptr::null_mut()
        }
    }
}

/// Capsule destructor: free the export unless a consumer renamed the capsule (took it).
unsafe extern "C" fn destroy_legacy_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: Python calls this with the GIL held on a live capsule; the deleter ignores null.
    unsafe { delete_legacy(unused_pointer(capsule, CAPSULE_LEGACY).cast()) }
}

unsafe extern "C" fn destroy_versioned_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `destroy_legacy_capsule`.
    unsafe { delete_versioned(unused_pointer(capsule, CAPSULE_VERSIONED).cast()) }
}

/// A new versioned managed tensor for `tensor` on `device`, outside any capsule (the C exchange
/// API hands these out directly). Its deleter frees it.
pub fn new_versioned(
    tensor: &Arc<Tensor>,
    device: DLDevice,
    minor: u32,
    flags: u64,
) -> NonNull<DLManagedTensorVersioned> {
    let head = new_export(tensor, device, |dl_tensor| DLManagedTensorVersioned {
        version: DLPackVersion {
            major: DLPACK_MAJOR_VERSION,
            minor,
        },
        manager_ctx: ptr::null_mut(),
        deleter: Some(delete_versioned),
        flags,
        dl_tensor,
    });
    // SAFETY: the head is fully written; manager_ctx points at it for consumers.
    unsafe { (*head.as_ptr()).managed.manager_ctx = head.as_ptr().cast() };
    head.cast()
}

fn new_legacy(tensor: &Arc<Tensor>, device: DLDevice) -> NonNull<DLManagedTensor> {
    let head = new_export(tensor, device, |dl_tensor| DLManagedTensor {
        dl_tensor,
        manager_ctx: ptr::null_mut(),
        deleter: Some(delete_legacy),
    });
    // SAFETY: as above.
    unsafe { (*head.as_ptr()).managed.manager_ctx = head.as_ptr().cast() };
    head.cast()
}

/// Export `tensor` on `device` as a new capsule.
pub fn to_capsule<'py>(
    py: Python<'py>,
    tensor: &Arc<Tensor>,
    device: DLDevice,
    kind: Kind,
) -> Result<Bound<'py, PyAny>> {
    // The managed struct is the first field of its export, so its address is the export's.
    let (pointer, name, destructor, delete): (
        *mut c_void,
        &CStr,
        ffi::PyCapsule_Destructor,
        unsafe fn(*mut c_void),
    ) = match kind {
        Kind::Legacy => (
            new_legacy(tensor, device).as_ptr().cast(),
            CAPSULE_LEGACY,
            destroy_legacy_capsule,
            |p| unsafe { delete_legacy(p.cast()) },
        ),
        Kind::Versioned { minor, flags } => (
            new_versioned(tensor, device, minor, flags).as_ptr().cast(),
            CAPSULE_VERSIONED,
            destroy_versioned_capsule,
            |p| unsafe { delete_versioned(p.cast()) },
        ),
    };
    // SAFETY: `pointer` is non-null, `name` is a 'static C string, and `destructor` matches the
    // name; on failure the capsule does not exist, so we free the export ourselves.
    unsafe {
        let capsule = ffi::PyCapsule_New(pointer, name.as_ptr(), Some(destructor));
        if capsule.is_null() {
            delete(pointer);
            return Err(Error::Python(PyErr::fetch(py)));
        }
        Ok(Bound::from_owned_ptr(py, capsule))
    }
}
