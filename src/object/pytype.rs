//! The `DLPackObject` Python type, written against CPython's type API (through
//! `crate::ffi::python`) instead of as a PyO3 `#[pyclass]`: `asdlpack` makes one object per
//! call, so its allocation, deallocation and entry points are part of every exchange. Here, the
//! type and its entry points: `asdlpack`, `__dlpack__` and `__dlpack_device__` serve their
//! common case directly, without attaching through PyO3; everything else runs in `entry`, on
//! PyO3's public API, which raises errors and stops panics at the boundary. Instances (their
//! memory, free list, deallocation) are `instance`'s.

use std::ffi::{CStr, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyModule, PyString, PyType};

use super::instance::{self, Instance, dealloc, state_unchecked, traverse};
use super::state::DLPackObject;
use super::{arguments, asdlpack, exchange_api, methods, pickling};
use crate::error::{Result, at_c_boundary};
use crate::export::policy::{self, Request};
use crate::export::{arrow, buffer, capsule};
use crate::ffi::arrow::Method;
use crate::ffi::python::{self, Py_ssize_t, PyObject, PyTypeObject};
use crate::import::array_interface::to_i64;

/// The `DLPackObject` type, created on first use (module initialisation).
pub fn type_object(py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
    let mut ty = instance::type_ptr();
    if ty.is_null() {
        arguments::intern_keywords(py);
        ty = create_type(py)?;
        // SAFETY: the type just made, whose reference is never released.
        unsafe { instance::set_type(ty) };
        // SAFETY: `ty` is the live type just made (its one reference is never released), and we
        // hold the GIL (`py`).
        let made = unsafe { Bound::from_borrowed_ptr(py, ty.cast()) };
        // For C consumers (tvm-ffi, torch) that skip the Python `__dlpack__` call.
        made.setattr("__dlpack_c_exchange_api__", exchange_api::capsule(py)?)?;
    }
    // SAFETY: `ty` is a live type object (one reference is never released).
    let ty = unsafe { Bound::from_borrowed_ptr(py, ty.cast()) };
    // SAFETY: a type object.
    Ok(unsafe { ty.cast_into_unchecked() })
}

// -- entry points -----------------------------------------------------------------------------

/// Run an entry point's body attached to Python through PyO3's public `Python::attach` (so the
/// references it drops are released at once), raising its error, or a panic as a RuntimeError
/// that names it (not PyO3's `PanicException`, a BaseException that `except Exception` misses),
/// and returning `failed` (NULL, or -1) for either.
fn entry<T>(failed: T, body: impl FnOnce(Python<'_>) -> PyResult<T>) -> T {
    Python::attach(|py| at_c_boundary(py, failed, body))
}

/// Run a fast path without attaching through PyO3 (`None`: not taken), catching panics (which
/// then send the call down the slow path) and raising its error, if any (attached for that, so
/// that the error's references are released now rather than queued).
///
/// # Safety
/// The caller holds the GIL (CPython calling one of our functions).
#[inline(always)]
unsafe fn fast_path(
    body: impl FnOnce(Python<'_>) -> Option<Result<*mut PyObject>>,
) -> Option<*mut PyObject> {
    // SAFETY: the caller holds the GIL (this function's contract), as `assume_attached` requires.
    let py = unsafe { Python::assume_attached() };
    match catch_unwind(AssertUnwindSafe(|| body(py))) {
        Ok(Some(Ok(object))) => Some(object),
        Ok(Some(Err(err))) => {
            Python::attach(|py| PyErr::from(err).restore(py));
            Some(ptr::null_mut())
        }
        Ok(None) | Err(_) => None,
    }
}

/// `asdlpack`'s C entry point: a `DLPackObject` or an exact ndarray of a known dtype directly
/// (`asdlpack_known`), anything else (and argument errors) through `entry`.
unsafe extern "C" fn asdlpack_entry(
    _module: *mut PyObject,
    args: *const *mut PyObject,
    nargs: Py_ssize_t,
    kwnames: *mut PyObject,
) -> *mut PyObject {
    if nargs == 1 && kwnames.is_null() {
        let body = |py: Python<'_>| {
            // SAFETY: `nargs` is 1, so CPython's fast-call `args` points at one argument.
            let obj = unsafe { *args };
            // SAFETY: `obj` is a live argument CPython holds for the call, and we hold the GIL
            // (`py`).
            let obj = unsafe { Borrowed::from_ptr(py, obj) };
            let made = asdlpack::asdlpack_known(&obj)?;
            Some(made.map(Bound::into_ptr).map_err(Into::into))
        };
        // SAFETY: CPython calls this entry point holding the GIL, as `fast_path` requires.
        let fast = unsafe { fast_path(body) };
        if let Some(result) = fast {
            return result;
        }
    }
    entry(ptr::null_mut(), |py| {
        // SAFETY: CPython calls us holding the GIL, with fast-call arguments.
        let obj = unsafe { arguments::asdlpack_argument(py, args, nargs, kwnames)? };
        Ok(asdlpack::asdlpack(&obj)?.into_ptr())
    })
}

/// `__dlpack__`'s C entry point: the common request directly (`dlpack_common`), anything else
/// through `entry` (`dlpack_general`).
unsafe extern "C" fn dlpack_entry(
    object: *mut PyObject,
    args: *const *mut PyObject,
    nargs: Py_ssize_t,
    kwnames: *mut PyObject,
) -> *mut PyObject {
    // SAFETY: CPython calls this method holding the GIL, on `object`, a live instance of our type
    // (the method descriptor checks), with fast-call arguments, as `dlpack_common` requires.
    let common = |py: Python<'_>| unsafe { dlpack_common(py, object, args, nargs, kwnames) };
    // SAFETY: CPython calls this method holding the GIL, as `fast_path` requires.
    let fast = unsafe { fast_path(common) };
    if let Some(result) = fast {
        return result;
    }
    // SAFETY: CPython calls this method holding the GIL, on `object`, a live instance of our type
    // (the method descriptor checks), with fast-call arguments, as `dlpack_general` requires.
    entry(ptr::null_mut(), |py| unsafe {
        dlpack_general(py, object, args, nargs, kwnames)
    })
}

/// `__dlpack__`'s common request: keywords passed the common way, no stream or device, host
/// memory exported in place (`policy::in_place`). Runs no Python code and makes no errors of
/// its own. `None`: take `dlpack_general`, which also gives errors; `Some(Err)`: the capsule
/// could not be made.
///
/// # Safety
/// Called holding the GIL with `slf` a live instance of our type, and fast-call arguments.
#[inline(always)]
unsafe fn dlpack_common(
    py: Python<'_>,
    slf: *mut PyObject,
    args: *const *mut PyObject,
    nargs: Py_ssize_t,
    kwnames: *mut PyObject,
) -> Option<Result<*mut PyObject>> {
    // SAFETY: `slf` is a live instance of our type (this function's contract), which its caller
    // holds for the call.
    let object = unsafe { state_unchecked(slf) };
    // SAFETY: `args`, `nargs` and `kwnames` are fast-call arguments as CPython passes them, and we
    // hold the GIL (this function's contract).
    let values = unsafe { arguments::common_arguments(args, nargs, kwnames)? };
    // SAFETY: `slf` is the live object whose state `object` is, and the values are null or live
    // arguments CPython holds for the call (this function's contract); we hold the GIL (`py`).
    unsafe { dlpack_in_place(py, object, slf, values) }
}

/// `__dlpack__` of `slf` (whose state is `object`) for the common request, from its keyword
/// values in `arguments::KEYWORDS` order (null for absent or None): no stream or device, host
/// memory exported in place. `None` for any other request (the general path then accepts or
/// rejects it); a new reference to the capsule otherwise.
///
/// # Safety
/// Called holding the GIL, with `slf` the live object whose state `object` is, and each value
/// null or a live object.
#[inline(always)]
pub(super) unsafe fn dlpack_in_place(
    py: Python<'_>,
    object: &DLPackObject,
    slf: *mut PyObject,
    [stream, max_version, dl_device, copy]: [*mut PyObject; 4],
) -> Option<Result<*mut PyObject>> {
    if !stream.is_null() || !dl_device.is_null() {
        return None;
    }
    let versioned_minor = if max_version.is_null() {
        None
    } else {
        // SAFETY: a live argument, and we hold the GIL (this function's contract).
        unsafe { arguments::versioned_minor(py, max_version)? }
    };
    let (_, false_) = python::none_and_false();
    let copy = match copy {
        c if c.is_null() => None,
        c if c == false_ => Some(false),
        _ => return None,
    };
    let request = Request::new(None, versioned_minor, None, copy);
    let (device, kind) = policy::in_place(object.tensor(), &request)?;
    // SAFETY: `slf` is a live object (this function's contract), and we hold the GIL (`py`); the
    // capsule takes a reference of its own.
    let slf = unsafe { Borrowed::from_ptr(py, slf) };
    let described = object.lent(&slf);
    Some(capsule::to_capsule(py, described, device, kind).map(Bound::into_ptr))
}

/// `__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)` in general: the
/// arguments checked as the array API standard says, then exported as the policy decides.
///
/// # Safety
/// As for `dlpack_common`.
unsafe fn dlpack_general(
    py: Python<'_>,
    slf: *mut PyObject,
    args: *const *mut PyObject,
    nargs: Py_ssize_t,
    kwnames: *mut PyObject,
) -> PyResult<*mut PyObject> {
    // SAFETY: `slf` is a live instance of our type (this function's contract, as
    // `dlpack_common`'s), which its caller holds for the call.
    let object = unsafe { state_unchecked(slf) };
    // SAFETY: `args`, `nargs` and `kwnames` are fast-call arguments as CPython passes them, and we
    // hold the GIL (this function's contract); the values are used within the call.
    let values = unsafe { arguments::dlpack_arguments(py, args, nargs, kwnames)? };
    // SAFETY: `slf` is a live object (this function's contract), and we hold the GIL (`py`).
    let slf = unsafe { Bound::from_borrowed_ptr(py, slf) };
    let [stream, max_version, dl_device, copy] = &values;
    let request = arguments::parse_request(
        stream.as_deref(),
        max_version.as_deref(),
        dl_device.as_deref(),
        copy.as_deref(),
    )?;
    Ok(object.export(&slf, request)?.into_ptr())
}

/// `__dlpack_device__()`: asked on every torch exchange, so CPU memory's answer (one shared
/// tuple, once made) is given directly.
unsafe extern "C" fn dlpack_device_entry(
    object: *mut PyObject,
    _unused: *mut PyObject,
) -> *mut PyObject {
    // SAFETY: CPython calls us holding the GIL, on a live instance of our type.
    let state = unsafe { state_unchecked(object) };
    // SAFETY: CPython calls us holding the GIL, as `cached_dlpack_device` requires.
    if let Some(tuple) = unsafe { state.cached_dlpack_device() } {
        return tuple;
    }
    entry(ptr::null_mut(), |py| {
        Ok(state.dlpack_device(py)?.into_ptr())
    })
}

/// `__reduce_ex__(protocol)`: see `pickling` (host memory lent to protocol 5 as an out-of-band
/// buffer).
unsafe extern "C" fn reduce_ex_entry(
    object: *mut PyObject,
    protocol: *mut PyObject,
) -> *mut PyObject {
    entry(ptr::null_mut(), |py| {
        // SAFETY: CPython calls methods holding the GIL, with live arguments it holds for the call.
        let slf = unsafe { Borrowed::from_ptr(py, object) };
        // SAFETY: `protocol` is a live argument CPython holds for the call, and we hold the GIL
        // (`py`).
        let protocol = unsafe { Borrowed::from_ptr(py, protocol) };
        let protocol = to_i64(&protocol, "protocol")?;
        // SAFETY: CPython calls methods on live instances of their type.
        let state = unsafe { state_unchecked(object) };
        Ok(pickling::reduce_ex(&slf, state, protocol)?
            .into_any()
            .into_ptr())
    })
}

/// The Arrow methods' entry: `(requested_schema=None)` (and, for the device ones, `**kwargs`
/// that are None), then the export of the method numbered `METHOD`: see `export::arrow`.
///
/// # Safety
/// As for any method's entry point: CPython calls it holding the GIL, on a live instance of our
/// type, with live fast-call arguments it holds for the call.
unsafe extern "C" fn arrow_entry<const METHOD: u8>(
    object: *mut PyObject,
    args: *const *mut PyObject,
    nargs: Py_ssize_t,
    kwnames: *mut PyObject,
) -> *mut PyObject {
    let method = const { Method::numbered::<METHOD>() };
    entry(ptr::null_mut(), |py| {
        // SAFETY: CPython calls this holding the GIL, with fast-call arguments it holds for the
        // call (this function's contract), as `optional_argument` requires.
        let requested = unsafe {
            arguments::optional_argument(
                py,
                args,
                nargs,
                kwnames,
                method.name(),
                "requested_schema",
                method.is_device(),
            )?
        };
        // SAFETY: `object` is a live instance CPython holds for the call (this function's
        // contract), and we hold the GIL (`py`).
        let slf = unsafe { Borrowed::from_ptr(py, object) };
        // SAFETY: CPython calls methods on live instances of their type.
        let state = unsafe { state_unchecked(object) };
        let requested = requested.map(|r| r.to_owned());
        let exported = arrow::export_method(&slf, state.tensor(), requested.as_ref(), method)?;
        Ok(exported.into_ptr())
    })
}

unsafe extern "C" fn repr_entry(object: *mut PyObject) -> *mut PyObject {
    // SAFETY: CPython calls us holding the GIL, on a live instance of our type.
    let state = unsafe { state_unchecked(object) };
    entry(ptr::null_mut(), |py| {
        Ok(PyString::new(py, &state.repr()).into_ptr())
    })
}

/// A getter's body: the property's value, from the state and the object itself.
type Getter = for<'py> fn(&DLPackObject, &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>;

/// `tp_getset` entry point: the closure is the `Getter` to call.
unsafe extern "C" fn get_property(object: *mut PyObject, getter: *mut c_void) -> *mut PyObject {
    // SAFETY: CPython calls getters holding the GIL, on a live instance of our type.
    let state = unsafe { state_unchecked(object) };
    // SAFETY: the closure is one of our `Getter`s, which live forever (see `create_type`).
    let getter = unsafe { &*getter.cast::<Getter>() };
    entry(ptr::null_mut(), |py| {
        // SAFETY: CPython calls getters holding the GIL (`py`), on a live object it holds for the
        // call.
        let slf = unsafe { Borrowed::from_ptr(py, object) };
        Ok(getter(state, &slf)?.into_ptr())
    })
}

/// `bf_getbuffer`: host memory lent as it is without attaching through PyO3 (`export::buffer`
/// fills the view from the layout, allocating nothing); a copy or an error through `entry`.
unsafe extern "C" fn get_buffer_entry(
    object: *mut PyObject,
    view: *mut python::Py_buffer,
    flags: c_int,
) -> c_int {
    // The view holds a reference to the object that owns the memory lent.
    // SAFETY: CPython passes a writable `view`; a null `obj` is what a failed request leaves, as
    // PEP 3118 says.
    unsafe { (*view).obj = ptr::null_mut() };
    // SAFETY: CPython calls `bf_getbuffer` holding the GIL, on a live instance of our (final) type
    // that it holds for the call.
    let state = unsafe { state_unchecked(object) };
    if let Ok(buffer::Lend::InPlace) = buffer::lend(state.tensor(), flags) {
        // SAFETY: CPython passes a writable `view` and holds the GIL; `object` keeps its own tensor
        // alive and unchanged (the state is immutable).
        unsafe { buffer::fill(view, object, state.tensor(), flags) };
        return 0;
    }
    entry(-1, |py| {
        // SAFETY: `object` is a live object CPython holds for the call, and we hold the GIL (`py`).
        let slf = unsafe { Borrowed::from_ptr(py, object) };
        // SAFETY: CPython passes a writable `view`; `slf` is the object whose state `state` is.
        unsafe { lend_buffer(slf, state, view, flags)? };
        Ok(0)
    })
}

/// Fill `view` with `slf`'s memory (its state is `state`) as `flags` ask: in place, or a
/// read-only, C-ordered copy where the memory can't be lent as it is.
///
/// # Safety
/// `view` is writable; `slf` is the live object whose state `state` is.
pub(super) unsafe fn lend_buffer(
    slf: Borrowed<'_, '_, PyAny>,
    state: &DLPackObject,
    view: *mut python::Py_buffer,
    flags: c_int,
) -> PyResult<()> {
    let py = slf.py();
    let (owner, lent) = match buffer::lend(state.tensor(), flags)? {
        buffer::Lend::InPlace => (slf.to_owned(), state),
        buffer::Lend::Copy(_) => {
            let copy = state.read_only_copy(py)?;
            // SAFETY: a new DLPackObject, held by `copy` past this use.
            let lent = unsafe { state_unchecked(copy.as_ptr()) };
            if let buffer::Lend::Copy(reason) = buffer::lend(lent.tensor(), flags)? {
                return Err(crate::error::Error::buffer(reason).into());
            }
            (copy, lent)
        }
    };
    // SAFETY: `view` is writable (this function's contract); `owner` keeps the tensor it lends
    // alive and unchanged; we hold the GIL (`py`).
    unsafe { buffer::fill(view, owner.as_ptr(), lent.tensor(), flags) };
    Ok(())
}

/// The properties: name, doc, body. The getter table points into this static.
static PROPERTIES: [(&CStr, &CStr, Getter); 17] = [
    (c"shape", c"Extents, as a tuple of ints.", |s, o| {
        s.shape(o.py()).map(Bound::into_any)
    }),
    (
        c"strides",
        c"Strides in elements (as DLPack and torch count them, not bytes as numpy does), or None when the byte strides are not whole elements (then only a copy can be exported).",
        |s, o| s.strides(o.py()),
    ),
    (c"byte_strides", c"Strides in bytes, as numpy counts them.", |s, o| {
        s.byte_strides(o.py()).map(Bound::into_any)
    }),
    (
        c"copy_reason",
        c"Why exporting needs a copy (memory DLPack can't express as it is), or why the object's memory is a copy made when it was made (Arrow booleans, chunks, tables); None when exports share the source's memory.",
        |s, o| {
            let tensor = s.tensor();
            let why = tensor.exportable().err().or_else(|| tensor.copied());
            Ok(why.into_pyobject(o.py())?.into_any())
        },
    ),
    (c"ndim", c"Number of dimensions.", |s, o| {
        Ok(s.tensor().layout().ndim().into_pyobject(o.py())?.into_any())
    }),
    (
        c"dtype",
        c"The element type: a numpy.dtype where numpy can be imported (ml_dtypes' types, such as bfloat16, where ml_dtypes can), else its name, e.g. \"float32\".",
        |s, o| methods::dtype_object(o.py(), s.tensor().dtype()),
    ),
    (c"itemsize", c"Bytes per element.", |s, o| {
        Ok(s.tensor().dtype().itemsize().into_pyobject(o.py())?.into_any())
    }),
    (c"nbytes", c"Bytes of the elements, if stored densely.", |s, o| {
        Ok(s.tensor().nbytes().into_pyobject(o.py())?.into_any())
    }),
    (
        c"c_contiguous",
        c"Whether the elements are dense in C (row-major) order.",
        |s, o| Ok(PyBool::new(o.py(), s.tensor().layout().is_c_contiguous()).to_owned().into_any()),
    ),
    (
        c"f_contiguous",
        c"Whether the elements are dense in Fortran (column-major) order.",
        |s, o| Ok(PyBool::new(o.py(), s.tensor().layout().is_f_contiguous()).to_owned().into_any()),
    ),
    (c"readonly", c"Whether the memory is read-only.", |s, o| {
        Ok(PyBool::new(o.py(), s.tensor().readonly()).to_owned().into_any())
    }),
    (
        c"device",
        c"(device_type, device_id), as __dlpack_device__() returns it.",
        |s, o| s.dlpack_device(o.py()).map(Bound::into_any),
    ),
    (c"data_ptr", c"Address of the first element.", |s, o| {
        Ok((s.tensor().data() as usize).into_pyobject(o.py())?.into_any())
    }),
    (
        c"stream",
        c"The CUDA stream a __cuda_array_interface__ producer declared, or None.",
        |s, o| Ok(s.tensor().stream().map(|s| s as i64).into_pyobject(o.py())?.into_any()),
    ),
    (
        c"__array_interface__",
        c"numpy's array interface (version 3) of host memory; AttributeError for device memory.",
        |s, o| s.array_interface(o),
    ),
    (
        c"__array_struct__",
        c"numpy's C-level array interface (a PyArrayInterface capsule) of host memory; AttributeError where it can't describe the memory in place.",
        |s, o| s.array_struct(o),
    ),
    (
        c"__cuda_array_interface__",
        c"The CUDA array interface (version 3) of CUDA memory; AttributeError for host memory.",
        |s, o| s.cuda_array_interface(o),
    ),
];

/// The method definition of Arrow method `METHOD` (see `arrow_entry`), with its docstring
/// (whose first line is its signature).
fn arrow_method<const METHOD: u8>(doc: &'static CStr) -> python::PyMethodDef {
    python::PyMethodDef {
        ml_name: const { Method::numbered::<METHOD>() }.c_name().as_ptr(),
        ml_meth: python::PyMethodDefPointer {
            PyCFunctionFastWithKeywords: arrow_entry::<METHOD>,
        },
        ml_flags: python::METH_FASTCALL | python::METH_KEYWORDS,
        ml_doc: doc.as_ptr(),
    }
}

/// Create the type (once per process: the definitions it points to are leaked).
fn create_type(py: Python<'_>) -> PyResult<*mut PyTypeObject> {
    let methods: &'static mut [python::PyMethodDef] = Box::leak(Box::new([
        python::PyMethodDef {
            ml_name: c"__dlpack__".as_ptr(),
            ml_meth: python::PyMethodDefPointer {
                PyCFunctionFastWithKeywords: dlpack_entry,
            },
            ml_flags: python::METH_FASTCALL | python::METH_KEYWORDS,
            ml_doc: c"__dlpack__($self, *, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\nA DLPack capsule of this object's memory (array API standard arguments).".as_ptr(),
        },
        python::PyMethodDef {
            ml_name: c"__dlpack_device__".as_ptr(),
            ml_meth: python::PyMethodDefPointer {
                PyCFunction: dlpack_device_entry,
            },
            ml_flags: python::METH_NOARGS,
            ml_doc: c"__dlpack_device__($self, /)\n--\n\n(device_type, device_id) of the memory.".as_ptr(),
        },
        python::PyMethodDef {
            ml_name: c"__reduce_ex__".as_ptr(),
            ml_meth: python::PyMethodDefPointer {
                PyCFunction: reduce_ex_entry,
            },
            ml_flags: python::METH_O,
            ml_doc: c"__reduce_ex__($self, protocol, /)\n--\n\nPickle support: host memory is pickled as an out-of-band buffer with protocol 5 (no copy), in-band before; device memory can't be pickled.".as_ptr(),
        },
        arrow_method::<{ Method::Array as u8 }>(
            c"__arrow_c_array__($self, requested_schema=None, /)\n--\n\nThe Arrow PyCapsule interface: (schema, array) capsules of host memory. 1-D numbers as they are; N-d C-ordered memory as an arrow.fixed_shape_tensor; other layouts one C-ordered copy. A requested_schema of this element type whose rows are the array's last dimensions (a column, nested fixed-size lists, an arrow.fixed_shape_tensor) is given as asked; any other is a ValueError.",
        ),
        arrow_method::<{ Method::Stream as u8 }>(
            c"__arrow_c_stream__($self, requested_schema=None, /)\n--\n\nThe Arrow PyCapsule interface: a stream capsule of host memory, whose one array is the one __arrow_c_array__ gives.",
        ),
        arrow_method::<{ Method::DeviceArray as u8 }>(
            c"__arrow_c_device_array__($self, requested_schema=None, **kwargs)\n--\n\nThe Arrow PyCapsule interface's device variant: (schema, device array) capsules of host memory, as the CPU's (device id -1, no event); the array is __arrow_c_array__'s. Other keywords must be None.",
        ),
        arrow_method::<{ Method::DeviceStream as u8 }>(
            c"__arrow_c_device_stream__($self, requested_schema=None, **kwargs)\n--\n\nThe Arrow PyCapsule interface's device variant: a device stream capsule of host memory (the CPU's), whose one array is the one __arrow_c_device_array__ gives. Other keywords must be None.",
        ),
        python::PyMethodDef::zeroed(),
    ]));
    let getset: &'static mut [python::PyGetSetDef] = Box::leak(
        PROPERTIES
            .iter()
            .map(|(name, doc, getter)| python::PyGetSetDef {
                name: name.as_ptr(),
                get: Some(get_property),
                set: None,
                doc: doc.as_ptr(),
                closure: ptr::from_ref(getter).cast_mut().cast(),
            })
            .chain([python::PyGetSetDef::default()])
            .collect::<Box<[_]>>(),
    );
    let slot = |slot, pfunc: *mut c_void| python::PyType_Slot { slot, pfunc };
    let mut slots = [
        slot(python::Py_tp_dealloc, dealloc as *mut c_void),
        slot(python::Py_tp_traverse, traverse as *mut c_void),
        slot(python::Py_tp_free, python::FREE_INSTANCE as *mut c_void),
        slot(python::Py_tp_repr, repr_entry as *mut c_void),
        slot(python::Py_tp_methods, methods.as_mut_ptr().cast()),
        slot(python::Py_tp_getset, getset.as_mut_ptr().cast()),
        slot(python::Py_bf_getbuffer, get_buffer_entry as *mut c_void),
        slot(
            python::Py_tp_doc,
            c"A DLPack view of another object's memory: pass it to any from_dlpack."
                .as_ptr()
                .cast_mut()
                .cast(),
        ),
        python::PyType_Slot::default(),
    ];
    let mut spec = python::PyType_Spec {
        name: c"dlpack.DLPackObject".as_ptr(),
        basicsize: std::mem::size_of::<Instance>() as c_int,
        itemsize: 0,
        // Final (no BASETYPE), made only by asdlpack (no constructor).
        flags: (python::Py_TPFLAGS_DEFAULT
            | python::Py_TPFLAGS_HAVE_GC
            | python::Py_TPFLAGS_DISALLOW_INSTANTIATION) as _,
        slots: slots.as_mut_ptr(),
    };
    // SAFETY: the spec and slots are valid for the call (CPython copies what it keeps, except
    // the method and getset tables, which are leaked above and so live forever); we hold the
    // GIL (`py`).
    let ty = unsafe { python::type_from_spec(&mut spec) };
    // SAFETY: a new reference, or null with an exception raised.
    let ty = unsafe { Bound::from_owned_ptr_or_err(py, ty)? };
    Ok(ty.into_ptr().cast())
}

/// The module function `asdlpack`, bound to `module` (a plain CPython function: see
/// `arguments` for why its arguments are read by hand).
pub fn asdlpack_function<'py>(module: &Bound<'py, PyModule>) -> PyResult<Bound<'py, PyAny>> {
    // The definition must outlive the function: one leaked per module initialisation.
    let def: &'static mut python::PyMethodDef = Box::leak(Box::new(python::PyMethodDef {
        ml_name: c"asdlpack".as_ptr(),
        ml_meth: python::PyMethodDefPointer {
            PyCFunctionFastWithKeywords: asdlpack_entry,
        },
        ml_flags: python::METH_FASTCALL | python::METH_KEYWORDS,
        ml_doc: c"asdlpack(obj)\n--\n\nWrap obj (anything with DLPack, the CUDA array interface, the array interface or the buffer protocol) in a DLPackObject, without copying.".as_ptr(),
    }));
    let name = module.name()?;
    // SAFETY: `def` lives forever; the module and its name are live objects; we hold the GIL.
    let function = unsafe { python::new_function(def, module.as_ptr(), name.as_ptr()) };
    // SAFETY: a new reference, or null with an exception raised.
    unsafe { Bound::from_owned_ptr_or_err(module.py(), function) }
}
