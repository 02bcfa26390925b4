//! `DLPackObject` instances as CPython sees them: their memory (the object header, then the
//! state), a small free list (a `Latch`) they come from and return to, and the slots that
//! end them (`tp_dealloc`, `tp_traverse`). An instance is tracked by the garbage collector only
//! when it can be part of a cycle (it references a garbage-collected object): a numpy array or
//! bytes owner can't be.

use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use pyo3::prelude::*;

use super::state::DLPackObject;
use crate::ffi::python::{self, Latch, PyObject, PyTypeObject};

/// An instance's memory: the object header, then our state (initialised while the instance is
/// alive; released in place when it dies).
#[repr(C)]
pub(super) struct Instance {
    header: PyObject,
    state: MaybeUninit<DLPackObject>,
}

// CPython's allocator aligns objects to 16 bytes, and the state lies right after the header.
const _: () = assert!(std::mem::align_of::<Instance>() <= 16);

/// The type, once created (the module holds it, and so does the reference leaked here: it lives
/// as long as the process).
static TYPE: AtomicPtr<PyTypeObject> = AtomicPtr::new(ptr::null_mut());

/// Dead instances kept for reuse, the way CPython keeps its own free lists. A thread that finds
/// the list in use by another allocates (or frees) as if it were empty (or full).
struct FreeList {
    slots: Latch<([usize; FREE_LIST_SIZE], usize)>,
}

const FREE_LIST_SIZE: usize = 16;

static FREE: FreeList = FreeList {
    slots: Latch::new(([0; FREE_LIST_SIZE], 0)),
};

impl FreeList {
    fn pop(&self) -> Option<*mut PyObject> {
        self.slots
            .try_with(|(slots, len)| {
                (*len > 0).then(|| {
                    *len -= 1;
                    slots[*len] as *mut PyObject
                })
            })
            .flatten()
    }

    /// Keep `instance` (dead: untracked, state released); false when the list is full or in
    /// use.
    fn push(&self, instance: *mut PyObject) -> bool {
        self.slots
            .try_with(|(slots, len)| {
                if *len == FREE_LIST_SIZE {
                    return false;
                }
                slots[*len] = instance as usize;
                *len += 1;
                true
            })
            .unwrap_or(false)
    }
}

/// The type, once `pytype` made it (null before).
pub(super) fn type_ptr() -> *mut PyTypeObject {
    TYPE.load(Ordering::Acquire)
}

/// Keep the type `pytype` made (once, at module initialisation; it lives as long as the
/// process).
///
/// # Safety
/// `ty` is the `DLPackObject` type `pytype` created (instances laid out as `Instance`, with
/// `dealloc` and `traverse` as its slots), which is never freed.
pub(super) unsafe fn set_type(ty: *mut PyTypeObject) {
    TYPE.store(ty, Ordering::Release);
}

/// A new `DLPackObject` holding `state`.
pub fn new_object(py: Python<'_>, state: DLPackObject) -> PyResult<Bound<'_, PyAny>> {
    let init = |dst: *mut DLPackObject| {
        // SAFETY: `new_object_with` hands over the instance's state to write.
        unsafe { dst.write(state) };
        true
    };
    // SAFETY: `init` writes the state whole.
    let made = unsafe { new_object_with(py, init) };
    made.expect("`init` always writes the state")
}

/// A new `DLPackObject` whose state `init` writes in place (fast paths: a state built on the
/// stack and copied in cost more than building it); `None` when `init` declines, having
/// written nothing that needs dropping. Allocating may run a garbage collection (and so
/// finalizers).
///
/// # Safety
/// `init` gets the instance's uninitialised state; when it returns true, it has written all of
/// it.
#[inline(always)]
pub unsafe fn new_object_with(
    py: Python<'_>,
    init: impl FnOnce(*mut DLPackObject) -> bool,
) -> Option<PyResult<Bound<'_, PyAny>>> {
    let ty = TYPE.load(Ordering::Acquire);
    if ty.is_null() {
        return Some(Err(pyo3::exceptions::PyRuntimeError::new_err(
            "dlpack._dlpack is not initialised",
        )));
    }
    // A recycled instance is dead memory of our type, which `revive_instance` makes a live object
    // again (with a reference to the type); a fresh one comes live and untracked from
    // `new_instance`. The state is written before the object is tracked or shared; a declined
    // instance is dead again (its type reference released) and goes back to the free list or the
    // allocator.
    let object = match FREE.pop() {
        Some(object) => {
            // SAFETY: we hold the GIL (`py`); the free list keeps dead, untracked instances of `ty`
            // whose type reference was released.
            unsafe { python::revive_instance(object, ty) };
            object
        }
        None => {
            // SAFETY: we hold the GIL (`py`); our type is collected and has no items.
            let object = unsafe { python::new_instance(ty) };
            if object.is_null() {
                return Some(Err(PyErr::fetch(py)));
            }
            object
        }
    };
    // SAFETY: a live instance of our type, whose memory is an `Instance`.
    let state = unsafe { (*object.cast::<Instance>()).state.as_mut_ptr() };
    if !init(state) {
        // The instance is dead again: nothing was written that needs dropping (the contract).
        if !FREE.push(object) {
            // SAFETY: we hold the GIL (`py`); untracked, dead, and not used again.
            unsafe { python::free_instance(object) };
        }
        // SAFETY: we hold the GIL (`py`); the reference the instance held on its type.
        unsafe { python::decref(ty.cast()) };
        return None;
    }
    // SAFETY: `init` wrote the whole state.
    if unsafe { (*state).references_collectable() } {
        // SAFETY: we hold the GIL (`py`); the state is complete, so traversal is valid.
        unsafe { python::track(object) };
    }
    // SAFETY: a new reference to a live object.
    Some(Ok(unsafe { Bound::from_owned_ptr(py, object) }))
}

/// The state of `object` if it is a `DLPackObject` (the type is final: an exact check), or,
/// in a build with the `pyclass-probe` feature, the PyO3 class measured against it.
pub fn state<'a>(object: &'a Bound<'_, PyAny>) -> Option<&'a DLPackObject> {
    if is_instance(object) {
        // SAFETY: an instance of our type has its state initialised for as long as it lives,
        // which `object` guarantees for 'a.
        return Some(unsafe { state_unchecked(object.as_ptr()) });
    }
    #[cfg(feature = "pyclass-probe")]
    if let Some(state) = super::state::probe_state(object) {
        return Some(state);
    }
    None
}

/// The state of a live `DLPackObject`.
///
/// # Safety
/// `object` is a live instance of our type, and outlives the returned reference.
pub unsafe fn state_unchecked<'a>(object: *mut PyObject) -> &'a DLPackObject {
    // SAFETY: per the contract, an `Instance`, live for 'a.
    let instance = unsafe { &*object.cast::<Instance>() };
    // SAFETY: a live instance's state is initialised.
    unsafe { instance.state.assume_init_ref() }
}

/// Whether `object` is a `DLPackObject`; false before the type exists.
pub fn is_instance(object: &Bound<'_, PyAny>) -> bool {
    // SAFETY: reading a live object's type (never null, unlike `TYPE` before module set-up).
    let ty = unsafe { python::type_of(object.as_ptr()) };
    ty == TYPE.load(Ordering::Relaxed)
}

/// `tp_dealloc`: untrack, release what the state holds (in place: the instance is unreachable,
/// so the Python code this may run can't see it), then recycle or free the memory.
pub(super) unsafe extern "C" fn dealloc(object: *mut PyObject) {
    // The state is released exactly once; the memory then either joins the free list or goes back
    // to the collector's allocator; instances of a heap type own a reference to it, released last.
    // SAFETY: the dying instance's memory is intact until freed below, so its header still holds
    // its type.
    let ty = unsafe { python::type_of(object) };
    // SAFETY: CPython calls `tp_dealloc` holding the GIL, on an instance of our garbage-collected
    // type.
    unsafe { python::untrack(object) };
    // SAFETY: `object` is an instance of our type, whose memory is an `Instance`.
    let state = unsafe { (*object.cast::<Instance>()).state.as_mut_ptr() };
    // A panic must not unwind into CPython; none is expected (leaking beats aborting).
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: a dying instance's state is initialised (written before the instance was shared)
        // and is not used again; CPython calls `tp_dealloc` holding the GIL.
        unsafe { DLPackObject::release_attached_in_place(state) };
    }));
    // The instance is dead and untracked, as the free list keeps them.
    if !FREE.push(object) {
        // SAFETY: the GIL is held; the instance came from `new_instance`, is dead and untracked,
        // and is not used again (the free list is full).
        unsafe { python::free_instance(object) };
    }
    // SAFETY: the GIL is held; an instance of a heap type owns a reference to it, given up here,
    // once the instance is done with.
    unsafe { python::decref(ty.cast()) };
}

/// `tp_traverse`: the type (instances of heap types reference it), the producer and the
/// objects that own the memory.
pub(super) unsafe extern "C" fn traverse(
    object: *mut PyObject,
    visit: python::visitproc,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: traversal is of live instances only (the collector's tracked ones, or any that
    // `gc.get_referents` is given).
    let ty = unsafe { python::type_of(object) };
    // SAFETY: `visit` is the traversal's callback, called with its `arg` and with `ty`, a live type
    // (the instance holds a reference to it).
    let code = unsafe { visit(ty.cast(), arg) };
    if code != 0 {
        return code;
    }
    // SAFETY: a live instance of our type, whose state was written before it was tracked or shared,
    // so before any traversal.
    let state = unsafe { state_unchecked(object) };
    // SAFETY: `visit` is the traversal's callback, called with its `arg` and with objects the state
    // holds references to, so live ones.
    state.for_each_reference(|referenced| unsafe { visit(referenced, arg) })
}
