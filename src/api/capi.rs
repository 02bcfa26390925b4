//! The C API other extensions reach this runtime through, as numpy's `_ARRAY_API`: a table of
//! function pointers in a capsule, `dlpack._dlpack._C_API`, so that every extension of a
//! process views memory through one importer and one registry of borrowed memory, and makes one
//! `DLPackObject` type.
//!
//! The table's versions, as numpy's: an ABI version changed only by a breaking change, and a
//! feature level raised when functions or fields are appended; views and memory descriptions
//! carry the size their caller declared them with, and the runtime writes and reads no byte past
//! it. Every function is called with the GIL held (on a free-threaded CPython: attached, while
//! other threads call too; what they share is locked, see `crate::ffi::python`); one that fails
//! returns -1 (or NULL) with a Python exception set. The declarations are
//! `dlpack_adapter::capi`'s, from which the C header `dlpack_adapter.h` is generated.

use std::ffi::{c_int, c_void};
use std::mem::{MaybeUninit, offset_of};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub use dlpack_adapter::capi::DLPACK_ADAPTER_CAPSULE_NAME;
use dlpack_adapter::capi::{
    DLPACK_ADAPTER_ABI_VERSION, DLPACK_ADAPTER_FEATURE_VERSION, DLPACK_ADAPTER_MEMORY_READONLY,
    DLPACK_ADAPTER_VIEW_C_CONTIGUOUS, DLPACK_ADAPTER_VIEW_INDIRECT, DLPACK_ADAPTER_VIEW_MUTABLE,
    DLPACK_ADAPTER_VIEW_READONLY, DLPACK_ADAPTER_VIEW_REQUESTS, DLPACK_ADAPTER_VIEW_SWAPPED,
    DLPackAdapterAPI, DLPackAdapterMemory, DLPackAdapterView, MEMORY_SIZE_1, VIEW_SIZE_1,
};
use dlpack_core::abi::DLDevice;
use dlpack_core::dtype::{DType, StoredType as Stored};
use dlpack_core::layout::Layout;
use pyo3::ffi::PyObject;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use super::borrows;
use super::lease::{Lease, check_disjoint};
use crate::copy::host;
use crate::error::{Error, Result, at_c_boundary};
use crate::ffi::python;
use crate::object::{Described, new_view, type_object};
use crate::tensor::{Owner, Tensor};

static TABLE: DLPackAdapterAPI = DLPackAdapterAPI {
    abi_version: DLPACK_ADAPTER_ABI_VERSION,
    feature_version: DLPACK_ADAPTER_FEATURE_VERSION,
    size: size_of::<DLPackAdapterAPI>() as u32,
    reserved: 0,
    view,
    release_view,
    copy_to,
    copy_from,
    from_memory,
    check_memory,
};

/// The capsule the module publishes as `_C_API`.
pub fn capsule(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
    let table: *const DLPackAdapterAPI = &TABLE;
    // SAFETY: the GIL is held; the table is static and never written, so the pointer outlives
    // the capsule; the name is static.
    let capsule =
        unsafe { python::capsule_new_static(table.cast_mut().cast(), DLPACK_ADAPTER_CAPSULE_NAME) };
    // SAFETY: a new reference, or null with an exception set.
    let capsule = unsafe { Bound::from_owned_ptr_or_err(py, capsule)? };
    // SAFETY: `capsule_new_static` made a capsule.
    Ok(unsafe { capsule.cast_into_unchecked() })
}

/// The field at `offset` bytes into the struct at `base`, as a raw pointer: nothing is read,
/// nor any reference made over a struct the caller may have declared shorter than this
/// runtime's.
fn field<F>(base: *const impl Sized, offset: usize) -> *const F {
    base.cast::<u8>().wrapping_add(offset).cast::<F>()
}

/// The size the caller declared its view with, once it holds the fields of feature level 1
/// (all this runtime reads and writes): a `ValueError` otherwise, before anything past `size`
/// is touched.
///
/// # Safety
/// `view` is readable for its `size` field (every view's first).
unsafe fn view_size(view: *const DLPackAdapterView) -> Result<usize> {
    // SAFETY: the first field, readable (the contract); read through the raw pointer, as the
    // caller's struct may be shorter than this runtime's.
    let size = unsafe { field::<u32>(view, offset_of!(DLPackAdapterView, size)).read_unaligned() };
    let size = size as usize;
    if size < VIEW_SIZE_1 {
        return Err(short_view(size));
    }
    Ok(size)
}

/// `view_size`'s error, out of the way of every view's path.
#[cold]
#[inline(never)]
fn short_view(size: usize) -> Error {
    Error::value(format!(
        "the dlpack C API got a view whose size says {size} bytes, short of the {VIEW_SIZE_1} of \
         a view's fields (prepare it with DLPACK_ADAPTER_VIEW_INIT)"
    ))
}

/// `view`'s error for flag bits it doesn't take, out of the way of every view's path.
#[cold]
#[inline(never)]
fn unknown_view_flags(flags: u32) -> Error {
    let unknown = flags & !DLPACK_ADAPTER_VIEW_REQUESTS;
    Error::value(format!(
        "the dlpack C API's view got flags {flags:#x}: bits {unknown:#x} are none it takes (at \
         feature level {DLPACK_ADAPTER_FEATURE_VERSION} only DLPACK_ADAPTER_VIEW_MUTABLE, \
         {DLPACK_ADAPTER_VIEW_MUTABLE:#x})"
    ))
}

/// The `Lease` behind a filled view.
///
/// # Safety
/// `view` is null or a view that `view` filled and `release_view` has not given back (or gave
/// back, its `held` now null).
unsafe fn lease<'a>(view: *const DLPackAdapterView) -> Result<&'a Lease> {
    if view.is_null() {
        return Err(Error::type_("the dlpack C API got a NULL view"));
    }
    // SAFETY: a live view (the contract, checked not null).
    unsafe { view_size(view) }?;
    // SAFETY: a field of feature level 1, within the view's size (checked).
    let held =
        unsafe { field::<*mut c_void>(view, offset_of!(DLPackAdapterView, held)).read_unaligned() };
    // SAFETY: `held` of a filled view is the `Box<Lease>` `view` leaked, alive until released.
    unsafe { held.cast::<Lease>().as_ref() }
        .ok_or_else(|| Error::value("this view was released or never filled"))
}

unsafe extern "C" fn view(obj: *mut PyObject, flags: u32, out: *mut DLPackAdapterView) -> c_int {
    // SAFETY: the table's contract: every function is called holding the GIL.
    let py = unsafe { Python::assume_attached() };
    at_c_boundary(py, -1, |py| {
        if obj.is_null() || out.is_null() {
            return Err(Error::type_("the dlpack C API's view got a NULL argument"));
        }
        // SAFETY: `out` is the caller's view (checked not null), readable for its size.
        let size = unsafe { view_size(out) }?;
        if flags & !DLPACK_ADAPTER_VIEW_REQUESTS != 0 {
            return Err(unknown_view_flags(flags));
        }
        // SAFETY: a caller holding the GIL passes a live object (checked not null).
        let obj = unsafe { Bound::from_borrowed_ptr(py, obj) };
        let lease = Lease::make(&obj, flags & DLPACK_ADAPTER_VIEW_MUTABLE != 0)?;
        let tensor = lease.tensor(py);
        let device = match tensor.device().get() {
            Ok(device) => device,
            Err(err) => {
                lease.release(py);
                return Err(err);
            }
        };
        let layout = tensor.layout();
        let mut bits = flags & DLPACK_ADAPTER_VIEW_MUTABLE;
        if tensor.swapped() {
            bits |= DLPACK_ADAPTER_VIEW_SWAPPED;
        }
        if tensor.indirect() {
            bits |= DLPACK_ADAPTER_VIEW_INDIRECT;
        }
        if layout.is_c_contiguous() {
            bits |= DLPACK_ADAPTER_VIEW_C_CONTIGUOUS;
        }
        if tensor.readonly() {
            bits |= DLPACK_ADAPTER_VIEW_READONLY;
        }
        let filled = DLPackAdapterView {
            size: size as u32,
            flags: bits,
            data: tensor.data(),
            device,
            dtype: tensor.dtype().0,
            ndim: layout.ndim() as i32,
            shape: layout.shape().as_ptr(),
            byte_strides: layout.byte_strides().as_ptr(),
            held: Box::into_raw(lease).cast(),
        };
        // Every field this runtime knows is of feature level 1, which the caller's size holds
        // (checked): the whole struct, in one store of a known size. A field appended at a
        // later level must be written only where the caller's size holds it, which this
        // assertion makes the one who appends see.
        const _: () = assert!(VIEW_SIZE_1 == size_of::<DLPackAdapterView>());
        // SAFETY: `out` is writable for the caller's `size` bytes, at least the struct's (the
        // assertion above, and `view_size`). The pointers in it point into the boxed `Lease`'s
        // tensor, which stays where it is until released.
        unsafe { out.write_unaligned(filled) };
        Ok(0)
    })
}

unsafe extern "C" fn release_view(view: *mut DLPackAdapterView) {
    // SAFETY: the table's contract: every function is called holding the GIL.
    let py = unsafe { Python::assume_attached() };
    at_c_boundary(py, (), |py| -> Result<()> {
        if view.is_null() {
            return Ok(());
        }
        // SAFETY: the caller passes a view `view` filled (checked not null).
        unsafe { view_size(view) }?;
        let field = field::<*mut c_void>(view, offset_of!(DLPackAdapterView, held)).cast_mut();
        // SAFETY: a field of feature level 1, within the view's size (checked), readable (the
        // caller's view).
        let held = unsafe { field.read_unaligned() };
        // SAFETY: the same field, writable (the caller's view).
        unsafe { field.write_unaligned(std::ptr::null_mut()) };
        if !held.is_null() {
            // SAFETY: the `Box<Lease>` `view` leaked, given back once (the field is now null).
            unsafe { Box::from_raw(held.cast::<Lease>()) }.release(py);
        }
        Ok(())
    })
}

unsafe extern "C" fn copy_to(
    view: *const DLPackAdapterView,
    dst: *mut c_void,
    bytes: usize,
) -> c_int {
    // SAFETY: the table's contract: every function is called holding the GIL.
    let py = unsafe { Python::assume_attached() };
    at_c_boundary(py, -1, |py| {
        // SAFETY: per `copy_to`'s contract, a filled view or null.
        let tensor = unsafe { lease(view) }?.tensor(py);
        exact_size(tensor, bytes)?;
        if dst.is_null() && bytes > 0 {
            return Err(Error::type_(
                "the dlpack C API's copy_to got a NULL destination",
            ));
        }
        // SAFETY: the caller's `dst` is writable for `bytes` bytes (the elements' size,
        // checked), as `copy_to` asks of it; it may overlap the view's memory.
        unsafe { host::write_c_order(py, tensor, dst.cast(), bytes) }?;
        Ok(0)
    })
}

unsafe extern "C" fn copy_from(
    view: *const DLPackAdapterView,
    src: *const c_void,
    bytes: usize,
) -> c_int {
    // SAFETY: the table's contract: every function is called holding the GIL.
    let py = unsafe { Python::assume_attached() };
    at_c_boundary(py, -1, |py| {
        // SAFETY: per `copy_from`'s contract, a filled view or null.
        let lease = unsafe { lease(view) }?;
        if !lease.exclusive() {
            return Err(Error::buffer(
                "copy_from writes: the view must be mutable (VIEW_MUTABLE)",
            ));
        }
        let tensor = lease.tensor(py);
        exact_size(tensor, bytes)?;
        check_disjoint(tensor)?;
        if src.is_null() && bytes > 0 {
            return Err(Error::type_(
                "the dlpack C API's copy_from got a NULL source",
            ));
        }
        // SAFETY: the caller's `src` is readable for `bytes` bytes (the elements' size,
        // checked), and may overlap the view's memory; the view holds its writable host memory
        // alone (exclusive borrow: no other view reads or writes it), whose elements share no
        // bytes (checked).
        unsafe { host::read_c_order(py, tensor, src.cast(), bytes) }?;
        Ok(0)
    })
}

/// A `ValueError` unless `bytes` is exactly the size of the tensor's elements, counted without
/// wrapping (a broadcast view may describe more bytes than a `size_t` holds).
fn exact_size(tensor: &Tensor, bytes: usize) -> Result<()> {
    let elements = u128::try_from(tensor.numel()).unwrap_or(0);
    let needed = elements * tensor.dtype().itemsize() as u128;
    if needed != bytes as u128 {
        return Err(Error::value(format!(
            "the view's elements take {needed} bytes, the buffer given {bytes}"
        )));
    }
    Ok(())
}

/// A caller's release callback, run once when the last holder of the memory lets go (unless
/// disarmed: the object was never made, and the memory stays the caller's).
struct Release {
    release: Option<unsafe extern "C" fn(*mut c_void)>,
    context: *mut c_void,
    disarmed: AtomicBool,
}

// SAFETY: the C API's contract makes `release` callable on any thread with its `context`.
unsafe impl Send for Release {}
// SAFETY: shared access reads nothing; only `drop` uses the fields.
unsafe impl Sync for Release {}

impl Drop for Release {
    fn drop(&mut self) {
        if let Some(release) = self
            .release
            .filter(|_| !self.disarmed.load(Ordering::Acquire))
        {
            // SAFETY: the caller's callback, called once (this value is dropped once) with its
            // context, as `from_memory`'s contract allows on any thread.
            unsafe { release(self.context) };
        }
    }
}

/// The caller's memory description: the bytes its `size` covers, of the fields this runtime
/// knows, the rest zero; a `ValueError` for a size short of the fields of feature level 1 or an
/// unknown flag, before anything else is read.
///
/// # Safety
/// `memory` is null or readable for its declared `size`.
unsafe fn memory_fields(memory: *const DLPackAdapterMemory) -> Result<DLPackAdapterMemory> {
    if memory.is_null() {
        return Err(Error::type_("the dlpack C API's from_memory got NULL"));
    }
    // SAFETY: the first field, readable (the contract, checked not null); read through the raw
    // pointer, as the caller's struct may be shorter than this runtime's.
    let size =
        unsafe { field::<u32>(memory, offset_of!(DLPackAdapterMemory, size)).read_unaligned() };
    let size = size as usize;
    if size < MEMORY_SIZE_1 {
        return Err(Error::value(format!(
            "from_memory got a memory description whose size says {size} bytes, short of the \
             {MEMORY_SIZE_1} of its fields (prepare it with DLPACK_ADAPTER_MEMORY_INIT)"
        )));
    }
    let mut fields = MaybeUninit::<DLPackAdapterMemory>::zeroed();
    // SAFETY: `memory` is readable for `size` bytes (the contract), of which this reads the
    // fields this runtime knows into a local of that type.
    unsafe {
        std::ptr::copy_nonoverlapping(
            memory.cast::<u8>(),
            fields.as_mut_ptr().cast::<u8>(),
            size.min(size_of::<DLPackAdapterMemory>()),
        )
    };
    // SAFETY: every byte is the caller's or zero, and any bytes are a valid
    // `DLPackAdapterMemory` (integers, raw pointers, a nullable function pointer).
    let fields = unsafe { fields.assume_init() };
    let unknown = fields.flags & !DLPACK_ADAPTER_MEMORY_READONLY;
    if unknown != 0 {
        return Err(Error::value(format!(
            "from_memory got flags {:#x}: bits {unknown:#x} are none it takes (at feature level \
             {DLPACK_ADAPTER_FEATURE_VERSION} only DLPACK_ADAPTER_MEMORY_READONLY, \
             {DLPACK_ADAPTER_MEMORY_READONLY:#x})",
            fields.flags
        )));
    }
    Ok(fields)
}

unsafe extern "C" fn from_memory(memory: *const DLPackAdapterMemory) -> *mut PyObject {
    // SAFETY: the table's contract: every function is called holding the GIL.
    let py = unsafe { Python::assume_attached() };
    at_c_boundary(py, std::ptr::null_mut(), |py| {
        // SAFETY: the caller passes a description readable for its size, or null.
        let memory = unsafe { memory_fields(memory) }?;
        let ndim = usize::try_from(memory.ndim)
            .map_err(|_| Error::value(format!("ndim {} is negative", memory.ndim)))?;
        let dims = |ptr: *const i64, what: &str| -> Result<&[i64]> {
            if ndim == 0 {
                return Ok(&[]);
            }
            if ptr.is_null() {
                return Err(Error::type_(format!("from_memory's {what} is NULL")));
            }
            // SAFETY: the caller's `ndim` values at a non-null pointer, as `DLPackAdapterMemory` asks.
            Ok(unsafe { std::slice::from_raw_parts(ptr, ndim) })
        };
        let shape = dims(memory.shape, "shape")?;
        let dtype = DType::from_dlpack(memory.dtype)?;
        let strides = if memory.byte_strides.is_null() {
            None
        } else {
            Some(dims(memory.byte_strides, "byte_strides")?)
        };
        let layout = Layout::from_byte_strides(shape, strides, dtype.itemsize())?;
        // Addresses no memory could have are refused here, before any view compares them.
        borrows::span(memory.data, &layout, dtype.itemsize())?;
        type_object(py)?;
        let described = Described {
            data: memory.data,
            device: DLDevice::CPU,
            element: Stored {
                dtype,
                swapped: false,
            },
            layout,
            readonly: memory.flags & DLPACK_ADAPTER_MEMORY_READONLY != 0,
        };
        let release = Arc::new(Release {
            release: memory.release,
            context: memory.context,
            disarmed: AtomicBool::new(false),
        });
        let owner = Owner::RustValue(release.clone());
        // SAFETY: the caller vouches, as `DLPackAdapterMemory` asks, that `data` and the layout address host
        // memory of `dtype`'s elements in native order, writable unless `readonly`, alive until
        // `release` runs (when the owner goes).
        match unsafe { new_view(py, owner, described) } {
            Ok(object) => Ok(object.into_ptr()),
            Err(err) => {
                // No object holds the memory: it stays the caller's, unreleased.
                release.disarmed.store(true, Ordering::Release);
                Err(err)
            }
        }
    })
}

unsafe extern "C" fn check_memory(bytes: u64) -> c_int {
    // SAFETY: the table's contract: every function is called holding the GIL.
    let py = unsafe { Python::assume_attached() };
    at_c_boundary(py, -1, |_py| -> Result<c_int> {
        dlpack_core::available::check(bytes, "memory")?;
        Ok(0)
    })
}
