//! The Python face: `asdlpack(obj)` and the `DLPackObject` it returns, whose `__dlpack__`
//! follows the array API standard's argument rules. `pytype` is the type's CPython side.

mod pytype;

use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyTuple};

use crate::copy;
use crate::error::{Error, Result};
use crate::export::capsule::{self, Kind};
use crate::ffi::{
    DLDevice, DLManagedTensorVersioned, DLPACK_MINOR_VERSION, FLAG_IS_COPIED, FLAG_READ_ONLY,
    device_type,
};
use crate::import::{self, array_interface::to_i64, array_interface::type_name};
use crate::tensor::{Device, Tensor, layout};

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

/// What the C exchange API's consumers get: `__dlpack__(max_version=(1, 3))`, except that
/// read-only memory is copied (its consumers, tvm-ffi among them, write through tensors
/// regardless of the READ_ONLY flag).
const MANAGED_REQUEST: Request = Request {
    stream: None,
    versioned_minor: Some(DLPACK_MINOR_VERSION),
    dl_device: None,
    copy: None,
    honours_read_only: false,
};

/// Parsed `__dlpack__` keyword arguments.
struct Request {
    stream: Option<i64>,
    /// `None`: legacy capsule; otherwise the minor version to report.
    versioned_minor: Option<u32>,
    dl_device: Option<DLDevice>,
    copy: Option<bool>,
    /// Whether the consumer honours the READ_ONLY flag; if not, read-only memory is copied.
    /// Legacy capsules can't carry the flag, and C exchange API consumers (tvm-ffi) ignore it.
    honours_read_only: bool,
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

impl Request {
    fn parse(
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
                let kind = i32::try_from(kind)
                    .map_err(|_| Error::value(format!("dl_device type {kind}")))?;
                let id =
                    i32::try_from(id).map_err(|_| Error::value(format!("dl_device id {id}")))?;
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

    /// A consumer's request; it honours the READ_ONLY flag exactly when it takes a versioned
    /// capsule (a legacy one can't carry the flag).
    fn new(
        stream: Option<i64>,
        versioned_minor: Option<u32>,
        dl_device: Option<DLDevice>,
        copy: Option<bool>,
    ) -> Request {
        Request {
            stream,
            versioned_minor,
            dl_device,
            copy,
            honours_read_only: versioned_minor.is_some(),
        }
    }
}

/// The minor version to report for a consumer's `max_version` of `(major, minor)`: `None` inside
/// for a legacy capsule (major 0), our own minor at most; `None` for a negative version.
fn reported_minor(major: i64, minor: i64) -> Option<Option<u32>> {
    if major < 0 || minor < 0 {
        return None;
    }
    Some(match major {
        0 => None,
        1 => Some((minor as u64).min(DLPACK_MINOR_VERSION as u64) as u32),
        _ => Some(DLPACK_MINOR_VERSION),
    })
}

fn device_name(device: DLDevice) -> String {
    let kind = match device.device_type {
        device_type::CPU => "cpu",
        device_type::CUDA => "cuda",
        device_type::CUDA_HOST => "cuda_host",
        device_type::CUDA_MANAGED => "cuda_managed",
        device_type::ROCM => "rocm",
        device_type::ROCM_HOST => "rocm_host",
        device_type::OPENCL => "opencl",
        device_type::VULKAN => "vulkan",
        device_type::METAL => "metal",
        device_type::VPI => "vpi",
        device_type::EXT_DEV => "ext_dev",
        device_type::ONE_API => "oneapi",
        device_type::WEB_GPU => "webgpu",
        device_type::HEXAGON => "hexagon",
        device_type::MAIA => "maia",
        device_type::TRN => "trn",
        _ => return format!("device_type_{}:{}", device.device_type, device.device_id),
    };
    format!("{kind}:{}", device.device_id)
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

    fn export<'py>(&self, slf: &Bound<'py, PyAny>, request: Request) -> Result<Bound<'py, PyAny>> {
        let py = slf.py();
        let (own, device, kind) = self.prepare(py, &request)?;
        capsule::to_capsule(py, holder(slf, own), device, kind)
    }

    /// A versioned managed tensor for the C exchange API: as `__dlpack__(max_version=(1, 3))`
    /// would put in its capsule, except that read-only memory is copied (its consumers, tvm-ffi
    /// among them, write through tensors regardless of the READ_ONLY flag). `slf` is this
    /// object's Python side.
    pub fn export_managed(
        &self,
        slf: &Bound<'_, PyAny>,
    ) -> Result<NonNull<DLManagedTensorVersioned>> {
        match self.prepare(slf.py(), &MANAGED_REQUEST)? {
            (own, device, Kind::Versioned { minor, flags }) => Ok(capsule::new_versioned(
                holder(slf, own),
                device,
                minor,
                flags,
            )),
            (_, _, Kind::Legacy) => unreachable!("a versioned request gives a versioned export"),
        }
    }

    /// `export_managed` for memory exported in place (`in_place`), which runs no Python code
    /// (for the C exchange API's fast path); `None` otherwise.
    pub fn export_managed_in_place(
        &self,
        slf: &Bound<'_, PyAny>,
    ) -> Option<NonNull<DLManagedTensorVersioned>> {
        match self.in_place(&MANAGED_REQUEST)? {
            (device, Kind::Versioned { minor, flags }) => Some(capsule::new_versioned(
                holder(slf, None),
                device,
                minor,
                flags,
            )),
            (_, Kind::Legacy) => None,
        }
    }

    /// Device data from a DLPack producer, when the consumer named a stream: ask the producer
    /// again with that stream, so it orders its pending work before the consumer's.
    fn fresh_from_producer(
        &self,
        py: Python<'_>,
        request: &Request,
    ) -> Result<Option<Arc<Tensor>>> {
        let (Some(producer), Some(stream)) = (&self.producer, request.stream) else {
            return Ok(None);
        };
        let stream = pyo3::types::PyInt::new(py, stream).into_any();
        let method = producer.bind(py).getattr(pyo3::intern!(py, "__dlpack__"))?;
        let tensor = import::dlpack::import_producer(&method, Some(&stream))?;
        Ok(Some(Arc::new(tensor)))
    }

    /// The common request, answered without the general checks of `prepare` (it concludes the
    /// same): host memory DLPack can express as it is, exported in place. `None` for anything
    /// else.
    // Inlined: returned through memory, its answer cost a store-forwarding stall a call.
    #[inline(always)]
    fn in_place(&self, request: &Request) -> Option<(DLDevice, Kind)> {
        match self.tensor.device {
            Device::Known(own)
                if own.is_host()
                    && request.dl_device.is_none()
                    && request.stream.is_none()
                    && request.copy != Some(true)
                    && (request.honours_read_only || !self.tensor.readonly)
                    && self.tensor.copy_reason().is_none() =>
            {
                Some((own, kind(request, &self.tensor, false)))
            }
            _ => None,
        }
    }

    /// The tensor on the device to export and the capsule kind for `request`: the shared tensor
    /// itself (`None`), or a tensor of the export's own: a fresh one from the producer, or a copy.
    fn prepare(
        &self,
        py: Python<'_>,
        request: &Request,
    ) -> Result<(Option<Arc<Tensor>>, DLDevice, Kind)> {
        if let Some((device, kind)) = self.in_place(request) {
            return Ok((None, device, kind));
        }
        let own = self.tensor.device.get()?;
        let cpu = DLDevice::CPU;
        // Where the consumer wants the data: our own device, or the CPU for host-addressable
        // memory (both without a copy); CUDA <-> CPU and CUDA <-> CUDA moves copy.
        let target = request.dl_device.unwrap_or(own);
        let in_place = target == own || (own.is_host() && target == cpu);
        let movable = |d: DLDevice| d == cpu || d.device_type == device_type::CUDA;
        let from_movable = own.is_host()
            || matches!(
                own.device_type,
                device_type::CUDA | device_type::CUDA_MANAGED
            );
        let movable_pair = movable(target) && from_movable;
        if !(in_place || movable_pair) {
            return Err(Error::buffer(format!(
                "can't provide {} data on {}: only moves between the CPU and CUDA devices are \
                 supported",
                device_name(own),
                device_name(target)
            )));
        }
        let target_on_host = target.is_host();
        if let Some(stream) = request.stream {
            let valid = if target_on_host {
                stream == -1
            } else {
                stream == -1 || stream >= 1
            };
            if !valid {
                return Err(Error::value(if target_on_host {
                    format!(
                        "stream must be None (or -1) for {} data, not {stream}",
                        device_name(target)
                    )
                } else {
                    format!("stream {stream} is not a valid CUDA/ROCm stream (0 is not allowed)")
                }));
            }
        }
        // A copy is needed to move, for memory DLPack can't express, and for read-only memory
        // asked for a legacy capsule (which can't say read-only).
        let needs_copy = if in_place {
            self.tensor.copy_reason()
        } else {
            Some("moving to another device")
        }
        .or_else(|| {
            (!request.honours_read_only && self.tensor.readonly).then_some(
                "read-only memory can't be handed to a consumer that ignores the read-only flag \
                 (a legacy capsule has none)",
            )
        });
        let copy = match (request.copy, needs_copy) {
            (Some(false), Some(reason)) => {
                return Err(Error::buffer(format!(
                    "{reason}, and copy=False forbids a copy"
                )));
            }
            (Some(true), _) | (None, Some(_)) => true,
            _ => false,
        };
        if !copy {
            let fresh = self.fresh_from_producer(py, request)?;
            if !own.is_host() {
                copy::cuda::after_producer(&self.tensor, own.device_id, request.stream)
                    .map_err(as_buffer_error)?;
            }
            let kind = kind(request, fresh.as_deref().unwrap_or(&self.tensor), false);
            return Ok((fresh, target, kind));
        }
        let unavailable = |err: Error| match as_buffer_error(err) {
            Error::Buffer(msg) => {
                Error::Buffer(format!("can't copy to {}: {msg}", device_name(target)))
            }
            other => other,
        };
        let (tensor, device) = if target_on_host {
            let tensor = if own.is_host() {
                copy::to_c_order(py, &self.tensor)?
            } else {
                copy::cuda::to_host(py, &self.tensor, request.stream).map_err(unavailable)?
            };
            (tensor, cpu)
        } else {
            let id = target.device_id;
            let tensor =
                copy::cuda::to_device(py, &self.tensor, id, request.stream).map_err(unavailable)?;
            (tensor, target) // a CUDA device: `movable` admits no other non-host target
        };
        let kind = kind(request, &tensor, true);
        Ok((Some(Arc::new(tensor)), device, kind))
    }
}

/// What keeps an export alive: the object itself (`slf`, a `DLPackObject`) when it shares the
/// object's tensor, otherwise the export's own tensor.
fn holder(slf: &Bound<'_, PyAny>, own: Option<Arc<Tensor>>) -> capsule::Holder {
    match own {
        None => capsule::Holder::Object(slf.clone().unbind()),
        Some(tensor) => capsule::Holder::Tensor(tensor),
    }
}

/// In `__dlpack__`, "CUDA can't do this here" is a BufferError, like any other memory the
/// producer can't serve, so consumers may fall back.
fn as_buffer_error(err: Error) -> Error {
    match err {
        Error::Runtime(msg) => Error::Buffer(msg),
        other => other,
    }
}

/// The capsule kind a request asks for, with the flags `tensor` carries.
#[inline(always)]
fn kind(request: &Request, tensor: &Tensor, copied: bool) -> Kind {
    match request.versioned_minor {
        None => Kind::Legacy,
        Some(minor) => {
            let mut flags = 0;
            if tensor.readonly {
                flags |= FLAG_READ_ONLY;
            }
            if copied {
                flags |= FLAG_IS_COPIED;
            }
            Kind::Versioned { minor, flags }
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
    let request = Request::parse(
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
    let (device, kind) = object.in_place(&request)?;
    // SAFETY: as above; the capsule takes a reference of its own.
    let slf = unsafe { pyo3::Borrowed::from_ptr(py, slf) }
        .to_owned()
        .unbind();
    Some(capsule::to_capsule(py, capsule::Holder::Object(slf), device, kind).map(Bound::into_ptr))
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
            Device::Known(d) => device_name(*d),
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
        let copy = if t.copy_reason().is_some() {
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
