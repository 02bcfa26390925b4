//! rust-numpy's borrow flags, taken beside the registry's (`borrows`) while a view holds a
//! numpy array's memory, so that neither crate hands out a `&mut` over memory the other lends.
//!
//! rust-numpy keeps its borrows in a table of functions published in numpy's module
//! (`numpy._core.multiarray`, or `numpy.core.multiarray` under numpy 1), as the capsule
//! `_RUST_NUMPY_BORROW_CHECKING_API`: whichever extension borrows first installs it, every later
//! one uses it. Its version 1 is `SharedV1`. A borrow there is keyed on the numpy object that
//! owns the memory (the end of the array's chain of bases) and on the array's address range,
//! first element and strides' common divisor.
//!
//! - **Installed by rust-numpy's own code.** When no extension has installed the table yet, the
//!   runtime has its copy of rust-numpy (the `numpy` crate) install it, by a borrow of an empty
//!   array: a view taken before any rust-numpy borrow must still be in the table that later
//!   borrow consults, and rust-numpy's code is the implementation every extension expects.
//! - **A private array stands for the view's memory.** What is acquired is a new 1-d `uint8`
//!   array over exactly the bytes the view spans, whose base is the viewed numpy array (so its
//!   chain ends at the same owner), private to the view: rust-numpy recomputes the key from the
//!   array it is given at release, so the array must not change meanwhile (Python code may
//!   reshape the viewed array in place, `a.shape = ...`, and a key that is no longer in the
//!   table aborts the process inside rust-numpy). Its bytes' stride of 1 makes rust-numpy's
//!   conflict test that of the registry: any overlap of address ranges (rust-numpy's own test,
//!   whether the two arrays' first elements differ by a multiple of their strides' common
//!   divisor, would let a reinterpreted view at an odd byte offset alias).
//! - **Only memory a numpy array owns.** The flags are taken for a view of a numpy array (any
//!   subclass), or of an object whose imported memory a numpy array holds (a `DLPackObject` of
//!   one). Memory reached through any other object (a torch tensor from `torch.from_numpy`, a
//!   memoryview) is held in the registry only, which rust-numpy doesn't consult; and two numpy
//!   arrays over the same memory with different owners are two keys to rust-numpy.

use std::ffi::{CStr, c_int, c_void};
use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;

use numpy::npyffi::{self, NPY_ARRAY_WRITEABLE, NPY_TYPES, NpyTypes, PY_ARRAY_API, PyArrayObject};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCapsule, PyDict, PyType};

use crate::error::{Error, Result};
use crate::tensor::{Owner, Tensor};

const CAPSULE: &CStr = c"_RUST_NUMPY_BORROW_CHECKING_API";

/// Version 1 of rust-numpy's table (its `Shared`); later versions only append fields. Each
/// function is called attached, with the table's `flags` and an array.
#[repr(C)]
struct SharedV1 {
    version: u64,
    flags: *mut c_void,
    /// 0, or -1 when a conflicting borrow is held.
    acquire: unsafe extern "C" fn(flags: *mut c_void, array: *mut PyArrayObject) -> c_int,
    /// 0, -1 when a conflicting borrow is held, -2 when the array isn't writeable.
    acquire_mut: unsafe extern "C" fn(flags: *mut c_void, array: *mut PyArrayObject) -> c_int,
    /// Ends a borrow acquired with an array of the same key.
    release: unsafe extern "C" fn(flags: *mut c_void, array: *mut PyArrayObject),
    release_mut: unsafe extern "C" fn(flags: *mut c_void, array: *mut PyArrayObject),
}

/// The process's table and numpy's array type, found once numpy is imported.
struct Flags {
    /// Inside `capsule`, version 1 or later.
    table: NonNull<SharedV1>,
    ndarray: Py<PyType>,
    /// Keeps the table alive whatever becomes of the module's attribute.
    _capsule: Py<PyCapsule>,
}

// SAFETY: the table is immutable, alive while the capsule is, and its functions are called
// attached only; the rest are Python references, which are `Send` and `Sync`.
unsafe impl Send for Flags {}
// SAFETY: shared access only reads the table, which nothing writes, and calls its functions
// attached only.
unsafe impl Sync for Flags {}

impl Flags {
    fn table(&self) -> &SharedV1 {
        // SAFETY: a version 1 (or later) table, which starts with `SharedV1`'s fields, alive
        // while `_capsule` is (checked and kept by `find`).
        unsafe { self.table.as_ref() }
    }
}

/// `None` when rust-numpy's table can't be reached or installed: rust-numpy's own borrows then
/// fail (it needs the same module and the same capsule), so none can conflict with a view.
static FLAGS: PyOnceLock<Option<Flags>> = PyOnceLock::new();

/// `sys.modules`, to tell whether numpy is imported without importing it.
static MODULES: PyOnceLock<Option<Py<PyDict>>> = PyOnceLock::new();

/// The table, once numpy is imported (no numpy array exists before).
fn flags(py: Python<'_>) -> Option<&'static Flags> {
    if let Some(flags) = FLAGS.get(py) {
        return flags.as_ref();
    }
    let modules = MODULES.get_or_init(py, || {
        let modules = py
            .import("sys")
            .and_then(|sys| sys.getattr("modules"))
            .ok()?;
        Some(modules.cast_into::<PyDict>().ok()?.unbind())
    });
    let imported = modules
        .as_ref()
        .is_some_and(|m| m.bind(py).contains(intern!(py, "numpy")).unwrap_or(false));
    if !imported {
        return None;
    }
    FLAGS.get_or_init(py, || find(py)).as_ref()
}

/// rust-numpy's table in numpy's module, installed by the `numpy` crate if absent.
fn find(py: Python<'_>) -> Option<Flags> {
    let module = numpy::get_array_module(py).ok()?;
    // rust-numpy's own lookups (numpy's C API, the module) panic where they fail.
    let array_type = || {
        // SAFETY: attached; reads numpy's type object from its C API, which the crate checks.
        unsafe { npyffi::get_type_object(py, NpyTypes::PyArray_Type) }
    };
    let ndarray = catch_unwind(array_type).ok()?;
    if !module.hasattr(CAPSULE).ok()? {
        // A borrow, in the crate's code, installs the table; an empty array conflicts with
        // nothing.
        catch_unwind(AssertUnwindSafe(|| {
            drop(PyArray1::<u8>::zeros(py, 0, false).try_readonly())
        }))
        .ok()?;
    }
    let capsule = module
        .getattr(CAPSULE)
        .ok()?
        .cast_into::<PyCapsule>()
        .ok()?;
    let table = capsule
        .pointer_checked(Some(CAPSULE))
        .ok()?
        .cast::<SharedV1>();
    // SAFETY: a capsule of this name holds rust-numpy's table, whose every version starts with
    // its version (a `u64`, aligned as the table is).
    let version = unsafe { table.cast::<u64>().read() };
    if version < 1 {
        return None;
    }
    // SAFETY: numpy's array type, a static type object that lives as long as numpy.
    let ndarray = unsafe { Bound::from_borrowed_ptr(py, ndarray.cast()) };
    Some(Flags {
        table,
        ndarray: ndarray.cast_into::<PyType>().ok()?.unbind(),
        _capsule: capsule.unbind(),
    })
}

/// The numpy array whose memory a view of `obj` (imported as `tensor`) reads: `obj` itself, or
/// the numpy array its imported memory is held by. `None` for any other memory, and before numpy
/// is imported.
fn numpy_array<'py>(
    obj: &Bound<'py, PyAny>,
    tensor: &Tensor,
) -> Option<(&'static Flags, Bound<'py, PyAny>)> {
    let py = obj.py();
    let flags = flags(py)?;
    let ndarray = flags.ndarray.bind(py);
    if obj.is_instance(ndarray).unwrap_or(false) {
        return Some((flags, obj.clone()));
    }
    let holder = match tensor.owner() {
        Owner::Object(holder) => holder.bind(py),
        Owner::ArrayStruct { source, .. } => source.bind(py),
        Owner::Buffer { exporter, .. } => exporter.bind(py),
        _ => return None,
    };
    holder
        .is_instance(ndarray)
        .unwrap_or(false)
        .then(|| (flags, holder.clone()))
}

/// A borrow of a view's memory in rust-numpy's table, ended by `give_back` (or on drop, which
/// attaches first).
pub struct NumpyBorrow {
    /// The private array the borrow was acquired with, and is released with.
    cover: ManuallyDrop<Py<PyAny>>,
    flags: &'static Flags,
    exclusive: bool,
}

impl NumpyBorrow {
    /// Borrow `start..end` (addresses, a non-empty range a view of `obj` reads, imported as
    /// `tensor`) in rust-numpy's table, shared or `exclusive`: `None` when no numpy array holds
    /// the memory; a `BufferError` when a rust-numpy borrow conflicts.
    pub fn take(
        obj: &Bound<'_, PyAny>,
        tensor: &Tensor,
        (start, end): (usize, usize),
        exclusive: bool,
    ) -> Result<Option<NumpyBorrow>> {
        let Some((flags, array)) = numpy_array(obj, tensor) else {
            return Ok(None);
        };
        let cover = cover(flags, &array, start, end, exclusive)?;
        let table = flags.table();
        let acquire = if exclusive {
            table.acquire_mut
        } else {
            table.acquire
        };
        // SAFETY: rust-numpy's function, called attached with its table's flags and a live
        // numpy array.
        let status = unsafe { acquire(table.flags, cover.as_ptr().cast()) };
        match status {
            0 => Ok(Some(NumpyBorrow {
                cover: ManuallyDrop::new(cover.unbind()),
                flags,
                exclusive,
            })),
            -1 if exclusive => Err(Error::buffer(
                "this numpy array's memory is borrowed through rust-numpy (a PyReadonlyArray or \
                 PyReadwriteArray, in this or another extension); a mutable view (view_mut) \
                 needs it alone: drop that borrow first",
            )),
            -1 => Err(Error::buffer(
                "this numpy array's memory is borrowed mutably through rust-numpy (a \
                 PyReadwriteArray, in this or another extension); drop that borrow first",
            )),
            -2 => Err(Error::buffer(
                "rust-numpy's borrow flags hold this numpy array's memory as read-only, so it \
                 can't be viewed mutably",
            )),
            other => Err(Error::buffer(format!(
                "rust-numpy's borrow flags refused this numpy array's memory (status {other})"
            ))),
        }
    }

    /// End the borrow, the GIL held (`py`).
    pub fn give_back(self, py: Python<'_>) {
        let mut this = ManuallyDrop::new(self);
        this.end(py);
    }

    fn end(&mut self, py: Python<'_>) {
        let table = self.flags.table();
        let release = if self.exclusive {
            table.release_mut
        } else {
            table.release
        };
        // SAFETY: rust-numpy's function, called attached, with the array the borrow was
        // acquired with: private to this borrow and unchanged since, so of the same key.
        unsafe { release(table.flags, self.cover.as_ptr().cast()) };
        // SAFETY: taken once, here: `end` runs once per borrow (`give_back` or drop).
        drop(unsafe { ManuallyDrop::take(&mut self.cover) }.into_bound(py));
    }
}

impl Drop for NumpyBorrow {
    fn drop(&mut self) {
        Python::attach(|py| self.end(py));
    }
}

/// A new 1-d `uint8` array over `start..end`, writable if `writable`, based on `array` (a numpy
/// array whose memory holds those bytes).
fn cover<'py>(
    flags: &Flags,
    array: &Bound<'py, PyAny>,
    start: usize,
    end: usize,
    writable: bool,
) -> Result<Bound<'py, PyAny>> {
    let py = array.py();
    let Some(mut len) = end.checked_sub(start).and_then(|n| isize::try_from(n).ok()) else {
        return Err(Error::value(format!(
            "this memory's addresses {start:#x}..{end:#x} span more than an array can"
        )));
    };
    // SAFETY: attached; numpy's C API, reached before (`find`). A new reference to the builtin
    // `uint8` dtype.
    let descr = unsafe { PY_ARRAY_API.PyArray_DescrFromType(py, NPY_TYPES::NPY_UBYTE as c_int) };
    if descr.is_null() {
        return Err(PyErr::fetch(py).into());
    }
    // SAFETY: attached; numpy's array type, the dtype (whose reference it takes), one dimension
    // of `len` bytes and C strides, over memory that stays valid while `array`, made its base
    // below, lives; numpy allocates nothing for the elements.
    let made = unsafe {
        PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            flags.ndarray.as_ptr().cast(),
            descr,
            1,
            &mut len,
            std::ptr::null_mut(),
            start as *mut c_void,
            if writable { NPY_ARRAY_WRITEABLE } else { 0 },
            std::ptr::null_mut(),
        )
    };
    // SAFETY: a new reference, or null with an exception set.
    let cover = unsafe { Bound::from_owned_ptr_or_err(py, made) }?;
    // SAFETY: attached; a new array without a base, and a reference to `array`, which numpy
    // takes (released with the cover, even when this fails).
    let status = unsafe {
        PY_ARRAY_API.PyArray_SetBaseObject(py, cover.as_ptr().cast(), array.clone().into_ptr())
    };
    if status != 0 {
        return Err(PyErr::fetch(py).into());
    }
    Ok(cover)
}
