//! Importer for DLPack itself: `__dlpack__` producers and raw `"dltensor"` /
//! `"dltensor_versioned"` capsules.
//!
//! Taking a capsule renames it `"used_..."` (so nobody else consumes it) and moves its managed
//! tensor into an `Owner`, whose drop calls the producer's deleter exactly once.

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCapsule, PyDict, PyTuple};
use pyo3::{PyTypeInfo, intern};

use super::protocols::ExchangeApi;
use crate::error::{Error, Result};
use crate::ffi::python;
use crate::ffi::{CAPSULE_LEGACY, CAPSULE_LEGACY_USED, CAPSULE_VERSIONED, CAPSULE_VERSIONED_USED};
use crate::tensor::{Device, Managed, Owner, Storage, Tensor};
use dlpack_core::abi::DLManagedTensor;
use dlpack_core::abi::DLManagedTensorVersioned;
use dlpack_core::abi::DLPACK_MAJOR_VERSION;
use dlpack_core::abi::DLPACK_MINOR_VERSION;
use dlpack_core::abi::DLTensor;
use dlpack_core::abi::FLAG_READ_ONLY;
use dlpack_core::dtype::DType;
use dlpack_core::layout;
use dlpack_core::layout::Layout;

/// Call a producer's `__dlpack__` method (newest protocol first, then the pre-versioning call
/// for old producers that don't take `max_version`) and import the capsule. `stream` is
/// forwarded as is.
pub fn import_producer(
    method: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
) -> Result<Tensor> {
    let py = method.py();
    let max_version = || PyTuple::new(py, [DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION]);
    let kwargs = match stream {
        // The common call's keywords never change: build them once. (Python unpacks a kwargs
        // dict into the callee's own arguments, so sharing it is safe.)
        None => {
            static PLAIN: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
            PLAIN
                .get_or_try_init(py, || -> PyResult<_> {
                    let kwargs = PyDict::new(py);
                    kwargs.set_item("max_version", max_version()?)?;
                    Ok(kwargs.unbind())
                })?
                .bind(py)
                .clone()
        }
        Some(stream) => {
            let kwargs = PyDict::new(py);
            kwargs.set_item(intern!(py, "stream"), stream)?;
            kwargs.set_item(intern!(py, "max_version"), max_version()?)?;
            kwargs
        }
    };
    let capsule = match method.call((), Some(&kwargs)) {
        Ok(capsule) => capsule,
        // A producer older than `max_version` raises a plain TypeError at the keyword; a
        // subclass (pyarrow's ArrowTypeError) is a refusal of the data, which the legacy call
        // would only repeat (with a deprecation warning).
        Err(err)
            if err
                .get_type(py)
                .is(py.get_type::<pyo3::exceptions::PyTypeError>()) =>
        {
            let legacy = PyDict::new(py);
            if let Some(stream) = stream {
                legacy.set_item(intern!(py, "stream"), stream)?;
            }
            method.call((), Some(&legacy)).map_err(|_| err)?
        }
        Err(err) => return Err(err.into()),
    };
    import_capsule(&capsule)
}

/// Import host memory through a producer's DLPack C exchange API, skipping its Python
/// `__dlpack__`. `None` sends the caller down the Python path: when the producer fails (that
/// path gives the error, or a fallback), and for device memory, which needs the stream
/// handshake only `__dlpack__` has.
///
/// # Safety
/// `api` is the exchange API published by `obj`'s type, whose functions take its objects.
pub unsafe fn import_exchange_api(obj: &Bound<'_, PyAny>, api: ExchangeApi) -> Option<Tensor> {
    let export = api.table().managed_tensor_from_py_object_no_sync?;
    let mut managed: *mut DLManagedTensorVersioned = std::ptr::null_mut();
    // SAFETY: the producer's function (per the contract), called with an object of its type and
    // an out slot.
    let status = unsafe { export(obj.as_ptr().cast(), &mut managed) };
    if status != 0 || managed.is_null() {
        // SAFETY: the producer may have set an exception; the Python path reports its own. We
        // hold the GIL (`obj` proves it).
        unsafe { python::clear_error() };
        return None;
    }
    let managed = NonNull::new(managed)?;
    // SAFETY: on success the producer handed us ownership of a valid managed tensor.
    let tensor = unsafe { import_versioned(managed) }.ok()?;
    let host = tensor.device().get().is_ok_and(|d| d.is_host());
    host.then_some(tensor)
}

/// Whether `obj` is a PyCapsule (of any name).
pub fn is_capsule(obj: &Bound<'_, PyAny>) -> bool {
    PyCapsule::is_type_of(obj)
}

/// Take ownership of the managed tensor in a DLPack capsule and describe it.
pub fn import_capsule(capsule: &Bound<'_, PyAny>) -> Result<Tensor> {
    if !is_capsule(capsule) {
        return Err(Error::type_(format!(
            "__dlpack__ returned {}, not a PyCapsule",
            super::array_interface::type_name(capsule)
        )));
    }
    let ptr = capsule.as_ptr();
    // SAFETY: `ptr` is a live capsule, and we hold the GIL (`capsule` proves it).
    let name = unsafe { python::capsule_name(ptr) };
    if name.is_null() {
        // SAFETY: clears a possible error from GetName; we hold the GIL.
        unsafe { python::clear_error() };
        return Err(Error::type_(
            "a PyCapsule without a name is not a DLPack capsule",
        ));
    }
    // SAFETY: the capsule's name is a NUL-terminated string that lives as long as the capsule.
    let name = unsafe { CStr::from_ptr(name) };
    let versioned = if name == CAPSULE_VERSIONED {
        true
    } else if name == CAPSULE_LEGACY {
        false
    } else if name == CAPSULE_VERSIONED_USED || name == CAPSULE_LEGACY_USED {
        return Err(Error::value("this DLPack capsule was already consumed"));
    } else {
        return Err(Error::type_(format!(
            "a PyCapsule named {name:?} is not a DLPack capsule"
        )));
    };
    let (current, used) = if versioned {
        (CAPSULE_VERSIONED, CAPSULE_VERSIONED_USED)
    } else {
        (CAPSULE_LEGACY, CAPSULE_LEGACY_USED)
    };
    // SAFETY: `ptr` is a live capsule whose name matches, so GetPointer returns the managed
    // tensor (never null for a valid DLPack capsule); we hold the GIL.
    let managed = unsafe { python::capsule_pointer(ptr, current.as_ptr()) };
    let Some(managed) = NonNull::new(managed) else {
        return Err(PyErr::fetch(capsule.py()).into());
    };
    // Renaming marks it consumed, as the protocol asks.
    // SAFETY: `ptr` is a live capsule, and we hold the GIL (`capsule` proves it).
    if !unsafe { python::capsule_rename(ptr, used) } {
        return Err(PyErr::fetch(capsule.py()).into());
    }
    if versioned {
        // SAFETY: the capsule held a versioned managed tensor, now ours alone.
        unsafe { import_versioned(managed.cast()) }
    } else {
        let managed = managed.cast::<DLManagedTensor>();
        // SAFETY: the capsule held a legacy managed tensor, now ours alone (renamed "used_").
        let owner = Owner::Legacy(unsafe { Managed::take(managed) });
        // SAFETY: the capsule's legacy managed tensor stays readable until its deleter runs,
        // which only `owner`, alive here, calls.
        let tensor = unsafe { (*managed.as_ptr()).dl_tensor };
        // SAFETY: the producer's tensor, valid while the owner keeps the managed tensor.
        unsafe { describe(&tensor, false, owner) }
    }
}

/// Take ownership of a producer's versioned managed tensor (from a capsule or the C exchange
/// API) and describe it; its deleter is called when the description goes, or on error now.
///
/// # Safety
/// `managed` is a valid `DLManagedTensorVersioned` whose deleter nobody else will call.
pub unsafe fn import_versioned(managed: NonNull<DLManagedTensorVersioned>) -> Result<Tensor> {
    // From here on the owner calls the deleter, on success or on any error below.
    // SAFETY: `managed` is a valid managed tensor whose deleter nobody else will call (this
    // function's contract), as `take` asks.
    let owner = Owner::Versioned(unsafe { Managed::take(managed) });
    // SAFETY: per the contract, the managed tensor is readable until the deleter runs.
    let m = unsafe { &*managed.as_ptr() };
    let (version, flags, tensor) = (m.version, m.flags, m.dl_tensor);
    if version.major != DLPACK_MAJOR_VERSION {
        return Err(Error::buffer(format!(
            "DLPack major version {} is not supported (this is DLPack {}.{})",
            version.major, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION
        )));
    }
    // SAFETY: the producer's tensor, valid while the owner keeps the managed tensor.
    unsafe { describe(&tensor, flags & FLAG_READ_ONLY != 0, owner) }
}

/// Validate a producer's `DLTensor` and describe it. On error the owner (and so the producer's
/// deleter) is dropped.
///
/// # Safety
/// `t` is a producer's `DLTensor` that stays valid while `owner` lives: its shape and (when not
/// null) strides have `ndim` entries.
unsafe fn describe(t: &DLTensor, readonly: bool, owner: Owner) -> Result<Tensor> {
    let ndim = usize::try_from(t.ndim)
        .ok()
        .filter(|&n| n <= layout::MAX_NDIM)
        .ok_or_else(|| Error::buffer(format!("DLPack tensor with ndim {}", t.ndim)))?;
    if ndim > 0 && t.shape.is_null() {
        return Err(Error::buffer("DLPack tensor without a shape"));
    }
    let dtype = DType::from_dlpack(t.dtype)?;
    // SAFETY: per the contract; not null when `ndim > 0` (checked above), not read when 0.
    let shape = unsafe { dlpack_core::abi::c_array(t.shape, ndim) };
    // SAFETY: non-null strides (checked) have `ndim` entries while `owner` lives (this
    // function's contract), as it does through this call.
    let strides = (ndim > 0 && !t.strides.is_null())
        .then(|| unsafe { dlpack_core::abi::c_array(t.strides, ndim) });
    let item = dtype.itemsize() as i64;
    let byte_stride = strides.map(|s| {
        move |k: usize| {
            s[k].checked_mul(item)
                .ok_or_else(|| dlpack_core::error::Error::buffer("DLPack strides overflow"))
        }
    });
    let layout =
        Layout::build(ndim, dtype.itemsize(), |k| shape[k], byte_stride).map_err(|e| match e {
            dlpack_core::error::Error::Value(msg) => dlpack_core::error::Error::Buffer(msg),
            other => other,
        })?;
    debug_assert!(
        layout.strides().is_some(),
        "element strides times the item size divide evenly"
    );
    let data = (t.data as usize)
        .checked_add(t.byte_offset as usize)
        .ok_or_else(|| Error::buffer("DLPack data pointer + byte_offset overflows"))?
        as *mut c_void;
    Tensor::check_data(data, &layout)
        .map_err(|_| Error::buffer("DLPack tensor with a null data pointer"))?;
    let storage = Storage {
        data,
        device: Device::Known(t.device),
        dtype,
        readonly,
        swapped: false,
        indirect: false,
        stream: None,
    };
    // SAFETY: the producer's word, which nothing can check: per the DLPack contract, `data`
    // (the tensor's data plus its byte offset), shape and strides address its elements in
    // memory of its device while the managed tensor, held by `owner` until its deleter is
    // called, lives; writable unless it is flagged read-only (`readonly`).
    Ok(unsafe { Tensor::new(storage, layout, owner) })
}
