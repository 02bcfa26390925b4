//! The Python face: `asdlpack(obj)` and the `DLPackObject` it returns, whose `__dlpack__`
//! follows the array API standard's argument rules. `pytype` is the type's CPython side.

mod exchange_api;
mod pytype;

use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyTuple};

use crate::copy;
use crate::error::{Error, Result};
use crate::export::capsule::{self, Kind, Source};
use crate::export::policy::{self, MANAGED_REQUEST, Request, reported_minor};
use crate::ffi::{DLDevice, DLManagedTensorVersioned, device_type};
use crate::import::{self, array_interface::to_i64, array_interface::type_name};
use crate::tensor::{Device, Tensor, layout};

pub use exchange_api::capsule as exchange_api_capsule;
pub use pytype::{asdlpack_function, new_object, state, state_unchecked, type_object};

/// A DLPack view of another object's memory: pass it to any `from_dlpack`. This is the state of
/// the Python object (see `pytype`), immutable once made.
pub struct DLPackObject {
    /// Shared with every capsule exported from it: each holds a reference to this object.
    tensor: Tensor,
    /// For device data from a DLPack producer: asked again when a consumer names its stream,
    /// so the producer can order its work before the consumer's.
    producer: Option<Py<PyAny>>,
}

/// Wrap `obj` (anything with DLPack, the CUDA array interface, the array interface or the
/// buffer protocol) in a `DLPackObject`, without copying.
pub fn asdlpack<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    // DLPackObject is final: an exact type check suffices (and skips a subtype walk).
    if pytype::is_instance(obj.as_ptr()) {
        return Ok(obj.clone());
    }
    let import::Imported { tensor, producer } = import::import(obj)?;
    new_object(obj.py(), DLPackObject { tensor, producer })
}

/// `asdlpack`'s fast path, for `pytype`'s entry point (outside PyO3's, so it calls no Python
/// code of its own, though allocating the object may run a garbage collection): a
/// `DLPackObject`, or an exact ndarray whose description needs nothing new. `None`: take
/// `asdlpack_method`, which also gives errors; `Some(Err)`: the object could not be made.
#[inline(always)]
fn asdlpack_known<'py>(obj: &Bound<'py, PyAny>) -> Option<PyResult<Bound<'py, PyAny>>> {
    if pytype::is_instance(obj.as_ptr()) {
        return Some(Ok(obj.clone()));
    }
    // SAFETY: `state` is an instance's uninitialised state, written whole when we say so.
    unsafe {
        pytype::new_object_with(obj.py(), |state| {
            (&raw mut (*state).producer).write(None);
            import::import_known_into(obj, &raw mut (*state).tensor)
        })
    }
}

/// `asdlpack(obj)` as CPython calls it (`METH_FASTCALL | METH_KEYWORDS`): one argument,
/// positional or named `obj`, read by hand (PyO3's general parser cost a fifth of the call).
///
/// # Safety
/// Called by CPython through PyO3's trampoline: `args` holds `nargs` positional arguments
/// followed by one value per name in `kwnames` (a tuple of strings, or null).
unsafe fn asdlpack_method(
    py: Python<'_>,
    _module: *mut pyo3::ffi::PyObject,
    args: *const *mut pyo3::ffi::PyObject,
    nargs: pyo3::ffi::Py_ssize_t,
    kwnames: *mut pyo3::ffi::PyObject,
) -> PyResult<*mut pyo3::ffi::PyObject> {
    let keywords = if kwnames.is_null() {
        0
    } else {
        // SAFETY: `kwnames` is a tuple.
        unsafe { pyo3::ffi::PyTuple_Size(kwnames) }
    };
    let keyword = (keywords == 1).then(|| {
        // SAFETY: with one keyword, `kwnames` holds one name, borrowed from the tuple.
        unsafe { Bound::from_borrowed_ptr(py, pyo3::ffi::PyTuple_GetItem(kwnames, 0)) }
    });
    let type_error = |message: String| Err(pyo3::exceptions::PyTypeError::new_err(message));
    match (nargs + keywords, &keyword) {
        (0, _) => return type_error("asdlpack() missing required argument 'obj'".into()),
        (1, Some(name))
            if !name
                .cast::<pyo3::types::PyString>()
                .is_ok_and(|n| n == "obj") =>
        {
            return type_error(format!(
                "asdlpack() got an unexpected keyword argument '{}'",
                name.str()?
            ));
        }
        (1, _) => {}
        (given, _) => {
            return type_error(format!(
                "asdlpack() takes exactly one argument ({given} given)"
            ));
        }
    }
    // SAFETY: the one argument, positional or keyword, is the first value; the caller holds it
    // for the call.
    let obj = unsafe { pyo3::Borrowed::from_ptr(py, *args) };
    Ok(asdlpack(&obj)?.into_ptr())
}

/// Copy `src` into the existing array `dst`, as `numpy.copyto(dst, src)` does: any supported
/// source into any writable destination, host or CUDA (broadcasting `src` like numpy; dtypes
/// must match). Overlapping memory is handled; the GIL is released while large copies run.
/// With CUDA memory, `stream` (a CUDA stream handle) queues the copy on that stream instead of
/// completing it before returning.
#[pyfunction]
#[pyo3(signature = (dst, src, *, stream=None))]
pub fn copyto(
    dst: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let py = dst.py();
    let stream = stream.map(|s| to_i64(s, "stream")).transpose()?;
    if let Some(s) = stream
        && s < 1
    {
        return Err(Error::value(format!(
            "stream must be None or a CUDA stream handle (a positive integer), not {s}"
        ))
        .into());
    }
    if is_immutable_array(dst) {
        return Err(Error::value(format!(
            "{} arrays are immutable; copyto can't write into them",
            type_name(dst)
        ))
        .into());
    }
    let target = tensor_of(dst)?;
    let source = tensor_of(src)?;
    copy::copy_into(py, &target, &source, stream)?;
    Ok(())
}

/// The tensor behind an object: a `DLPackObject`'s own, or freshly imported.
enum TensorOf<'a> {
    Object(&'a DLPackObject),
    Imported(Tensor),
}

impl std::ops::Deref for TensorOf<'_> {
    type Target = Tensor;
    fn deref(&self) -> &Tensor {
        match self {
            TensorOf::Object(object) => &object.tensor,
            TensorOf::Imported(tensor) => tensor,
        }
    }
}

fn tensor_of<'a>(obj: &'a Bound<'_, PyAny>) -> Result<TensorOf<'a>> {
    if let Some(existing) = state(obj) {
        return Ok(TensorOf::Object(existing));
    }
    Ok(TensorOf::Imported(import::import(obj)?.tensor))
}

/// JAX arrays export their buffers without a read-only flag, but writing into them would
/// break JAX's immutability (and buffers it shares or donates).
fn is_immutable_array(obj: &Bound<'_, PyAny>) -> bool {
    let py = obj.py();
    obj.get_type()
        .getattr(pyo3::intern!(py, "__module__"))
        .ok()
        .and_then(|m| m.extract::<String>().ok())
        .is_some_and(|m| m == "jax" || m.starts_with("jax.") || m.starts_with("jaxlib"))
}

/// Heap bytes behind our objects, for memory reports: `(name, bytes)` pairs. Rust-side sizes
/// are exact; Python object headers are what `sys.getsizeof` adds.
#[pyfunction]
pub fn _footprint(ndim: usize) -> Vec<(&'static str, usize)> {
    vec![
        ("DLPackObject struct", std::mem::size_of::<DLPackObject>()),
        // The description lives in the Python object (`sys.getsizeof` counts it), and so do
        // the layout's dims up to `INLINE_NDIM` dimensions; more take one allocation.
        ("tensor description", 0),
        (
            "tensor dims",
            if ndim <= layout::INLINE_NDIM {
                0
            } else {
                3 * ndim * std::mem::size_of::<i64>()
            },
        ),
        (
            "versioned capsule allocation",
            capsule::export_bytes(ndim, true),
        ),
        (
            "legacy capsule allocation",
            capsule::export_bytes(ndim, false),
        ),
    ]
}

/// A pair of ints, as consumers pass `max_version` and `dl_device`: an exact tuple of two exact
/// ints read in place, without the checks and conversions `int_pair` needs for anything else.
fn exact_int_pair(value: &Bound<'_, PyAny>) -> Option<(i64, i64)> {
    use pyo3::ffi;
    let tuple = value.as_ptr();
    // SAFETY: `value` is a live object; the tuple calls run only on an exact tuple of size 2,
    // and give borrowed items that the tuple keeps alive. PyLong_AsLongAndOverflow on an exact
    // int reports overflow in its flag and raises nothing.
    unsafe {
        if ffi::PyTuple_CheckExact(tuple) == 0 || ffi::PyTuple_Size(tuple) != 2 {
            return None;
        }
        let item = |k| {
            let item = ffi::PyTuple_GetItem(tuple, k);
            if item.is_null() || ffi::PyLong_CheckExact(item) == 0 {
                return None;
            }
            let mut overflow = 0;
            let v = ffi::PyLong_AsLongAndOverflow(item, &mut overflow);
            (overflow == 0 && (v != -1 || ffi::PyErr_Occurred().is_null())).then_some(v as i64)
        };
        Some((item(0)?, item(1)?))
    }
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
fn parse_request(
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

impl DLPackObject {
    pub fn new(tensor: Tensor) -> Self {
        DLPackObject {
            tensor,
            producer: None,
        }
    }

    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// Whether the object references anything the garbage collector tracks (its producer, or
    /// an owner of a collected type): only then can it be part of a reference cycle.
    fn references_collectable(&self) -> bool {
        self.producer.is_some()
            || self.tensor.owner.for_each_object(|object| {
                // SAFETY: the owner's objects are live (it holds references to them).
                unsafe { pyo3::ffi::PyType_IS_GC(pyo3::ffi::Py_TYPE(object)) }
            }) != 0
    }

    /// Call `visit` on each object this one references (for the garbage collector); stops at,
    /// and returns, the first non-zero result.
    fn for_each_reference(
        &self,
        mut visit: impl FnMut(*mut pyo3::ffi::PyObject) -> c_int,
    ) -> c_int {
        if let Some(producer) = &self.producer {
            let code = visit(producer.as_ptr());
            if code != 0 {
                return code;
            }
        }
        self.tensor.owner.for_each_object(visit)
    }

    /// Release what a dying object holds, in place (no copy of its state), on a thread known to
    /// hold the GIL (its deallocator); the state is then dead. This may run arbitrary Python
    /// code (the owner's own deallocation).
    ///
    /// # Safety
    /// `state` is a live object's state, not used again; the calling thread holds the GIL.
    unsafe fn release_attached_in_place(state: *mut DLPackObject) {
        // SAFETY: per the contract; both fields are released exactly once, the producer as a
        // plain reference (a `Py` dropped here, outside PyO3's attach, would be queued).
        unsafe {
            let DLPackObject { tensor, producer } = &mut *state;
            if let Some(producer) = std::ptr::read(producer) {
                pyo3::ffi::Py_DecRef(producer.into_ptr());
            }
            Tensor::release_attached_in_place(tensor);
        }
    }

    /// What the export of this object's tensor shares it through: a reference to the object.
    fn held<'a>(&'a self, slf: &Bound<'_, PyAny>) -> Source<'a> {
        Source::Held {
            holder: slf.clone().unbind(),
            tensor: &self.tensor,
        }
    }

    /// The source of an export `policy::prepare` decided on: this object's tensor, or its own.
    fn source<'a>(&'a self, slf: &Bound<'_, PyAny>, own: Option<Arc<Tensor>>) -> Source<'a> {
        match own {
            None => self.held(slf),
            Some(tensor) => Source::Own(tensor),
        }
    }

    fn export<'py>(&self, slf: &Bound<'py, PyAny>, request: Request) -> Result<Bound<'py, PyAny>> {
        let py = slf.py();
        let producer = self.producer.as_ref();
        let (own, device, kind) = policy::prepare(py, &self.tensor, producer, &request)?;
        capsule::to_capsule(py, self.source(slf, own), device, kind)
    }

    /// A versioned managed tensor for the C exchange API: as `__dlpack__(max_version=(1, 3))`
    /// would put in its capsule, except that read-only memory is copied (its consumers, tvm-ffi
    /// among them, write through tensors regardless of the READ_ONLY flag). `slf` is this
    /// object's Python side.
    pub fn export_managed(
        &self,
        slf: &Bound<'_, PyAny>,
    ) -> Result<NonNull<DLManagedTensorVersioned>> {
        let producer = self.producer.as_ref();
        match policy::prepare(slf.py(), &self.tensor, producer, &MANAGED_REQUEST)? {
            (own, device, Kind::Versioned { minor, flags }) => {
                capsule::new_versioned(self.source(slf, own), device, minor, flags)
            }
            (_, _, Kind::Legacy) => unreachable!("a versioned request gives a versioned export"),
        }
    }

    /// `export_managed` for memory exported in place (`policy::in_place`), which runs no Python
    /// code (for the C exchange API's fast path); `None` otherwise.
    pub fn export_managed_in_place(
        &self,
        slf: &Bound<'_, PyAny>,
    ) -> Option<NonNull<DLManagedTensorVersioned>> {
        match policy::in_place(&self.tensor, &MANAGED_REQUEST)? {
            (device, Kind::Versioned { minor, flags }) => {
                capsule::new_versioned(self.held(slf), device, minor, flags).ok()
            }
            (_, Kind::Legacy) => None,
        }
    }
}

/// `__dlpack__`'s parameters, all keyword-only, in signature order.
const KEYWORDS: [&str; 4] = ["stream", "max_version", "dl_device", "copy"];

/// `DLPackObject.__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)`, with
/// its keywords matched by hand: PyO3's general argument parser cost as much as the export
/// itself. Consumers name keywords with interned strings (Python code) or with their own
/// strings (numpy's C code), so names are matched by identity first, then by length (the four
/// differ) and contents.
///
/// # Safety
/// Called by CPython as a `METH_FASTCALL | METH_KEYWORDS` method of `DLPackObject` (through
/// PyO3's trampoline, which holds the GIL count and catches panics): `slf` is the instance,
/// `args` holds `nargs` positional arguments followed by one value per name in `kwnames` (a
/// tuple of strings, or null).
unsafe fn dlpack_method(
    py: Python<'_>,
    slf: *mut pyo3::ffi::PyObject,
    args: *const *mut pyo3::ffi::PyObject,
    nargs: pyo3::ffi::Py_ssize_t,
    kwnames: *mut pyo3::ffi::PyObject,
) -> PyResult<*mut pyo3::ffi::PyObject> {
    // SAFETY: CPython's method descriptor checked that `slf` is a DLPackObject (a final class),
    // which the caller holds for the call; the arguments are as the contract says.
    let (object, values) = unsafe {
        (
            pytype::state_unchecked(slf),
            dlpack_arguments(py, args, nargs, kwnames)?,
        )
    };
    // SAFETY: as above.
    let slf = unsafe { Bound::from_borrowed_ptr(py, slf) };
    let [stream, max_version, dl_device, copy] = &values;
    let request = parse_request(
        stream.as_deref(),
        max_version.as_deref(),
        dl_device.as_deref(),
        copy.as_deref(),
    )?;
    Ok(object.export(&slf, request)?.into_ptr())
}

/// `__dlpack__`'s fast path, for `pytype`'s entry point (outside PyO3's, so it runs no Python
/// code and makes no errors of its own): the common request, as
/// `DLPackObject::in_place` serves it. `None`: take `dlpack_method`, which also gives errors;
/// `Some(Err)`: the capsule could not be made.
///
/// # Safety
/// As for `dlpack_method`.
unsafe fn dlpack_common(
    py: Python<'_>,
    slf: *mut pyo3::ffi::PyObject,
    args: *const *mut pyo3::ffi::PyObject,
    nargs: pyo3::ffi::Py_ssize_t,
    kwnames: *mut pyo3::ffi::PyObject,
) -> Option<Result<*mut pyo3::ffi::PyObject>> {
    // SAFETY: as in `dlpack_method`.
    let (object, [stream, max_version, dl_device, copy]) = unsafe {
        (
            pytype::state_unchecked(slf),
            pytype::common_arguments(args, nargs, kwnames)?,
        )
    };
    if !stream.is_null() || !dl_device.is_null() {
        return None;
    }
    let versioned_minor = if max_version.is_null() {
        None
    } else {
        // SAFETY: a live argument, and we hold the GIL.
        unsafe { versioned_minor(py, max_version)? }
    };
    // SAFETY: reading the address of the False singleton.
    let copy = match copy {
        c if c.is_null() => None,
        c if c == unsafe { pyo3::ffi::Py_False() } => Some(false),
        _ => return None,
    };
    let request = Request::new(None, versioned_minor, None, copy);
    let (device, kind) = policy::in_place(&object.tensor, &request)?;
    // SAFETY: as above; the capsule takes a reference of its own.
    let slf = unsafe { pyo3::Borrowed::from_ptr(py, slf) };
    let source = object.held(&slf);
    Some(capsule::to_capsule(py, source, device, kind).map(Bound::into_ptr))
}

/// The last `max_version` tuple `versioned_minor` read, held (so its address can't be reused)
/// with what it asked for: consumers pass the same tuple on every call (numpy's is static).
static LAST_MAX_VERSION: pytype::GilCell<(usize, Option<u32>)> = pytype::GilCell::new((0, None));

/// `reported_minor` for `max_version`, an exact tuple of two ints that are not negative; `None`
/// for anything else (the general parser then accepts or rejects it).
///
/// # Safety
/// `max_version` is a live object; the caller holds the GIL.
unsafe fn versioned_minor(
    py: Python<'_>,
    max_version: *mut pyo3::ffi::PyObject,
) -> Option<Option<u32>> {
    // SAFETY: per the contract, we hold the GIL, so the cache is ours for the call.
    let last = unsafe { LAST_MAX_VERSION.get() };
    if last.0 == max_version as usize {
        return Some(last.1);
    }
    // SAFETY: per the contract.
    let version = unsafe { pyo3::Borrowed::from_ptr(py, max_version) };
    let (major, minor) = exact_int_pair(&version)?;
    let minor = reported_minor(major, minor)?;
    // SAFETY: the cache holds a strong reference to its tuple (an exact tuple of ints, whose
    // release runs no Python code), taken here and released when replaced.
    unsafe {
        pyo3::ffi::Py_IncRef(max_version);
        let old = std::mem::replace(last, (max_version as usize, minor)).0;
        if old != 0 {
            pyo3::ffi::Py_DecRef(old as *mut pyo3::ffi::PyObject);
        }
    }
    Some(minor)
}

/// `__dlpack__`'s keyword values in `KEYWORDS` order (None for absent or None).
///
/// # Safety
/// As for `dlpack_method`; the values borrow the caller's arguments.
unsafe fn dlpack_arguments<'a, 'py>(
    py: Python<'py>,
    args: *const *mut pyo3::ffi::PyObject,
    nargs: pyo3::ffi::Py_ssize_t,
    kwnames: *mut pyo3::ffi::PyObject,
) -> PyResult<[Option<pyo3::Borrowed<'a, 'py, PyAny>>; 4]> {
    use pyo3::ffi;
    if nargs != 0 {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "DLPackObject.__dlpack__() takes 0 positional arguments but {nargs} {} given",
            if nargs == 1 { "was" } else { "were" }
        )));
    }
    let mut values: [Option<pyo3::Borrowed<'a, 'py, PyAny>>; 4] = [None, None, None, None];
    if kwnames.is_null() {
        return Ok(values);
    }
    // SAFETY: `kwnames` is a tuple (of strings, for any call CPython makes).
    let names = unsafe { Bound::from_borrowed_ptr(py, kwnames) };
    let names = names.cast::<PyTuple>()?;
    for (k, name) in names.iter().enumerate() {
        // SAFETY: we hold the GIL (`py`).
        let slot = match unsafe { pytype::interned_keyword_slot(name.as_ptr()) } {
            Some(slot) => Some(slot),
            None => keyword_slot(&name),
        };
        let Some(slot) = slot else {
            let name = name.str().map(|n| n.to_string()).unwrap_or_default();
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "DLPackObject.__dlpack__() got an unexpected keyword argument '{name}'"
            )));
        };
        // SAFETY: one value per keyword name follows the (zero) positional arguments.
        let value = unsafe { *args.add(k) };
        if values[slot].is_some() {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "DLPackObject.__dlpack__() got multiple values for argument '{}'",
                KEYWORDS[slot]
            )));
        }
        // SAFETY: the value is a live object the caller holds for the call; None means the
        // argument's default.
        if value != unsafe { ffi::Py_None() } {
            values[slot] = Some(unsafe { pyo3::Borrowed::from_ptr(py, value) });
        }
    }
    Ok(values)
}

/// The parameter a keyword names, for names that are not our interned strings.
fn keyword_slot(name: &Bound<'_, PyAny>) -> Option<usize> {
    let name = name.cast::<pyo3::types::PyString>().ok()?;
    // SAFETY: `name` is a live str.
    let length = unsafe { pyo3::ffi::PyUnicode_GetLength(name.as_ptr()) };
    let slot = KEYWORDS.iter().position(|k| k.len() as isize == length)?;
    (name.to_str().ok()? == KEYWORDS[slot]).then_some(slot)
}

/// The Python-visible behaviour behind `pytype`'s entry points.
impl DLPackObject {
    /// `(device_type, device_id)`, for `__dlpack_device__()` and the `device` property.
    fn dlpack_device<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let device = self.tensor.device.get()?;
        if device.device_type == device_type::CPU && device.device_id == 0 {
            // Asked on every torch exchange: the common answer is built once.
            static CPU: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
            let cpu = CPU.get_or_try_init(py, || {
                PyTuple::new(py, [device_type::CPU, 0]).map(Bound::unbind)
            })?;
            return Ok(cpu.bind(py).clone());
        }
        PyTuple::new(py, [device.device_type, device.device_id])
    }

    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.tensor.layout.shape().iter())
    }

    /// Element strides, or None (see the property's doc in `pytype`).
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self.tensor.layout.strides() {
            Some(strides) => Ok(PyTuple::new(py, strides)?.into_any()),
            None => Ok(py.None().into_bound(py)),
        }
    }

    fn byte_strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.tensor.layout.byte_strides().iter())
    }

    fn repr(&self) -> String {
        let t = &self.tensor;
        let device = match &t.device {
            Device::Known(d) => d.name(),
            Device::Unresolved { .. } => "cuda:?".to_owned(),
        };
        let tuple = |v: &[i64]| match v {
            [one] => format!("({one},)"),
            _ => format!(
                "({})",
                v.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
            ),
        };
        let strides = match t.layout.strides() {
            Some(strides) => format!("strides={}", tuple(strides)),
            None => format!("byte_strides={}", tuple(t.layout.byte_strides())),
        };
        let copy = if t.exportable().is_err() {
            ", needs_copy=True"
        } else {
            ""
        };
        format!(
            "DLPackObject(shape={}, dtype={}, {strides}, device={device}, readonly={}{copy})",
            tuple(t.layout.shape()),
            t.dtype.name(),
            if t.readonly { "True" } else { "False" }
        )
    }
}
