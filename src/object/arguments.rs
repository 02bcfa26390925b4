//! Reading `asdlpack`'s and `__dlpack__`'s arguments as CPython passes them to fast-call
//! functions (`args` then one value per name in `kwnames`), by hand: PyO3's general parser cost
//! as much as the export itself. Consumers name keywords with interned strings (Python code) or
//! with their own strings (numpy's C code), so names are matched by address first, then by
//! contents.

use std::sync::atomic::{AtomicUsize, Ordering};

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyString, PyTuple};

use crate::error::{Error, Result};
use crate::export::policy::{Request, reported_minor};
use crate::ffi::python::{self, Latch, Py_ssize_t, PyObject};
use crate::import::array_interface::{to_i64, type_name};
use dlpack_core::abi::DLDevice;
use dlpack_core::abi::c_array;

/// `__dlpack__`'s parameters, all keyword-only, in signature order.
pub const KEYWORDS: [&str; 4] = ["stream", "max_version", "dl_device", "copy"];

/// `KEYWORDS`, interned (as CPython interns names in calls), by address: written at module
/// initialisation, read by every call (only compared, so a call racing the initialisation at
/// worst takes the slower path).
static KEYWORD_NAMES: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

/// Intern `KEYWORDS` once (module initialisation); the table keeps them alive.
pub fn intern_keywords(py: Python<'_>) {
    for (slot, name) in KEYWORDS.iter().enumerate() {
        let name = PyString::intern(py, name);
        // The reference leaked into the table keeps the interned name, and so its address,
        // alive.
        KEYWORD_NAMES[slot].store(name.into_ptr() as usize, Ordering::Relaxed);
    }
}

/// The `KEYWORDS` slot `name` is, if it is one of our interned names (compared by address).
#[inline(always)]
fn interned_keyword_slot(name: *mut PyObject) -> Option<usize> {
    KEYWORD_NAMES
        .iter()
        .position(|n| n.load(Ordering::Relaxed) == name as usize)
}

/// The parameter a keyword names, for names that are not our interned strings.
fn keyword_slot(name: &Bound<'_, PyAny>) -> Option<usize> {
    let name = name.cast::<PyString>().ok()?;
    // SAFETY: `name` is a live str, and we hold the GIL (`name` proves it).
    let length = unsafe { python::str_length(name.as_ptr()) };
    let slot = KEYWORDS.iter().position(|k| k.len() as isize == length)?;
    (name.to_str().ok()? == KEYWORDS[slot]).then_some(slot)
}

/// `__dlpack__`'s arguments when passed the common way, for its fast path: keywords only, each
/// named by the interned string (as Python code and numpy name them) and given once. Values in
/// `KEYWORDS` order, null for absent or None; `None` for any other call (`dlpack_arguments`
/// then accepts or rejects it).
///
/// # Safety
/// As CPython passes fast-call arguments, holding the GIL.
#[inline(always)]
pub unsafe fn common_arguments(
    args: *const *mut PyObject,
    nargs: Py_ssize_t,
    kwnames: *mut PyObject,
) -> Option<[*mut PyObject; 4]> {
    let mut values = [std::ptr::null_mut(); 4];
    if nargs != 0 {
        return None;
    }
    if kwnames.is_null() {
        return Some(values);
    }
    let (none, _) = python::none_and_false();
    // SAFETY: `kwnames`, not null, is the live tuple of keyword names CPython passes, and we hold
    // the GIL (this function's contract).
    let keywords = unsafe { python::tuple_size(kwnames) };
    // SAFETY: CPython passes one live value per keyword name at `args`, after the zero positional
    // ones, unchanged for the call (this function's contract).
    let given = unsafe { c_array(args, keywords as usize) };
    for (k, &value) in given.iter().enumerate() {
        // SAFETY: `k` is below the size of `kwnames`, a live tuple, and we hold the GIL (this
        // function's contract).
        let name = unsafe { python::tuple_item(kwnames, k as isize) };
        let slot = interned_keyword_slot(name)?;
        if !values[slot].is_null() {
            return None;
        }
        if value != none {
            values[slot] = value;
        }
    }
    Some(values)
}

/// `__dlpack__`'s keyword values in `KEYWORDS` order (None for absent or None), or the
/// TypeError Python gives for arguments a function doesn't take.
///
/// # Safety
/// As CPython passes fast-call arguments, holding the GIL; the values borrow the caller's.
pub unsafe fn dlpack_arguments<'a, 'py>(
    py: Python<'py>,
    args: *const *mut PyObject,
    nargs: Py_ssize_t,
    kwnames: *mut PyObject,
) -> PyResult<[Option<Borrowed<'a, 'py, PyAny>>; 4]> {
    if nargs != 0 {
        return Err(PyTypeError::new_err(format!(
            "DLPackObject.__dlpack__() takes 0 positional arguments but {nargs} {} given",
            if nargs == 1 { "was" } else { "were" }
        )));
    }
    let mut values: [Option<Borrowed<'a, 'py, PyAny>>; 4] = [None, None, None, None];
    if kwnames.is_null() {
        return Ok(values);
    }
    // SAFETY: `kwnames` is a tuple (of strings, for any call CPython makes).
    let names = unsafe { Bound::from_borrowed_ptr(py, kwnames) };
    let names = names.cast::<PyTuple>()?;
    // SAFETY: one value per keyword name follows the (zero) positional arguments.
    let given = unsafe { c_array(args, names.len()) };
    let (none, _) = python::none_and_false();
    for (k, name) in names.iter().enumerate() {
        let slot = match interned_keyword_slot(name.as_ptr()) {
            Some(slot) => Some(slot),
            None => keyword_slot(&name),
        };
        let Some(slot) = slot else {
            return Err(unexpected_keyword("DLPackObject.__dlpack__", &name));
        };
        let value = given[k];
        if values[slot].is_some() {
            return Err(multiple_values("DLPackObject.__dlpack__", KEYWORDS[slot]));
        }
        // None means the argument's default.
        if value != none {
            // SAFETY: the value is a live object the caller holds for the call.
            values[slot] = Some(unsafe { Borrowed::from_ptr(py, value) });
        }
    }
    Ok(values)
}

/// `asdlpack`'s one argument, positional or named `obj`, or the TypeError Python gives.
///
/// # Safety
/// As CPython passes fast-call arguments, holding the GIL; the value borrows the caller's.
pub unsafe fn asdlpack_argument<'a, 'py>(
    py: Python<'py>,
    args: *const *mut PyObject,
    nargs: Py_ssize_t,
    kwnames: *mut PyObject,
) -> PyResult<Borrowed<'a, 'py, PyAny>> {
    let keywords = if kwnames.is_null() {
        0
    } else {
        // SAFETY: `kwnames` is a tuple.
        unsafe { python::tuple_size(kwnames) }
    };
    let keyword = (keywords == 1).then(|| {
        // SAFETY: with one keyword, `kwnames` holds one name.
        let name = unsafe { python::tuple_item(kwnames, 0) };
        // SAFETY: a live str, borrowed from the tuple.
        unsafe { Bound::from_borrowed_ptr(py, name) }
    });
    let type_error = |message: String| Err(PyTypeError::new_err(message));
    match (nargs + keywords, &keyword) {
        (0, _) => return type_error("asdlpack() missing required argument 'obj'".into()),
        (1, Some(name)) if !name.cast::<PyString>().is_ok_and(|n| n == "obj") => {
            return Err(unexpected_keyword("asdlpack", name));
        }
        (1, _) => {}
        (given, _) => {
            return type_error(format!(
                "asdlpack() takes exactly one argument ({given} given)"
            ));
        }
    }
    // SAFETY: the one argument, positional or keyword, is the first value.
    let obj = unsafe { *args };
    // SAFETY: a live object the caller holds for the call.
    Ok(unsafe { Borrowed::from_ptr(py, obj) })
}

/// A pair of ints, as consumers pass `max_version` and `dl_device`: an exact tuple of two exact
/// ints read in place, without the checks and conversions `int_pair` needs for anything else.
fn exact_int_pair(value: &Bound<'_, PyAny>) -> Option<(i64, i64)> {
    // SAFETY: `value` is a live object, and we hold the GIL (`value` proves it).
    let [first, second] = unsafe { python::exact_tuple_items::<2>(value.as_ptr()) }?;
    // SAFETY: `first` is borrowed from the tuple, which `value` keeps alive; we hold the GIL
    // (`value` proves it).
    let first = unsafe { python::exact_int(first) }?;
    // SAFETY: `second` is borrowed from the tuple, which `value` keeps alive; we hold the GIL
    // (`value` proves it).
    let second = unsafe { python::exact_int(second) }?;
    Some((first, second))
}

fn int_pair(value: &Bound<'_, PyAny>, what: &str) -> Result<(i64, i64)> {
    if let Some(pair) = exact_int_pair(value) {
        return Ok(pair);
    }
    let bad_type = || {
        Error::type_(format!(
            "{what} must be a tuple of two ints, not {}",
            type_name(value)
        ))
    };
    let tuple = value.cast::<PyTuple>().map_err(|_| bad_type())?;
    if tuple.len() != 2 {
        return Err(bad_type());
    }
    Ok((
        to_i64(&tuple.get_item(0)?, what)?,
        to_i64(&tuple.get_item(1)?, what)?,
    ))
}

/// `__dlpack__`'s keyword arguments, checked, as the export policy's request.
pub fn parse_request(
    stream: Option<&Bound<'_, PyAny>>,
    max_version: Option<&Bound<'_, PyAny>>,
    dl_device: Option<&Bound<'_, PyAny>>,
    copy: Option<&Bound<'_, PyAny>>,
) -> Result<Request> {
    let stream = stream.map(|s| to_i64(s, "stream")).transpose()?;
    let versioned_minor = match max_version {
        None => None,
        Some(v) => {
            let (major, minor) = int_pair(v, "max_version")?;
            reported_minor(major, minor).ok_or_else(|| {
                Error::value(format!("max_version ({major}, {minor}) is negative"))
            })?
        }
    };
    let dl_device = dl_device
        .map(|d| {
            let (kind, id) = int_pair(d, "dl_device")?;
            let kind =
                i32::try_from(kind).map_err(|_| Error::value(format!("dl_device type {kind}")))?;
            let id = i32::try_from(id).map_err(|_| Error::value(format!("dl_device id {id}")))?;
            Ok::<_, Error>(DLDevice {
                device_type: kind,
                device_id: id,
            })
        })
        .transpose()?;
    let copy = copy
        .map(|c| {
            c.cast::<PyBool>().map(|b| b.is_true()).map_err(|_| {
                Error::type_(format!("copy must be a bool or None, not {}", type_name(c)))
            })
        })
        .transpose()?;
    Ok(Request::new(stream, versioned_minor, dl_device, copy))
}

/// The last `max_version` tuple `versioned_minor` read, held (so its address can't be reused)
/// with what it asked for: consumers pass the same tuple on every call (numpy's is static). A
/// `Latch`: a thread that finds it in use reads its tuple without it.
static LAST_MAX_VERSION: Latch<(usize, Option<u32>)> = Latch::new((0, None));

/// `reported_minor` for `max_version`, an exact tuple of two ints that are not negative; `None`
/// for anything else (`parse_request` then accepts or rejects it).
///
/// # Safety
/// `max_version` is a live object; the caller holds the GIL.
#[inline(always)]
pub unsafe fn versioned_minor(py: Python<'_>, max_version: *mut PyObject) -> Option<Option<u32>> {
    let key = max_version as usize;
    // The cached tuple is alive (the cache holds it), and so is `max_version`: the same address
    // is the same tuple.
    let cached = LAST_MAX_VERSION.try_with(|last| (last.0 == key).then_some(last.1));
    if let Some(Some(minor)) = cached {
        return Some(minor);
    }
    // SAFETY: `max_version` is a live object and we hold the GIL (this function's contract).
    let version = unsafe { Borrowed::from_ptr(py, max_version) };
    let (major, minor) = exact_int_pair(&version)?;
    let minor = reported_minor(major, minor)?;
    // The cache holds a strong reference to its tuple, taken here and released once replaced
    // (an exact tuple of ints, whose release runs no Python code).
    let replaced = LAST_MAX_VERSION.try_with(|last| {
        // SAFETY: `max_version` is a live object and we hold the GIL (this function's
        // contract); the cache keeps this reference.
        unsafe { python::incref(max_version) };
        std::mem::replace(last, (key, minor)).0
    });
    if let Some(old) = replaced.filter(|&old| old != 0) {
        // SAFETY: `old` is the tuple the cache took a reference to, given up now it is replaced;
        // we hold the GIL (this function's contract).
        unsafe { python::decref(old as *mut PyObject) };
    }
    Some(minor)
}

/// The one optional argument of a method taking `(self, NAME=None)`, positional or by name
/// (`__arrow_c_array__(requested_schema=None)`, `__arrow_c_stream__`); `None` when absent or
/// None. With `future_keywords` (the Arrow device methods' `**kwargs`), other keywords are
/// taken when None, as the Arrow PyCapsule interface asks, and are a `NotImplementedError`
/// otherwise (as pyarrow's).
///
/// # Safety
/// As CPython passes fast-call arguments, holding the GIL; the value borrows the caller's.
pub unsafe fn optional_argument<'a, 'py>(
    py: Python<'py>,
    args: *const *mut PyObject,
    nargs: Py_ssize_t,
    kwnames: *mut PyObject,
    function: &str,
    name: &str,
    future_keywords: bool,
) -> PyResult<Option<Borrowed<'a, 'py, PyAny>>> {
    let keywords = if kwnames.is_null() {
        0
    } else {
        // SAFETY: `kwnames` is a tuple.
        unsafe { python::tuple_size(kwnames) }
    };
    if nargs > 1 || (nargs + keywords > 1 && !future_keywords) {
        return Err(PyTypeError::new_err(format!(
            "{function}() takes at most one argument ({} given)",
            nargs + keywords
        )));
    }
    let value_at = |k: Py_ssize_t| {
        // SAFETY: CPython passes `nargs` values, then one per keyword name, at `args` (this
        // function's contract), and `k` is below their count.
        let value = unsafe { *args.wrapping_offset(k) };
        // SAFETY: each value is a live object the caller holds for the call (this function's
        // contract), and we hold the GIL (`py`).
        unsafe { Borrowed::from_ptr(py, value) }
    };
    let mut value = (nargs == 1).then(|| value_at(0));
    for k in 0..keywords {
        // SAFETY: `k` is below the tuple's size.
        let given = unsafe { python::tuple_item(kwnames, k) };
        // SAFETY: a live str, borrowed from the tuple.
        let given = unsafe { Bound::from_borrowed_ptr(py, given) };
        let given_value = value_at(nargs + k);
        if given.cast::<PyString>().is_ok_and(|n| n == name) {
            if value.is_some() {
                return Err(multiple_values(function, name));
            }
            value = Some(given_value);
        } else if !future_keywords {
            return Err(unexpected_keyword(function, &given));
        } else if !given_value.is_none() {
            return Err(pyo3::exceptions::PyNotImplementedError::new_err(format!(
                "{function}() got keyword argument '{}', which it doesn't support yet (only \
                 None)",
                given.str()?
            )));
        }
    }
    Ok(value.filter(|v| !v.is_none()))
}

// The TypeErrors CPython gives for calls a function doesn't take, in its words: the functions
// above parse their own arguments (for speed), so they say what CPython would, from here.

/// "f() got an unexpected keyword argument 'name'".
#[cold]
fn unexpected_keyword(function: &str, name: &Bound<'_, PyAny>) -> PyErr {
    let name = name.str().map(|n| n.to_string()).unwrap_or_default();
    PyTypeError::new_err(format!(
        "{function}() got an unexpected keyword argument '{name}'"
    ))
}

/// "f() got multiple values for argument 'name'".
#[cold]
fn multiple_values(function: &str, name: &str) -> PyErr {
    PyTypeError::new_err(format!(
        "{function}() got multiple values for argument '{name}'"
    ))
}
