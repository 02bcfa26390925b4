//! The C API other extensions reach this runtime through, as numpy's `_ARRAY_API`: a table of
//! function pointers in a capsule, `dlpack._dlpack._C_API`, so that every extension of a
//! process views memory through one importer and one registry of borrowed memory, and makes one
//! `DLPackObject` type.
//!
//! The table starts with its version and size and only ever grows, by appending: a caller built
//! against version N reads the first N's functions of any later table. Every function is called
//! with the GIL held; one that fails returns -1 (or NULL) with a Python exception set.
//! `docs/internals.md` gives the C declarations.

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub use dlpack_adapter::capi::CAPSULE_NAME;
use dlpack_adapter::capi::{
    CApi, Memory, VERSION, VIEW_C_CONTIGUOUS, VIEW_INDIRECT, VIEW_MUTABLE, VIEW_SWAPPED, View,
};
use dlpack_core::abi::DLDevice;
use dlpack_core::dtype::{DType, Element as Stored};
use dlpack_core::layout::Layout;
use pyo3::ffi::PyObject;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use super::borrows;
use super::held::{Held, check_disjoint};
use crate::copy::host;
use crate::error::{Error, Result, at_c_boundary};
use crate::ffi::python;
use crate::object::{Described, new_view, type_object};
use crate::tensor::{Owner, Tensor};

static TABLE: CApi = CApi {
    version: VERSION,
    size: size_of::<CApi>() as u32,
    view,
    release_view,
    copy_to,
    copy_from,
    from_memory,
    check_memory,
};

/// The capsule the module publishes as `_C_API`.
pub fn capsule(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
    let table: *const CApi = &TABLE;
    // SAFETY: the GIL is held; the table is static and never written, so the pointer outlives
    // the capsule; the name is static.
    let capsule = unsafe { python::capsule_new_static(table.cast_mut().cast(), CAPSULE_NAME) };
    // SAFETY: a new reference, or null with an exception set.
    let capsule = unsafe { Bound::from_owned_ptr_or_err(py, capsule)? };
    // SAFETY: `capsule_new_static` made a capsule.
    Ok(unsafe { capsule.cast_into_unchecked() })
}

/// The `Held` behind a filled view.
///
/// # Safety
/// `view` is null or a `View` that `view` filled and `release_view` has not given back.
unsafe fn held<'a>(view: *const View) -> Result<&'a Held> {
    // SAFETY: per the contract, null or a live view.
    let view =
        unsafe { view.as_ref() }.ok_or_else(|| Error::type_("the dlpack C API got a NULL view"))?;
    // SAFETY: `held` of a filled view is the `Box<Held>` `view` leaked, alive until released.
    unsafe { view.held.cast::<Held>().as_ref() }
        .ok_or_else(|| Error::value("this view was released or never filled"))
}

unsafe extern "C" fn view(obj: *mut PyObject, flags: u32, out: *mut View) -> c_int {
    // SAFETY: the table's contract: every function is called holding the GIL.
    let py = unsafe { Python::assume_attached() };
    at_c_boundary(py, -1, |py| {
        if obj.is_null() || out.is_null() {
            return Err(Error::type_("the dlpack C API's view got a NULL argument"));
        }
        // SAFETY: a caller holding the GIL passes a live object (checked not null).
        let obj = unsafe { Bound::from_borrowed_ptr(py, obj) };
        let held = Held::make(&obj, flags & VIEW_MUTABLE != 0)?;
        let tensor = held.tensor(py);
        let device = match tensor.device().get() {
            Ok(device) => device,
            Err(err) => {
                held.release(py);
                return Err(err);
            }
        };
        let layout = tensor.layout();
        let mut bits = flags & VIEW_MUTABLE;
        if tensor.swapped() {
            bits |= VIEW_SWAPPED;
        }
        if tensor.indirect() {
            bits |= VIEW_INDIRECT;
        }
        if layout.is_c_contiguous() {
            bits |= VIEW_C_CONTIGUOUS;
        }
        let filled = View {
            data: tensor.data(),
            device,
            dtype: tensor.dtype().0,
            ndim: layout.ndim() as i32,
            flags: bits,
            readonly: i32::from(tensor.readonly()),
            shape: layout.shape().as_ptr(),
            byte_strides: layout.byte_strides().as_ptr(),
            held: Box::into_raw(held).cast(),
        };
        // SAFETY: `out` is a writable `View` (the caller's, checked not null). The pointers in
        // it point into the boxed `Held`'s tensor, which stays where it is until released.
        unsafe { out.write(filled) };
        Ok(0)
    })
}

unsafe extern "C" fn release_view(view: *mut View) {
    // SAFETY: the table's contract: every function is called holding the GIL.
    let py = unsafe { Python::assume_attached() };
    at_c_boundary(py, (), |py| -> Result<()> {
        // SAFETY: the caller passes a view `view` filled, or null.
        let Some(view) = (unsafe { view.as_mut() }) else {
            return Ok(());
        };
        let held = std::mem::replace(&mut view.held, std::ptr::null_mut());
        if !held.is_null() {
            // SAFETY: the `Box<Held>` `view` leaked, given back once (the field is now null).
            unsafe { Box::from_raw(held.cast::<Held>()) }.release(py);
        }
        Ok(())
    })
}

unsafe extern "C" fn copy_to(view: *const View, dst: *mut c_void, bytes: usize) -> c_int {
    // SAFETY: the table's contract: every function is called holding the GIL.
    let py = unsafe { Python::assume_attached() };
    at_c_boundary(py, -1, |py| {
        // SAFETY: per `copy_to`'s contract, a filled view or null.
        let tensor = unsafe { held(view) }?.tensor(py);
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

unsafe extern "C" fn copy_from(view: *const View, src: *const c_void, bytes: usize) -> c_int {
    // SAFETY: the table's contract: every function is called holding the GIL.
    let py = unsafe { Python::assume_attached() };
    at_c_boundary(py, -1, |py| {
        // SAFETY: per `copy_from`'s contract, a filled view or null.
        let held = unsafe { held(view) }?;
        if !held.exclusive() {
            return Err(Error::buffer(
                "copy_from writes: the view must be mutable (VIEW_MUTABLE)",
            ));
        }
        let tensor = held.tensor(py);
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

unsafe extern "C" fn from_memory(memory: *const Memory) -> *mut PyObject {
    // SAFETY: the table's contract: every function is called holding the GIL.
    let py = unsafe { Python::assume_attached() };
    at_c_boundary(py, std::ptr::null_mut(), |py| {
        // SAFETY: the caller passes a readable `Memory` or null.
        let memory = unsafe { memory.as_ref() }
            .ok_or_else(|| Error::type_("the dlpack C API's from_memory got NULL"))?;
        let ndim = usize::try_from(memory.ndim)
            .map_err(|_| Error::value(format!("ndim {} is negative", memory.ndim)))?;
        let dims = |ptr: *const i64, what: &str| -> Result<&[i64]> {
            if ndim == 0 {
                return Ok(&[]);
            }
            if ptr.is_null() {
                return Err(Error::type_(format!("from_memory's {what} is NULL")));
            }
            // SAFETY: the caller's `ndim` values at a non-null pointer, as `Memory` asks.
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
            readonly: memory.readonly != 0,
        };
        let release = Arc::new(Release {
            release: memory.release,
            context: memory.context,
            disarmed: AtomicBool::new(false),
        });
        let owner = Owner::Held(release.clone());
        // SAFETY: the caller vouches, as `Memory` asks, that `data` and the layout address host
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
