//! rust-numpy's borrow flags, which a view's borrow meets, so that neither crate hands out a
//! `&mut` over memory the other lends.
//!
//! rust-numpy keeps its borrows in a table of functions published in numpy's module
//! (`numpy._core.multiarray`, or `numpy.core.multiarray` under numpy 1), as the capsule
//! `_RUST_NUMPY_BORROW_CHECKING_API`: whichever extension borrows first installs it, every later
//! one uses it. Its version 1 is `SharedV1`. A borrow there is keyed on the numpy object that
//! owns the memory (the end of the array's chain of bases) and on the array's address range,
//! first element and strides' common divisor. Which extension installed the table decides how
//! a view meets it (`Flags`):
//!
//! - **Installed by the runtime.** When no extension has installed the table by the runtime's
//!   first view of numpy memory, the runtime's copy of rust-numpy (the `numpy` crate) makes one,
//!   and the runtime publishes it wrapped (`Wrapped`): a rust-numpy borrow is first checked
//!   against the views in the registry (by address range, as views are against each other),
//!   then against other rust-numpy borrows by rust-numpy's own code and rules, and is recorded
//!   in the registry while it lasts. A view then checks the registry alone, whatever object
//!   handed the memory over, as it does for other views.
//! - **Installed by another extension.** A view of a numpy array (any subclass, or an object
//!   whose imported memory one holds, a `DLPackObject` of it) also takes a borrow in that table
//!   (`NumpyBorrow`), with a private 1-d `uint8` array over exactly the bytes the view spans,
//!   based on the viewed array (so its chain ends at the same owner). Private: rust-numpy
//!   recomputes the key from the array it is given at release, so the array must not change
//!   meanwhile (Python code may reshape the viewed array in place, `a.shape = ...`, and a key no
//!   longer in the table aborts the process inside rust-numpy). Of bytes: a stride of 1 makes
//!   rust-numpy's conflict test any overlap of address ranges, the registry's (its own test,
//!   whether the first elements differ by a multiple of the strides' common divisor, would let
//!   a reinterpreted view at an odd byte offset alias). Memory reached through any other object
//!   (a torch tensor from `torch.from_numpy`, a memoryview) is then in the registry only, which
//!   that table doesn't consult, and two numpy arrays over the same memory with different
//!   owners are two keys to it.

use std::ffi::{CStr, c_int, c_void};
use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};

use numpy::npyffi::{
    self, NPY_ARRAY_WRITEABLE, NPY_TYPES, NpyTypes, PY_ARRAY_API, PyArrayObject, PyDataType_ELSIZE,
};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCapsule, PyDict, PyModule, PyType};

use super::borrows;
use crate::error::{Error, Result};
use crate::ffi::python;
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

/// How a view meets rust-numpy's borrows.
enum Flags {
    /// The runtime installed the table (`install`): rust-numpy's borrows are in the registry.
    Wrapped,
    /// Another extension did: a view borrows there too (`NumpyBorrow`).
    Theirs(Table),
}

/// Another extension's table, and numpy's array type.
struct Table {
    /// Inside `_capsule`, version 1 or later.
    table: NonNull<SharedV1>,
    ndarray: Py<PyType>,
    /// Keeps the table alive whatever becomes of the module's attribute.
    _capsule: Py<PyCapsule>,
}

// SAFETY: the table is immutable, alive while the capsule is, and its functions are called
// attached only; the rest are Python references, which are `Send` and `Sync`.
unsafe impl Send for Table {}
// SAFETY: shared access only reads the table, which nothing writes, and calls its functions
// attached only.
unsafe impl Sync for Table {}

impl Table {
    fn get(&self) -> &SharedV1 {
        // SAFETY: a version 1 (or later) table, which starts with `SharedV1`'s fields, alive
        // while `_capsule` is (checked and kept by `theirs`).
        unsafe { self.table.as_ref() }
    }
}

/// `None` when rust-numpy's table can't be reached or installed: rust-numpy's own borrows then
/// fail (it needs the same module and the same capsule), so none can conflict with a view.
static FLAGS: PyOnceLock<Option<Flags>> = PyOnceLock::new();

/// `sys.modules`, to tell whether numpy is imported without importing it.
static MODULES: PyOnceLock<Option<Py<PyDict>>> = PyOnceLock::new();

/// `FLAGS`' answer for a view, in one load: whether it takes a borrow in another extension's
/// table (`THEIRS`), or takes nothing more than its registry borrow (`REGISTRY`: the runtime's
/// table, or none), or `UNKNOWN` until numpy is imported.
static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);
const UNKNOWN: u8 = 0;
const REGISTRY: u8 = 1;
const THEIRS: u8 = 2;

/// Whether a view borrows in another extension's table too (`NumpyBorrow`).
#[inline]
pub fn views_borrow_there(py: Python<'_>) -> bool {
    match MODE.load(Ordering::Relaxed) {
        REGISTRY => false,
        THEIRS => true,
        _ => matches!(flags(py), Some(Flags::Theirs(_))),
    }
}

/// How views meet rust-numpy's borrows, once numpy is imported (no numpy array exists before,
/// nor any rust-numpy borrow).
#[cold]
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
    // Python code runs (imports, numpy's version): attached through PyO3, so that references
    // dropped on the way are released now rather than queued (a C API caller holds the GIL
    // without PyO3 knowing).
    let flags = FLAGS
        .get_or_init(py, || {
            Python::attach(|py| {
                let module = numpy::get_array_module(py).ok()?;
                if module.hasattr(CAPSULE).ok()? {
                    theirs(&module).map(Flags::Theirs)
                } else {
                    install(&module)
                }
            })
        })
        .as_ref();
    let mode = match flags {
        Some(Flags::Theirs(_)) => THEIRS,
        _ => REGISTRY,
    };
    MODE.store(mode, Ordering::Relaxed);
    flags
}

/// The table in numpy's module, `module`.
fn theirs(module: &Bound<'_, PyModule>) -> Option<Table> {
    let py = module.py();
    // rust-numpy's own lookups (numpy's C API, the module) panic where they fail.
    let array_type = || {
        // SAFETY: attached; reads numpy's type object from its C API, which the crate checks.
        unsafe { npyffi::get_type_object(py, NpyTypes::PyArray_Type) }
    };
    let ndarray = catch_unwind(array_type).ok()?;
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
    Some(Table {
        table,
        ndarray: ndarray.cast_into::<PyType>().ok()?.unbind(),
        _capsule: capsule.unbind(),
    })
}

/// Install the table in `module`, which has none: rust-numpy's, made by the runtime's copy of
/// the crate, published wrapped (`acquire_wrapped` and the rest). Version 1, as the crate's is:
/// an extension that needs a later one then refuses it, as it would refuse the crate's own.
fn install(module: &Bound<'_, PyModule>) -> Option<Flags> {
    let py = module.py();
    // A borrow, in the crate's code, installs its table (in the module, where the wrapper
    // replaces it before any other extension can read it); an empty array conflicts with
    // nothing.
    catch_unwind(AssertUnwindSafe(|| {
        drop(PyArray1::<u8>::zeros(py, 0, false).try_readonly())
    }))
    .ok()?;
    let inner = theirs(module)?;
    let wrapper = Box::new(SharedV1 {
        version: 1,
        flags: inner.table.as_ptr().cast(),
        acquire: acquire_wrapped,
        acquire_mut: acquire_mut_wrapped,
        release: release_wrapped,
        release_mut: release_mut_wrapped,
    });
    // Both live for the rest of the process, as extensions keep pointers into them: the
    // wrapper is never freed, and the crate's table is kept by a reference never released.
    let wrapper = Box::into_raw(wrapper);
    std::mem::forget(inner._capsule);
    // SAFETY: attached; the wrapper is never freed; the name is static.
    let capsule = unsafe { python::capsule_new_static(wrapper.cast(), CAPSULE) };
    // SAFETY: a new reference, or null with an exception set.
    let capsule = unsafe { Bound::from_owned_ptr_or_err(py, capsule) }.ok()?;
    if module.setattr(CAPSULE, capsule).is_err() {
        // The crate's own table stays published: views borrow there.
        return theirs(module).map(Flags::Theirs);
    }
    Some(Flags::Wrapped)
}

// -- the wrapper's functions, which rust-numpy calls (attached) ---------------------------------

unsafe extern "C" fn acquire_wrapped(flags: *mut c_void, array: *mut PyArrayObject) -> c_int {
    // SAFETY: rust-numpy's call of the wrapper: attached, its flags and a live array.
    unsafe { acquire_through(flags, array, false) }
}

unsafe extern "C" fn acquire_mut_wrapped(flags: *mut c_void, array: *mut PyArrayObject) -> c_int {
    // SAFETY: rust-numpy's call of the wrapper: attached, its flags and a live array.
    unsafe { acquire_through(flags, array, true) }
}

unsafe extern "C" fn release_wrapped(flags: *mut c_void, array: *mut PyArrayObject) {
    // SAFETY: rust-numpy's call of the wrapper: attached, its flags and a live array.
    unsafe { release_through(flags, array, false) }
}

unsafe extern "C" fn release_mut_wrapped(flags: *mut c_void, array: *mut PyArrayObject) {
    // SAFETY: rust-numpy's call of the wrapper: attached, its flags and a live array.
    unsafe { release_through(flags, array, true) }
}

/// A rust-numpy borrow of `array`, through the wrapper: refused (-1) where a view holds its
/// memory in conflict, else rust-numpy's answer, and recorded in the registry when granted.
///
/// # Safety
/// Attached; `flags` is the wrapper's (the crate's table); `array` is a live numpy array, kept
/// alive by its borrow until released.
unsafe fn acquire_through(flags: *mut c_void, array: *mut PyArrayObject, exclusive: bool) -> c_int {
    let granted = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: rust-numpy calls its table's functions attached (the contract), as this
        // is one.
        let py = unsafe { Python::assume_attached() };
        // SAFETY: the wrapper's flags are the crate's table, which lives forever (`install`).
        let inner = unsafe { &*flags.cast::<SharedV1>() };
        // SAFETY: a live numpy array (the contract).
        let (start, end) = unsafe { byte_range(py, array) };
        let acquire = if exclusive {
            inner.acquire_mut
        } else {
            inner.acquire
        };
        // The check against views, rust-numpy's answer and its record are one step.
        borrows::acquire_rust_numpy(start, end, exclusive, array as usize, || {
            // SAFETY: the crate's function, attached, with its flags and a live array (it runs
            // no Python code).
            unsafe { acquire(inner.flags, array) }
        })
    }));
    // Nothing above panics but on a bug; refused then, never unwound into rust-numpy.
    granted.unwrap_or(-1)
}

/// The end of a borrow `acquire_through` granted.
///
/// # Safety
/// As `acquire_through`'s, with the array the borrow was acquired with.
unsafe fn release_through(flags: *mut c_void, array: *mut PyArrayObject, exclusive: bool) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the wrapper's flags are the crate's table, which lives forever (`install`).
        let inner = unsafe { &*flags.cast::<SharedV1>() };
        let release = if exclusive {
            inner.release_mut
        } else {
            inner.release
        };
        borrows::release_rust_numpy(exclusive, array as usize, || {
            // SAFETY: the crate's function, attached, with its flags and the borrow's array (it
            // runs no Python code).
            unsafe { release(inner.flags, array) }
        });
    }));
}

/// The addresses `start..end` the elements of `array` span (empty without elements); all of
/// the address space for a layout that runs past it, which no array has.
///
/// # Safety
/// Attached; `array` is a live numpy array.
unsafe fn byte_range(py: Python<'_>, array: *mut PyArrayObject) -> (usize, usize) {
    // SAFETY: `array` is a live numpy array (the contract), whose fields follow its header.
    let fields = unsafe { npyffi::_PyArray_GET_ITEM_DATA(array) };
    // SAFETY: those fields, which numpy keeps while the array lives.
    let fields = unsafe { &*fields };
    let data = fields.data as usize;
    let nd = usize::try_from(fields.nd).unwrap_or(0);
    // SAFETY: attached; the array's dtype, read as numpy's version lays it out.
    let itemsize = unsafe { PyDataType_ELSIZE(py, fields.descr) };
    let dims = if nd == 0 {
        &[][..]
    } else {
        // SAFETY: a live array's `nd` extents and strides.
        unsafe { std::slice::from_raw_parts(fields.dimensions, nd) }
    };
    let strides = if nd == 0 {
        &[][..]
    } else {
        // SAFETY: as for the extents.
        unsafe { std::slice::from_raw_parts(fields.strides, nd) }
    };
    if dims.contains(&0) {
        return (data, data);
    }
    let (mut low, mut high) = (0i128, i128::from(itemsize as i64));
    for (&n, &stride) in dims.iter().zip(strides) {
        let reach = i128::from((n - 1) as i64) * i128::from(stride as i64);
        if reach < 0 {
            low += reach;
        } else {
            high += reach;
        }
    }
    let at = |offset: i128| usize::try_from(data as i128 + offset).ok();
    match (at(low), at(high)) {
        (Some(start), Some(end)) => (start, end),
        _ => (0, usize::MAX),
    }
}

/// The numpy array whose memory a view of `obj` (imported as `tensor`) reads: `obj` itself, or
/// the numpy array its imported memory is held by.
fn numpy_array<'py>(
    obj: &Bound<'py, PyAny>,
    tensor: &Tensor,
    ndarray: &Bound<'py, PyType>,
) -> Option<Bound<'py, PyAny>> {
    let py = obj.py();
    if obj.is_instance(ndarray).unwrap_or(false) {
        return Some(obj.clone());
    }
    let holder = match tensor.owner() {
        Owner::Object(holder) => holder.bind(py),
        Owner::ArrayStruct { producer, .. } => producer.bind(py),
        Owner::Buffer { exporter, .. } => exporter.bind(py),
        _ => return None,
    };
    holder
        .is_instance(ndarray)
        .unwrap_or(false)
        .then(|| holder.clone())
}

/// A view's borrow in another extension's table, ended by `give_back` (or on drop, which
/// attaches first).
pub struct NumpyBorrow {
    /// The private array the borrow was acquired with, and is released with.
    cover: ManuallyDrop<Py<PyAny>>,
    table: &'static Table,
    exclusive: bool,
}

impl NumpyBorrow {
    /// Borrow `start..end` (addresses, a non-empty range a view of `obj` reads, imported as
    /// `tensor`) in another extension's table (asked where `views_borrow_there`), shared or
    /// `exclusive`: `None` where no numpy array holds the memory; a `BufferError` when a
    /// rust-numpy borrow conflicts.
    pub fn take(
        obj: &Bound<'_, PyAny>,
        tensor: &Tensor,
        (start, end): (usize, usize),
        exclusive: bool,
    ) -> Result<Option<NumpyBorrow>> {
        let Some(Flags::Theirs(table)) = flags(obj.py()) else {
            return Ok(None);
        };
        let Some(array) = numpy_array(obj, tensor, table.ndarray.bind(obj.py())) else {
            return Ok(None);
        };
        let cover = cover(table, &array, start, end, exclusive)?;
        let shared = table.get();
        let acquire = if exclusive {
            shared.acquire_mut
        } else {
            shared.acquire
        };
        // SAFETY: rust-numpy's function, called attached with its table's flags and a live
        // numpy array.
        let status = unsafe { acquire(shared.flags, cover.as_ptr().cast()) };
        match status {
            0 => Ok(Some(NumpyBorrow {
                cover: ManuallyDrop::new(cover.unbind()),
                table,
                exclusive,
            })),
            -1 => Err(borrows::held_by_rust_numpy(exclusive)),
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
        let shared = self.table.get();
        let release = if self.exclusive {
            shared.release_mut
        } else {
            shared.release
        };
        // SAFETY: rust-numpy's function, called attached, with the array the borrow was
        // acquired with: private to this borrow and unchanged since, so of the same key.
        unsafe { release(shared.flags, self.cover.as_ptr().cast()) };
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
    table: &Table,
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
            table.ndarray.as_ptr().cast(),
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
