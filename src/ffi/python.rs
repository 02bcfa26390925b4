//! Every raw call we make into CPython's C API (through `pyo3::ffi`), each behind a small
//! function whose contract says what it needs. Everything else in the crate reaches Python
//! through these or through PyO3's safe API.
//!
//! Contracts here say "the calling thread holds the GIL": attached to the interpreter, as the
//! C API needs, which on a free-threaded build is all it means: other threads run Python code
//! meanwhile. No state of ours is guarded by the GIL. What our entry points share lives in:
//!
//! - `Latch`es used without waiting, for caches a thread does without when another is using
//!   them: `object::instance`'s `FREE` (the free list of dead `DLPackObject`s) and
//!   `object::arguments`' `LAST_MAX_VERSION` (the last `max_version` tuple, a strong reference,
//!   with its answer);
//! - a `Latch` waited for, never held while Python code runs: `api::borrows`' `HELD` (the ranges
//!   Rust views and copies hold, whose check and insert are one step: a `Mutex` added 51
//!   instructions to a view and its release, a `Latch` 17);
//! - `Mutex`es never held while Python code runs: `import::numpy`'s `DESCRS`,
//!   `import::protocols`' `CACHE`, `object::methods`' `DTYPE_OBJECTS`, `share`'s registries, a
//!   shared tree's kept snapshots and its writers' turn (`lock::Writers`, whose wait detaches);
//! - atomics: `object::instance`'s `TYPE`, `object::arguments`' `KEYWORD_NAMES` (written once
//!   at initialisation), `object::methods`' `CPU_DEVICE` (written once), `api::lease`'s
//!   `SPARE` (a box swapped in and out), `import::numpy`'s `NDARRAY` and its last-dtype
//!   seqlock (whose writers hold `DESCRS`' lock);
//! - `PyOnceLock`s, which detach while they wait (`import::numpy`'s `FIELDS_OFFSET`,
//!   pickling's, the stand-in type's, `api::rust_numpy`'s `FLAGS` and `MODULES`), and immutable
//!   tables (the C APIs').
//!
//! A `DLPackObject`'s state is immutable once made, so threads share an object freely.

use std::cell::UnsafeCell;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyType;

pub use ffi::{PyObject, PyTypeObject};

// -- shared caches ----------------------------------------------------------------------------

/// A value shared by threads, used by one at a time: one compare-and-swap to take it, a store to
/// give it back, and no poisoning (a use that panics leaves the value as far as it got).
/// `try_with` never waits, so it can't deadlock against the GIL, a free-threaded interpreter's
/// stop-the-world pauses or its own caller: for caches and free lists, whose users do without
/// them when another thread (or an outer use on this thread) has them. `with` waits, for values
/// used only for a few comparisons at a time, never across Python code or anything else that
/// waits.
pub struct Latch<T> {
    busy: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through `try_with` and `with`, which hand it to one thread at
// a time (the one that set `busy`), so sharing the latch moves the value between threads, as
// `T: Send` allows.
unsafe impl<T: Send> Sync for Latch<T> {}

impl<T> Latch<T> {
    pub const fn new(value: T) -> Self {
        Latch {
            busy: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    #[inline(always)]
    fn take(&self) -> bool {
        self.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// `f` of the value, unless another use of it is under way (`None` then: `f` is not run).
    #[inline(always)]
    pub fn try_with<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        if !self.take() {
            return None;
        }
        // SAFETY: this thread just set `busy`.
        Some(unsafe { self.use_taken(f) })
    }

    /// `f` of the value, once other uses are over (spinning a little, then yielding the CPU to
    /// them). `f` must not use this latch again, nor wait for anything: a user that waits while
    /// another waits for it never ends.
    #[inline(always)]
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        if !self.take() {
            self.wait();
        }
        // SAFETY: this thread set `busy` (above, or in `wait`).
        unsafe { self.use_taken(f) }
    }

    #[cold]
    #[inline(never)]
    fn wait(&self) {
        let mut spins = 0u32;
        while !self.take() {
            if spins < 64 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// # Safety
    /// This thread set `busy`, and nothing else will clear it.
    #[inline(always)]
    unsafe fn use_taken<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        /// Clears `busy` when `f` returns or unwinds.
        struct Free<'a>(&'a AtomicBool);
        impl Drop for Free<'_> {
            #[inline(always)]
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _free = Free(&self.busy);
        // SAFETY: this thread set `busy` (the contract), so until `_free` clears it no other
        // reference to the value exists; the one made here ends with `f`, which can't keep it
        // (its result's type doesn't borrow from it).
        f(unsafe { &mut *self.value.get() })
    }
}

// -- references and types ---------------------------------------------------------------------

/// Take a strong reference to `object`.
///
/// # Safety
/// `object` is a live object; the calling thread holds the GIL.
#[inline(always)]
pub unsafe fn incref(object: *mut PyObject) {
    // SAFETY: `object` is a live object and the GIL is held (this function's contract).
    unsafe { ffi::Py_IncRef(object) }
}

/// Release a strong reference to `object` (which may run its deallocator, so any Python code).
///
/// # Safety
/// The caller owns a reference to `object` and gives it up; the calling thread holds the GIL.
#[inline(always)]
pub unsafe fn decref(object: *mut PyObject) {
    // SAFETY: the caller owns a reference to `object`, which it gives up here, and holds the
    // GIL (this function's contract).
    unsafe { ffi::Py_DecRef(object) }
}

/// Whether the one reference `object` borrows from is the only one there is.
pub fn sole_reference(object: &Bound<'_, PyAny>) -> bool {
    // SAFETY: reading the header of a live object (the bound reference), the GIL held (`Bound`).
    unsafe { ffi::Py_REFCNT(object.as_ptr()) == 1 }
}

/// Whether `dict` maps exactly `keys` (the same objects), in order, to `values` (the same
/// objects), and nothing but the dict and one other holder (a caller's list of them) refers to
/// each value. One pass over the dict's entries, borrowing them: no reference is taken or let
/// go of, and no Python code runs.
pub fn dict_holds_alone(
    dict: &Bound<'_, pyo3::types::PyDict>,
    keys: &[Py<PyAny>],
    values: &[Py<PyAny>],
) -> bool {
    use pyo3::types::PyDictMethods;
    if keys.len() != values.len() || dict.len() != values.len() {
        return false;
    }
    pyo3::sync::critical_section::with_critical_section(dict.as_any(), || {
        let mut at: ffi::Py_ssize_t = 0;
        let (mut key, mut value) = (ptr::null_mut(), ptr::null_mut());
        for (kept_key, kept_value) in keys.iter().zip(values) {
            // SAFETY: `dict` is a live dict (the bound reference), which no other thread changes
            // meanwhile (the critical section; the GIL where there is one): `PyDict_Next` writes
            // borrowed references to its next entry, alive while the dict holds them.
            if unsafe { ffi::PyDict_Next(dict.as_ptr(), &mut at, &mut key, &mut value) } == 0 {
                return false;
            }
            if key != kept_key.as_ptr() || value != kept_value.as_ptr() {
                return false;
            }
            // SAFETY: reading the header of a live object: the dict holds `value`.
            if unsafe { ffi::Py_REFCNT(value) } != 2 {
                return false;
            }
        }
        true
    })
}

/// The type of `object`.
///
/// # Safety
/// `object` is a live object.
#[inline(always)]
pub unsafe fn type_of(object: *mut PyObject) -> *mut PyTypeObject {
    // SAFETY: per the contract: reading a live object's header.
    unsafe { ffi::Py_TYPE(object) }
}

/// Whether `object`'s type is one the garbage collector tracks instances of.
///
/// # Safety
/// `object` is a live object.
pub unsafe fn is_collected(object: *mut PyObject) -> bool {
    // SAFETY: `object` is a live object (this function's contract), as `type_of` needs.
    let ty = unsafe { type_of(object) };
    // SAFETY: the type of a live object is a live type.
    unsafe { ffi::PyType_IS_GC(ty) != 0 }
}

/// Whether `object` is a memoryview (exactly, or of a subclass).
///
/// # Safety
/// `object` is a live object.
pub unsafe fn is_memoryview(object: *mut PyObject) -> bool {
    // SAFETY: `object` is a live object (this function's contract); only its type is read.
    unsafe { ffi::PyMemoryView_Check(object) != 0 }
}

/// Whether `ty` is a heap type (made at run time: its attributes may change later).
pub fn is_heap_type(ty: &Bound<'_, PyType>) -> bool {
    // SAFETY: `ty` is a live type object.
    unsafe { ffi::PyType_GetFlags(ty.as_type_ptr()) & ffi::Py_TPFLAGS_HEAPTYPE != 0 }
}

/// `None` and `False`, by address (borrowed: the interpreter keeps them).
pub fn none_and_false() -> (*mut PyObject, *mut PyObject) {
    // SAFETY: reading the address of a singleton, which lives as long as the interpreter.
    let none = unsafe { ffi::Py_None() };
    // SAFETY: reading the address of the `False` singleton, which lives as long as the
    // interpreter.
    let false_ = unsafe { ffi::Py_False() };
    (none, false_)
}

// -- the GIL and the interpreter --------------------------------------------------------------

/// The GIL, held (taken if need be, as numpy's capsule deleters take it: cheaper than PyO3's
/// attach) until dropped, even when unwinding.
pub struct GilState(ffi::PyGILState_STATE);

impl GilState {
    /// # Safety
    /// The interpreter is initialised and not finalizing past the point where threads may take
    /// the GIL (see `interpreter_alive`).
    pub unsafe fn ensure() -> GilState {
        // SAFETY: the interpreter is initialised and not finalizing past the point where threads
        // may take the GIL (this function's contract), as `PyGILState_Ensure` needs.
        GilState(unsafe { ffi::PyGILState_Ensure() })
    }
}

impl Drop for GilState {
    fn drop(&mut self) {
        // SAFETY: matches the `PyGILState_Ensure` of `ensure`, on the same thread.
        unsafe { ffi::PyGILState_Release(self.0) }
    }
}

/// Whether the interpreter is (still) initialised: once it is finalised, nothing of Python may
/// be touched, and memory is left to the process' exit.
pub fn interpreter_alive() -> bool {
    // SAFETY: callable at any time, from any thread.
    unsafe { ffi::Py_IsInitialized() != 0 }
}

// -- errors -----------------------------------------------------------------------------------

/// Drop the exception being raised, if any.
///
/// # Safety
/// The calling thread holds the GIL.
pub unsafe fn clear_error() {
    // SAFETY: the calling thread holds the GIL (this function's contract).
    unsafe { ffi::PyErr_Clear() }
}

/// Whether an exception is being raised.
///
/// # Safety
/// The calling thread holds the GIL.
pub unsafe fn error_occurred() -> bool {
    // SAFETY: the calling thread holds the GIL (this function's contract).
    unsafe { !ffi::PyErr_Occurred().is_null() }
}

// -- Python's allocator -----------------------------------------------------------------------

/// `size` bytes (not zero) from Python's small-object allocator, 16-byte aligned; null when
/// out of memory.
///
/// # Safety
/// The calling thread holds the GIL (this allocator is only safe under it), as it must when
/// the memory is freed with `mem_free`.
pub unsafe fn mem_alloc(size: usize) -> *mut u8 {
    // SAFETY: the calling thread holds the GIL (this function's contract).
    unsafe { ffi::PyMem_Malloc(size).cast() }
}

/// Free memory from `mem_alloc`.
///
/// # Safety
/// `memory` came from `mem_alloc` and is freed once; the calling thread holds the GIL.
pub unsafe fn mem_free(memory: *mut u8) {
    // SAFETY: `memory` came from `mem_alloc` (so `PyMem_Malloc`) and is freed once, by a thread
    // holding the GIL (this function's contract).
    unsafe { ffi::PyMem_Free(memory.cast()) }
}

// -- capsules ---------------------------------------------------------------------------------

/// A capsule's destructor.
pub type CapsuleDestructor = unsafe extern "C" fn(capsule: *mut PyObject);

/// A new capsule of `pointer` (not null) named `name`, or null with an exception raised.
///
/// # Safety
/// The calling thread holds the GIL; `destructor`, if any, may be called with the capsule when
/// it dies (with the GIL held).
pub unsafe fn capsule_new(
    pointer: *mut c_void,
    name: &'static CStr,
    destructor: CapsuleDestructor,
) -> *mut PyObject {
    // SAFETY: per the contract; the name lives forever, as the capsule needs.
    unsafe { ffi::PyCapsule_New(pointer, name.as_ptr(), Some(destructor)) }
}

/// A new capsule without a destructor (its pointer is to something that lives forever).
///
/// # Safety
/// The calling thread holds the GIL; `pointer` is not null and outlives the capsule.
pub unsafe fn capsule_new_static(pointer: *mut c_void, name: &'static CStr) -> *mut PyObject {
    // SAFETY: the GIL is held, and `pointer` is not null and outlives the capsule (this
    // function's contract); the name is static, as the capsule needs.
    unsafe { ffi::PyCapsule_New(pointer, name.as_ptr(), None) }
}

/// A new capsule without a name (as numpy's `__array_struct__` capsules are), or null with an
/// exception raised.
///
/// # Safety
/// The calling thread holds the GIL; `pointer` is not null; `destructor` may be called with
/// the capsule when it dies (with the GIL held).
pub unsafe fn capsule_new_unnamed(
    pointer: *mut c_void,
    destructor: CapsuleDestructor,
) -> *mut PyObject {
    // SAFETY: the GIL is held, `pointer` is not null and `destructor` may run when the capsule
    // dies (this function's contract); a capsule may be nameless.
    unsafe { ffi::PyCapsule_New(pointer, ptr::null(), Some(destructor)) }
}

/// The capsule's name, null for a nameless one (or, with an exception raised, a non-capsule).
///
/// # Safety
/// `capsule` is a live object; the calling thread holds the GIL.
pub unsafe fn capsule_name(capsule: *mut PyObject) -> *const c_char {
    // SAFETY: `capsule` is a live object and the GIL is held (this function's contract).
    unsafe { ffi::PyCapsule_GetName(capsule) }
}

/// Whether `capsule` is a valid capsule named `name` (raises nothing).
///
/// # Safety
/// `capsule` is a live object; `name` is a NUL-terminated string (or null); the calling thread
/// holds the GIL.
pub unsafe fn capsule_is_valid(capsule: *mut PyObject, name: *const c_char) -> bool {
    // SAFETY: `capsule` is a live object, `name` a NUL-terminated string or null, and the GIL
    // is held (this function's contract).
    unsafe { ffi::PyCapsule_IsValid(capsule, name) == 1 }
}

/// The capsule's pointer if it is named `name` (compared by contents), else null with an
/// exception raised.
///
/// # Safety
/// `capsule` is a live object; `name` is a NUL-terminated string (or null); the calling thread
/// holds the GIL.
pub unsafe fn capsule_pointer(capsule: *mut PyObject, name: *const c_char) -> *mut c_void {
    // SAFETY: `capsule` is a live object, `name` a NUL-terminated string or null, and the GIL
    // is held (this function's contract).
    unsafe { ffi::PyCapsule_GetPointer(capsule, name) }
}

/// Rename a capsule (consumers rename DLPack capsules they take); false with an exception
/// raised if that failed.
///
/// # Safety
/// `capsule` is a live capsule; the calling thread holds the GIL.
pub unsafe fn capsule_rename(capsule: *mut PyObject, name: &'static CStr) -> bool {
    // SAFETY: per the contract; the name lives forever, as the capsule needs.
    unsafe { ffi::PyCapsule_SetName(capsule, name.as_ptr()) == 0 }
}

// -- the buffer protocol ----------------------------------------------------------------------

pub use ffi::{
    Py_bf_getbuffer, Py_buffer, PyBUF_ANY_CONTIGUOUS, PyBUF_C_CONTIGUOUS, PyBUF_F_CONTIGUOUS,
    PyBUF_FORMAT, PyBUF_FULL_RO, PyBUF_ND, PyBUF_STRIDES, PyBUF_WRITABLE,
};

/// Whether `object` exports buffers.
pub fn supports_buffer(object: &Bound<'_, PyAny>) -> bool {
    // SAFETY: `object` is a live object (and the GIL held); the check has no side effects.
    unsafe { ffi::PyObject_CheckBuffer(object.as_ptr()) != 0 }
}

/// Fill `view` with a buffer of `object` as `flags` ask; false with an exception raised if the
/// object refuses.
///
/// # Safety
/// `view` is writable storage for one `Py_buffer`; a filled view is released once, with
/// `release_buffer`.
pub unsafe fn get_buffer(object: &Bound<'_, PyAny>, view: *mut Py_buffer, flags: c_int) -> bool {
    // SAFETY: per the contract; `object` is live and the GIL held.
    unsafe { ffi::PyObject_GetBuffer(object.as_ptr(), view, flags) == 0 }
}

/// Release a view `get_buffer` filled.
///
/// # Safety
/// `view` was filled by `get_buffer` and is released once; the calling thread holds the GIL.
pub unsafe fn release_buffer(view: *mut Py_buffer) {
    // SAFETY: `view` was filled by `get_buffer` and is released once, by a thread holding the
    // GIL (this function's contract).
    unsafe { ffi::PyBuffer_Release(view) }
}

/// Copy a view's elements, following its suboffsets, into `len` bytes at `dst` in C order;
/// false with an exception raised on failure.
///
/// # Safety
/// `view` is a live filled view; `dst` is writable for `len` bytes, the view's element count
/// times its item size; the calling thread holds the GIL.
pub unsafe fn buffer_to_c_order(dst: *mut u8, view: *const Py_buffer, len: isize) -> bool {
    // SAFETY: per the contract (CPython only reads the view).
    unsafe { ffi::PyBuffer_ToContiguous(dst.cast(), view.cast_mut(), len, b'C' as c_char) == 0 }
}

// -- tuples, ints and strings -----------------------------------------------------------------

/// The items of an exact tuple of `N` items, borrowed from it; `None` for anything else.
///
/// # Safety
/// `tuple` is a live object; the calling thread holds the GIL.
#[inline(always)]
pub unsafe fn exact_tuple_items<const N: usize>(
    tuple: *mut PyObject,
) -> Option<[*mut PyObject; N]> {
    // SAFETY: `tuple` is a live object (this function's contract); only its type is read.
    if unsafe { ffi::PyTuple_CheckExact(tuple) } == 0 {
        return None;
    }
    // SAFETY: per the contract, and `tuple` is a tuple.
    if unsafe { tuple_size(tuple) } != N as isize {
        return None;
    }
    let mut items = [ptr::null_mut(); N];
    for (k, item) in items.iter_mut().enumerate() {
        // SAFETY: per the contract; the tuple has N items.
        *item = unsafe { tuple_item(tuple, k as isize) };
    }
    Some(items)
}

/// The size of a tuple.
///
/// # Safety
/// `tuple` is a live tuple; the calling thread holds the GIL.
#[inline(always)]
pub unsafe fn tuple_size(tuple: *mut PyObject) -> isize {
    // SAFETY: `tuple` is a live tuple and the GIL is held (this function's contract).
    unsafe { ffi::PyTuple_Size(tuple) }
}

/// Item `k` of a tuple, borrowed from it.
///
/// # Safety
/// `tuple` is a live tuple with more than `k` items; the calling thread holds the GIL.
#[inline(always)]
pub unsafe fn tuple_item(tuple: *mut PyObject, k: isize) -> *mut PyObject {
    // SAFETY: `tuple` is a live tuple with more than `k` items, and the GIL is held (this
    // function's contract).
    unsafe { ffi::PyTuple_GetItem(tuple, k) }
}

/// The value of an exact int that fits in a C long; `None` for anything else (no exception
/// is left raised).
///
/// # Safety
/// `value` is a live object; the calling thread holds the GIL.
#[inline(always)]
pub unsafe fn exact_int(value: *mut PyObject) -> Option<i64> {
    // SAFETY: per the contract (and not null).
    if value.is_null() || unsafe { ffi::PyLong_CheckExact(value) } == 0 {
        return None;
    }
    let mut overflow = 0;
    // SAFETY: per the contract; on an exact int this reports overflow in its flag and raises
    // nothing.
    let v = unsafe { ffi::PyLong_AsLongAndOverflow(value, &mut overflow) };
    // SAFETY: per the contract, the GIL is held.
    (overflow == 0 && (v != -1 || !unsafe { error_occurred() })).then_some(v as i64)
}

/// The number of code points of a str.
///
/// # Safety
/// `text` is a live str; the calling thread holds the GIL.
pub unsafe fn str_length(text: *mut PyObject) -> isize {
    // SAFETY: `text` is a live str and the GIL is held (this function's contract).
    unsafe { ffi::PyUnicode_GetLength(text) }
}

// -- our hand-written type --------------------------------------------------------------------

pub use ffi::{
    METH_FASTCALL, METH_KEYWORDS, METH_NOARGS, METH_O, Py_TPFLAGS_DEFAULT,
    Py_TPFLAGS_DISALLOW_INSTANTIATION, Py_TPFLAGS_HAVE_GC, Py_ssize_t, Py_tp_dealloc, Py_tp_doc,
    Py_tp_free, Py_tp_getset, Py_tp_methods, Py_tp_repr, Py_tp_traverse, PyGetSetDef, PyMethodDef,
    PyMethodDefPointer, PyType_Slot, PyType_Spec, visitproc,
};

/// A new type from `spec`, or null with an exception raised.
///
/// # Safety
/// `spec` and what it points to are valid for the call, except the method and getset tables,
/// which must live as long as the type; the calling thread holds the GIL.
pub unsafe fn type_from_spec(spec: *mut PyType_Spec) -> *mut PyObject {
    // SAFETY: `spec` and what it points to are valid for the call, its method and getset tables
    // outlive the type, and the GIL is held (this function's contract).
    unsafe { ffi::PyType_FromSpec(spec) }
}

/// A new instance of `ty`, zeroed, untracked by the garbage collector (so its state can be
/// written before the collector sees it), with a reference to `ty` (a heap type); null with an
/// exception raised when out of memory.
///
/// # Safety
/// `ty` is a live garbage-collected type whose instances have no items; the calling thread holds
/// the GIL.
pub unsafe fn new_instance(ty: *mut PyTypeObject) -> *mut PyObject {
    // SAFETY: per the contract. The generic allocator zeroes the instance and tracks it.
    let object = unsafe { ffi::PyType_GenericAlloc(ty, 0) };
    if !object.is_null() {
        // SAFETY: a fresh instance of a collected type, untracked before any Python code can
        // run (so before any collection).
        unsafe { untrack(object) };
    }
    object
}

/// Make a dead instance of `ty` (kept for reuse) a live object again: reference count 1, and a
/// reference to its heap type.
///
/// # Safety
/// `object` is the memory of a dead, untracked instance of `ty` whose type reference was
/// released; the calling thread holds the GIL.
pub unsafe fn revive_instance(object: *mut PyObject, ty: *mut PyTypeObject) {
    // SAFETY: `object` is the memory of a dead, untracked instance of `ty` whose type reference
    // was released, and the GIL is held (this function's contract).
    unsafe { ffi::PyObject_Init(object, ty) };
}

/// Let the garbage collector see `object` (its state is complete).
///
/// # Safety
/// `object` is a live, untracked instance of a garbage-collected type whose traversal is valid
/// now; the calling thread holds the GIL.
pub unsafe fn track(object: *mut PyObject) {
    // SAFETY: `object` is a live, untracked instance of a collected type whose traversal is
    // valid now, and the GIL is held (this function's contract).
    unsafe { ffi::PyObject_GC_Track(object.cast()) }
}

/// Hide `object` from the garbage collector (tracked or not).
///
/// # Safety
/// `object` is an instance of a garbage-collected type; the calling thread holds the GIL.
pub unsafe fn untrack(object: *mut PyObject) {
    // SAFETY: `object` is an instance of a garbage-collected type (untracking an untracked
    // one does nothing), and the GIL is held (this function's contract).
    unsafe { ffi::PyObject_GC_UnTrack(object.cast()) }
}

/// Give a dead, untracked instance's memory back to the collector's allocator.
///
/// # Safety
/// `object` came from `new_instance`, is dead and untracked, and is not used again; the calling
/// thread holds the GIL.
pub unsafe fn free_instance(object: *mut PyObject) {
    // SAFETY: `object` came from `new_instance` (the collector's allocator), is dead, untracked
    // and not used again, and the GIL is held (this function's contract).
    unsafe { ffi::PyObject_GC_Del(object.cast()) }
}

/// The deallocator for `tp_free` of our type.
pub const FREE_INSTANCE: unsafe extern "C" fn(*mut c_void) = ffi::PyObject_GC_Del;

/// A built-in function of `def`, bound to `module`; null with an exception raised on failure.
///
/// # Safety
/// `def` lives as long as the function; `module` and `module_name` are live objects; the
/// calling thread holds the GIL.
pub unsafe fn new_function(
    def: *mut PyMethodDef,
    module: *mut PyObject,
    module_name: *mut PyObject,
) -> *mut PyObject {
    // SAFETY: `def` outlives the function, `module` and `module_name` are live objects, and
    // the GIL is held (this function's contract).
    unsafe { ffi::PyCFunction_NewEx(def, module, module_name) }
}
