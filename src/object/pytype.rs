//! The `DLPackObject` Python type, written against CPython's type API instead of as a PyO3
//! `#[pyclass]`: `asdlpack` makes one object per call, so its allocation, deallocation and entry
//! points are part of every exchange. Here:
//! - instances come from a small free list (GIL-protected), and return to it;
//! - an instance is tracked by the garbage collector only when it can be part of a cycle (it
//!   references a garbage-collected object): a numpy array or bytes owner can't be;
//! - deallocation releases Python references directly (CPython holds the GIL there), without
//!   PyO3's attach bookkeeping;
//! - `asdlpack` and `__dlpack__` read their arguments by hand.
//!
//! Every other entry point (getters, `__repr__`, `__dlpack_device__`) goes through PyO3's own
//! trampolines, which count the GIL, turn errors into exceptions and stop panics.

use std::cell::UnsafeCell;
use std::ffi::{CStr, c_int, c_void};
use std::mem::MaybeUninit;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyType;

use super::DLPackObject;

/// An instance's memory: the object header, then our state (initialised while the instance is
/// alive; moved out when it dies).
#[repr(C)]
struct Instance {
    header: ffi::PyObject,
    state: MaybeUninit<DLPackObject>,
}

/// The type, once created (the module holds it, and so does the reference leaked here: it lives
/// as long as the process).
static TYPE: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(ptr::null_mut());

unsafe extern "C" {
    /// CPython's allocator for garbage-collected objects (stable ABI): unlike
    /// `PyType_GenericAlloc` it neither zeroes nor tracks the object, so the state is written
    /// before the collector can see it.
    fn _PyObject_GC_New(ty: *mut ffi::PyTypeObject) -> *mut ffi::PyObject;
}

/// State shared by the entry points, guarded by the GIL (the extension is built for
/// GIL-enabled CPython only: abi3) instead of a lock.
pub struct GilCell<T>(UnsafeCell<T>);

// SAFETY: the contents are only reached through `get`, whose callers hold the GIL, so by one
// thread at a time.
unsafe impl<T: Send> Sync for GilCell<T> {}

impl<T> GilCell<T> {
    pub const fn new(value: T) -> Self {
        GilCell(UnsafeCell::new(value))
    }

    /// # Safety
    /// The caller holds the GIL, and doesn't call `get` again (on this cell) while it uses the
    /// result.
    #[allow(clippy::mut_from_ref, reason = "the GIL is the lock")]
    pub unsafe fn get(&self) -> &mut T {
        // SAFETY: per the contract, this is the only reference for its lifetime.
        unsafe { &mut *self.0.get() }
    }
}

/// Dead instances kept for reuse, the way CPython keeps its own free lists.
struct FreeList {
    slots: GilCell<([usize; FREE_LIST_SIZE], usize)>,
}

const FREE_LIST_SIZE: usize = 16;

static FREE: FreeList = FreeList {
    slots: GilCell::new(([0; FREE_LIST_SIZE], 0)),
};

impl FreeList {
    /// # Safety
    /// The caller holds the GIL.
    unsafe fn pop(&self) -> Option<*mut ffi::PyObject> {
        // SAFETY: per the contract, nobody else touches the list meanwhile.
        let (slots, len) = unsafe { self.slots.get() };
        (*len > 0).then(|| {
            *len -= 1;
            slots[*len] as *mut ffi::PyObject
        })
    }

    /// Keep `instance` (dead: untracked, state moved out); false when the list is full.
    ///
    /// # Safety
    /// The caller holds the GIL.
    unsafe fn push(&self, instance: *mut ffi::PyObject) -> bool {
        // SAFETY: per the contract, nobody else touches the list meanwhile.
        let (slots, len) = unsafe { self.slots.get() };
        if *len == FREE_LIST_SIZE {
            return false;
        }
        slots[*len] = instance as usize;
        *len += 1;
        true
    }
}

/// `__dlpack__`'s keyword names, interned (as CPython interns names in calls): `KEYWORDS`' order.
static KEYWORD_NAMES: GilCell<[usize; 4]> = GilCell::new([0; 4]);

/// The `KEYWORDS` slot `name` is, if it is one of our interned names (compared by address).
///
/// # Safety
/// The caller holds the GIL.
#[inline(always)]
pub unsafe fn interned_keyword_slot(name: *mut ffi::PyObject) -> Option<usize> {
    // SAFETY: per the contract; the table is read, not kept.
    let names = unsafe { *KEYWORD_NAMES.get() };
    names.iter().position(|&n| n == name as usize)
}

/// `__dlpack__`'s arguments when passed the common way, for its fast path: keywords only, each
/// named by the interned string (as Python code and numpy name them) and given once. Values in
/// `KEYWORDS` order, null for absent or None; `None` for any other call (the general parser then
/// accepts or rejects it).
///
/// # Safety
/// As CPython passes fast-call arguments (see `super::dlpack_method`), holding the GIL.
#[inline(always)]
pub unsafe fn common_arguments(
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> Option<[*mut ffi::PyObject; 4]> {
    let mut values = [ptr::null_mut(); 4];
    if nargs != 0 {
        return None;
    }
    if kwnames.is_null() {
        return Some(values);
    }
    // SAFETY: per the contract: `kwnames` is a tuple of names, one value each after the
    // (zero) positional arguments; we hold the GIL for the names table.
    unsafe {
        let none = ffi::Py_None();
        for k in 0..ffi::PyTuple_Size(kwnames) {
            let slot = interned_keyword_slot(ffi::PyTuple_GetItem(kwnames, k))?;
            let value = *args.add(k as usize);
            if !values[slot].is_null() {
                return None;
            }
            if value != none {
                values[slot] = value;
            }
        }
    }
    Some(values)
}

/// The `DLPackObject` type, created on first use (module initialisation).
pub fn type_object(py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
    let mut ty = TYPE.load(Ordering::Acquire);
    if ty.is_null() {
        for (slot, name) in super::KEYWORDS.iter().enumerate() {
            let name = pyo3::types::PyString::intern(py, name);
            // SAFETY: we hold the GIL; the interned name is kept alive by the reference leaked
            // into the table.
            unsafe { KEYWORD_NAMES.get()[slot] = name.into_ptr() as usize };
        }
        ty = create_type(py)?;
        TYPE.store(ty, Ordering::Release);
    }
    // SAFETY: `ty` is a live type object (one reference is never released).
    Ok(unsafe { Bound::from_borrowed_ptr(py, ty.cast()).cast_into_unchecked() })
}

/// A new `DLPackObject` holding `state`.
pub fn new_object(py: Python<'_>, state: DLPackObject) -> PyResult<Bound<'_, PyAny>> {
    // SAFETY: the state is written whole.
    let made = unsafe {
        new_object_with(py, |dst| {
            dst.write(state);
            true
        })
    };
    made.expect("`init` always writes the state")
}

/// A new `DLPackObject` whose state `init` writes in place (fast paths: a state built on the
/// stack and copied in cost more than building it); `None` when `init` declines, having
/// written nothing that needs dropping. Allocating may run a garbage collection (and so
/// finalizers), so no `GilCell` borrow may be held across this call.
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
    // SAFETY: we hold the GIL (`py`). A recycled instance is dead memory of our type's size,
    // which `PyObject_Init` makes a live object again (with a reference to the type); a fresh
    // one comes from the collector's allocator (likewise). The state is written before the
    // object is tracked or shared; a declined instance is dead again (its type reference
    // released) and goes back to the free list or the allocator.
    unsafe {
        let object = match FREE.pop() {
            Some(object) => {
                ffi::PyObject_Init(object, ty);
                object
            }
            None => {
                let object = _PyObject_GC_New(ty);
                if object.is_null() {
                    return Some(Err(PyErr::fetch(py)));
                }
                object
            }
        };
        let state = (*object.cast::<Instance>()).state.as_mut_ptr();
        if !init(state) {
            if !FREE.push(object) {
                ffi::PyObject_GC_Del(object.cast());
            }
            ffi::Py_DecRef(ty.cast());
            return None;
        }
        if (*state).references_collectable() {
            ffi::PyObject_GC_Track(object.cast());
        }
        Some(Ok(Bound::from_owned_ptr(py, object)))
    }
}

/// The state of `object` if it is a `DLPackObject` (the type is final: an exact check).
pub fn state<'a>(object: &'a Bound<'_, PyAny>) -> Option<&'a DLPackObject> {
    // SAFETY: an instance of our type has its state initialised for as long as it lives, which
    // `object` guarantees for 'a.
    is_instance(object.as_ptr()).then(|| unsafe { state_unchecked(object.as_ptr()) })
}

/// The state of a live `DLPackObject`.
///
/// # Safety
/// `object` is a live instance of our type, and outlives the returned reference.
pub unsafe fn state_unchecked<'a>(object: *mut ffi::PyObject) -> &'a DLPackObject {
    // SAFETY: per the contract, the state is initialised.
    unsafe { (*object.cast::<Instance>()).state.assume_init_ref() }
}

/// Whether `object` (a live object) is a `DLPackObject`; false before the type exists.
pub fn is_instance(object: *mut ffi::PyObject) -> bool {
    // SAFETY: reading a live object's type (never null, unlike `TYPE` before module set-up).
    unsafe { ffi::Py_TYPE(object) == TYPE.load(Ordering::Relaxed) }
}

/// `tp_dealloc`: untrack, release what the state holds (in place: the instance is unreachable,
/// so the Python code this may run can't see it), then recycle or free the memory.
unsafe extern "C" fn dealloc(object: *mut ffi::PyObject) {
    // SAFETY: CPython calls this once, holding the GIL, on a dead instance of our type whose
    // state is initialised. The state is released exactly once; the memory then either joins
    // the free list or goes back to the collector's allocator; instances of a heap type own a
    // reference to it, released last.
    unsafe {
        let ty = ffi::Py_TYPE(object);
        ffi::PyObject_GC_UnTrack(object.cast());
        let state = (*object.cast::<Instance>()).state.as_mut_ptr();
        // A panic must not unwind into CPython; none is expected (leaking beats aborting).
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            DLPackObject::release_attached_in_place(state);
        }));
        if !FREE.push(object) {
            ffi::PyObject_GC_Del(object.cast());
        }
        ffi::Py_DecRef(ty.cast());
    }
}

/// `tp_traverse`: the type (instances of heap types reference it), the producer and the
/// objects that own the memory.
unsafe extern "C" fn traverse(
    object: *mut ffi::PyObject,
    visit: ffi::visitproc,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: the collector only traverses live, tracked instances (tracked after their state
    // was written); `visit` is its callback, called with live objects.
    unsafe {
        let code = visit(ffi::Py_TYPE(object).cast(), arg);
        if code != 0 {
            return code;
        }
        state_unchecked(object).for_each_reference(|referenced| visit(referenced, arg))
    }
}

/// Run a fast path outside PyO3's entry points (`None`: not taken), catching panics (which
/// then send the call down the slow path) and raising its error, if any (attached to PyO3
/// for that, so that the error's references are released now rather than queued).
///
/// # Safety
/// The caller holds the GIL (CPython calling one of our functions).
unsafe fn fast_path<T: Into<PyErr>>(
    body: impl FnOnce(Python<'_>) -> Option<Result<*mut ffi::PyObject, T>>,
) -> Option<*mut ffi::PyObject> {
    // SAFETY: per the contract.
    let py = unsafe { Python::assume_attached() };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(py))) {
        Ok(Some(Ok(object))) => Some(object),
        Ok(Some(Err(err))) => {
            Python::attach(|py| err.into().restore(py));
            Some(ptr::null_mut())
        }
        Ok(None) | Err(_) => None,
    }
}

/// `asdlpack`'s C entry point: the fast path (`asdlpack_known`) directly, anything else through
/// PyO3's trampoline (`asdlpack_method`), which costs as much as the fast path's own work.
unsafe extern "C" fn asdlpack_entry(
    module: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    if nargs == 1 && kwnames.is_null() {
        // SAFETY: CPython calls us holding the GIL, with one positional argument it holds.
        let fast = unsafe {
            fast_path(|py| {
                let obj = pyo3::Borrowed::from_ptr(py, *args);
                super::asdlpack_known(&obj).map(|r| r.map(Bound::into_ptr))
            })
        };
        if let Some(result) = fast {
            return result;
        }
    }
    let slow = pyo3::impl_::trampoline::get_trampoline_function!(
        fastcall_cfunction_with_keywords,
        super::asdlpack_method
    );
    // SAFETY: as CPython called us.
    unsafe { slow(module, args, nargs, kwnames) }
}

/// `__dlpack__`'s C entry point: the common request directly (`dlpack_common`), anything else
/// through PyO3's trampoline (`dlpack_method`).
unsafe extern "C" fn dlpack_entry(
    object: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls us holding the GIL, on an instance of our type (the method
    // descriptor checks), with arguments as `dlpack_common` expects.
    let fast = unsafe { fast_path(|py| super::dlpack_common(py, object, args, nargs, kwnames)) };
    if let Some(result) = fast {
        return result;
    }
    let slow = pyo3::impl_::trampoline::get_trampoline_function!(
        fastcall_cfunction_with_keywords,
        super::dlpack_method
    );
    // SAFETY: as CPython called us.
    unsafe { slow(object, args, nargs, kwnames) }
}

/// A getter's body: the property's value.
type Getter = for<'py> fn(&DLPackObject, Python<'py>) -> PyResult<Bound<'py, PyAny>>;

/// `tp_getset` entry point: the closure is the `Getter` to call.
unsafe extern "C" fn get_property(
    object: *mut ffi::PyObject,
    getter: *mut c_void,
) -> *mut ffi::PyObject {
    let trampoline = pyo3::impl_::trampoline::get_trampoline_function!(binaryfunc, property_body);
    // SAFETY: CPython calls getters holding the GIL, on an instance of our type; the closure is
    // one of our `Getter`s (see `create_type`), passed through as the second argument.
    unsafe { trampoline(object, getter.cast()) }
}

/// # Safety
/// `object` is a live instance of our type; `getter` points at a `Getter`.
unsafe fn property_body(
    py: Python<'_>,
    object: *mut ffi::PyObject,
    getter: *mut ffi::PyObject,
) -> PyResult<*mut ffi::PyObject> {
    // SAFETY: per the contract.
    let (state, getter) = unsafe { (state_unchecked(object), &*getter.cast::<Getter>()) };
    Ok(getter(state, py)?.into_ptr())
}

/// # Safety
/// `object` is a live instance of our type.
unsafe fn repr_body(py: Python<'_>, object: *mut ffi::PyObject) -> PyResult<*mut ffi::PyObject> {
    // SAFETY: per the contract.
    let state = unsafe { state_unchecked(object) };
    Ok(pyo3::types::PyString::new(py, &state.repr()).into_ptr())
}

/// # Safety
/// `object` is a live instance of our type.
unsafe fn dlpack_device_body(
    py: Python<'_>,
    object: *mut ffi::PyObject,
) -> PyResult<*mut ffi::PyObject> {
    // SAFETY: per the contract.
    let state = unsafe { state_unchecked(object) };
    Ok(state.dlpack_device(py)?.into_ptr())
}

/// The properties: name, doc, body. The getter table points into this static.
static PROPERTIES: [(&CStr, &CStr, Getter); 14] = [
    (c"shape", c"Extents, as a tuple of ints.", |s, py| {
        s.shape(py).map(Bound::into_any)
    }),
    (
        c"strides",
        c"Strides in elements (as DLPack and torch count them, not bytes as numpy does), or None when the byte strides are not whole elements (then only a copy can be exported).",
        |s, py| s.strides(py),
    ),
    (c"byte_strides", c"Strides in bytes, as numpy counts them.", |s, py| {
        s.byte_strides(py).map(Bound::into_any)
    }),
    (
        c"copy_reason",
        c"Why exporting needs a copy (memory DLPack can't express as it is), or None.",
        |s, py| Ok(s.tensor.exportable().err().into_pyobject(py)?.into_any()),
    ),
    (c"ndim", c"Number of dimensions.", |s, py| {
        Ok(s.tensor.layout.ndim().into_pyobject(py)?.into_any())
    }),
    (c"dtype", c"Element type name, e.g. \"float32\" or \"bfloat16\".", |s, py| {
        Ok(s.tensor.dtype.name().into_pyobject(py)?.into_any())
    }),
    (c"itemsize", c"Bytes per element.", |s, py| {
        Ok(s.tensor.dtype.itemsize().into_pyobject(py)?.into_any())
    }),
    (c"nbytes", c"Bytes of the elements, if stored densely.", |s, py| {
        Ok(s.tensor.nbytes().into_pyobject(py)?.into_any())
    }),
    (
        c"c_contiguous",
        c"Whether the elements are dense in C (row-major) order.",
        |s, py| Ok(pyo3::types::PyBool::new(py, s.tensor.layout.is_c_contiguous()).to_owned().into_any()),
    ),
    (
        c"f_contiguous",
        c"Whether the elements are dense in Fortran (column-major) order.",
        |s, py| Ok(pyo3::types::PyBool::new(py, s.tensor.layout.is_f_contiguous()).to_owned().into_any()),
    ),
    (c"readonly", c"Whether the memory is read-only.", |s, py| {
        Ok(pyo3::types::PyBool::new(py, s.tensor.readonly).to_owned().into_any())
    }),
    (
        c"device",
        c"(device_type, device_id), as __dlpack_device__() returns it.",
        |s, py| s.dlpack_device(py).map(Bound::into_any),
    ),
    (c"data_ptr", c"Address of the first element.", |s, py| {
        Ok((s.tensor.data as usize).into_pyobject(py)?.into_any())
    }),
    (
        c"stream",
        c"The CUDA stream a __cuda_array_interface__ producer declared, or None.",
        |s, py| Ok(s.tensor.stream.map(|s| s as i64).into_pyobject(py)?.into_any()),
    ),
];

/// Create the type (once per process: the definitions it points to are leaked).
fn create_type(py: Python<'_>) -> PyResult<*mut ffi::PyTypeObject> {
    let dlpack_device =
        pyo3::impl_::trampoline::get_trampoline_function!(noargs, dlpack_device_body);
    let methods: &'static mut [ffi::PyMethodDef] = Box::leak(Box::new([
        ffi::PyMethodDef {
            ml_name: c"__dlpack__".as_ptr(),
            ml_meth: ffi::PyMethodDefPointer {
                PyCFunctionFastWithKeywords: dlpack_entry,
            },
            ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
            ml_doc: c"__dlpack__($self, *, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\nA DLPack capsule of this object's memory (array API standard arguments).".as_ptr(),
        },
        ffi::PyMethodDef {
            ml_name: c"__dlpack_device__".as_ptr(),
            ml_meth: ffi::PyMethodDefPointer {
                PyCFunction: dlpack_device,
            },
            ml_flags: ffi::METH_NOARGS,
            ml_doc: c"__dlpack_device__($self, /)\n--\n\n(device_type, device_id) of the memory.".as_ptr(),
        },
        ffi::PyMethodDef::zeroed(),
    ]));
    let getset: &'static mut [ffi::PyGetSetDef] = Box::leak(
        PROPERTIES
            .iter()
            .map(|(name, doc, getter)| ffi::PyGetSetDef {
                name: name.as_ptr(),
                get: Some(get_property),
                set: None,
                doc: doc.as_ptr(),
                closure: ptr::from_ref(getter).cast_mut().cast(),
            })
            .chain([ffi::PyGetSetDef::default()])
            .collect::<Box<[_]>>(),
    );
    let repr = pyo3::impl_::trampoline::get_trampoline_function!(reprfunc, repr_body);
    let mut slots = [
        ffi::PyType_Slot {
            slot: ffi::Py_tp_dealloc,
            pfunc: dealloc as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: ffi::Py_tp_traverse,
            pfunc: traverse as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: ffi::Py_tp_free,
            pfunc: ffi::PyObject_GC_Del as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: ffi::Py_tp_repr,
            pfunc: repr as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: ffi::Py_tp_methods,
            pfunc: methods.as_mut_ptr().cast(),
        },
        ffi::PyType_Slot {
            slot: ffi::Py_tp_getset,
            pfunc: getset.as_mut_ptr().cast(),
        },
        ffi::PyType_Slot {
            slot: ffi::Py_tp_doc,
            pfunc: c"A DLPack view of another object's memory: pass it to any from_dlpack."
                .as_ptr()
                .cast_mut()
                .cast(),
        },
        ffi::PyType_Slot::default(),
    ];
    let mut spec = ffi::PyType_Spec {
        name: c"dlpack.DLPackObject".as_ptr(),
        basicsize: std::mem::size_of::<Instance>() as c_int,
        itemsize: 0,
        // Final (no BASETYPE), made only by asdlpack (no constructor).
        flags: (ffi::Py_TPFLAGS_DEFAULT
            | ffi::Py_TPFLAGS_HAVE_GC
            | ffi::Py_TPFLAGS_DISALLOW_INSTANTIATION) as _,
        slots: slots.as_mut_ptr(),
    };
    // SAFETY: the spec and slots are valid for the call (CPython copies what it keeps, except
    // the method and getset tables, which are leaked above and so live forever).
    let ty = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyType_FromSpec(&mut spec))? };
    Ok(ty.into_ptr().cast())
}

/// The module function `asdlpack`, bound to `module` (a plain CPython function: see
/// `asdlpack_method` for why its arguments are read by hand).
pub fn asdlpack_function<'py>(
    module: &Bound<'py, pyo3::types::PyModule>,
) -> PyResult<Bound<'py, PyAny>> {
    // The definition must outlive the function: one leaked per module initialisation.
    let def: &'static mut ffi::PyMethodDef = Box::leak(Box::new(ffi::PyMethodDef {
        ml_name: c"asdlpack".as_ptr(),
        ml_meth: ffi::PyMethodDefPointer {
            PyCFunctionFastWithKeywords: asdlpack_entry,
        },
        ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
        ml_doc: c"asdlpack(obj)\n--\n\nWrap obj (anything with DLPack, the CUDA array interface, the array interface or the buffer protocol) in a DLPackObject, without copying.".as_ptr(),
    }));
    let name = module.name()?;
    // SAFETY: `def` lives forever; the module and its name are live objects.
    unsafe {
        Bound::from_owned_ptr_or_err(
            module.py(),
            ffi::PyCFunction_NewEx(def, module.as_ptr(), name.as_ptr()),
        )
    }
}
