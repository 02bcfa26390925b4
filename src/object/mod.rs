//! The Python face: `asdlpack(obj)` and the `DLPackObject` it returns, whose `__dlpack__`
//! follows the array API standard's argument rules, and `copyto`. `pytype` is the type's CPython
//! side, `arguments` reads its calls' arguments, `exchange_api` is its DLPack C exchange API.

mod arguments;
mod exchange_api;
mod pytype;

use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

use pyo3::exceptions::PyAttributeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::copy;
use crate::error::{CoreError, Error, Result};
use crate::export::capsule::{self, Kind, Source};
use crate::export::interface::{self, Data};
use crate::export::policy::{self, MANAGED_REQUEST, Request};
use crate::ffi::python::{self, GilCell};
use crate::ffi::{DLDevice, DLManagedTensorVersioned};
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
    if pytype::is_instance(obj) {
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
    if pytype::is_instance(obj) {
        return Some(Ok(obj.clone()));
    }
    let init = |state: *mut DLPackObject| {
        // `state` is an instance's uninitialised state, whose fields may be written ("as said"
        // below); a declined one holds only the producer's `None`, which needs no drop.
        // SAFETY: as said.
        let producer = unsafe { &raw mut (*state).producer };
        // SAFETY: as said.
        unsafe { producer.write(None) };
        // SAFETY: as said.
        let tensor = unsafe { &raw mut (*state).tensor };
        // SAFETY: as said.
        unsafe { import::import_known_into(obj, tensor) }
    };
    // SAFETY: `init` writes the state whole when it says so.
    unsafe { pytype::new_object_with(obj.py(), init) }
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
    if import::is_immutable(dst) {
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
                c_int::from(unsafe { python::is_collected(object) })
            }) != 0
    }

    /// Call `visit` on each object this one references (for the garbage collector); stops at,
    /// and returns, the first non-zero result.
    fn for_each_reference(&self, mut visit: impl FnMut(*mut python::PyObject) -> c_int) -> c_int {
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
        // SAFETY: per the contract, live and ours alone from here on.
        let DLPackObject { tensor, producer } = unsafe { &mut *state };
        // Both fields are released exactly once ("as said" below), the producer as a plain
        // reference (a `Py` dropped here, outside PyO3's attach, would be queued).
        // SAFETY: as said: moved out once, never read again.
        if let Some(producer) = unsafe { std::ptr::read(producer) } {
            // SAFETY: as said; the GIL is held (the contract).
            unsafe { python::decref(producer.into_ptr()) };
        }
        // SAFETY: as said; the GIL is held (the contract).
        unsafe { Tensor::release_attached_in_place(tensor) };
    }

    /// What the export of this object's tensor shares it through: a reference to `slf`, this
    /// object's Python side.
    pub(super) fn held<'a>(&'a self, slf: &Bound<'a, PyAny>) -> Source<'a> {
        self.check_is_state_of(slf);
        // SAFETY: `slf` is the object whose state this is (checked just above), which keeps its
        // tensor, immutable, as long as it lives.
        unsafe { Source::held(slf.py(), slf.clone().unbind(), &self.tensor) }
    }

    /// That `slf` is the object whose state this is: an export through it lives on `slf`'s
    /// reference (a mix-up would be a bug, caught here before anything dangles).
    fn check_is_state_of(&self, slf: &Bound<'_, PyAny>) {
        let ours = state(slf).is_some_and(|state| std::ptr::eq(state, self));
        assert!(
            ours,
            "a DLPackObject's state was paired with another object"
        );
    }

    /// The source of an export `policy::prepare` decided on: this object's tensor, or its own.
    fn source<'a>(&'a self, slf: &Bound<'a, PyAny>, own: Option<Arc<Tensor>>) -> Source<'a> {
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

/// `(1, 0)`, the device of CPU memory, once made (asked on every torch exchange).
static CPU_DEVICE: GilCell<usize> = GilCell::new(0);

/// The Python-visible behaviour behind `pytype`'s entry points.
impl DLPackObject {
    /// `(device_type, device_id)`, for `__dlpack_device__()` and the `device` property.
    fn dlpack_device<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let device = self.tensor.device.get()?;
        let tuple = PyTuple::new(py, [device.device_type, device.device_id])?;
        if device == DLDevice::CPU {
            // SAFETY: we hold the GIL (`py`); the cache keeps a reference of its own (leaked:
            // one tuple per process).
            unsafe {
                let cached = CPU_DEVICE.get();
                if *cached == 0 {
                    *cached = tuple.clone().into_ptr() as usize;
                }
            }
        }
        Ok(tuple)
    }

    /// `__dlpack_device__()` of CPU memory once its tuple is made (a new reference to it);
    /// `None` otherwise.
    ///
    /// # Safety
    /// The caller holds the GIL.
    #[inline(always)]
    unsafe fn cached_dlpack_device(&self) -> Option<*mut python::PyObject> {
        if !matches!(self.tensor.device, Device::Known(d) if d == DLDevice::CPU) {
            return None;
        }
        // SAFETY: per the contract, we hold the GIL, and keep no borrow of the cell.
        let cached = unsafe { *CPU_DEVICE.get() } as *mut python::PyObject;
        if cached.is_null() {
            return None;
        }
        // SAFETY: the cached tuple is alive (the cache holds a reference); we hold the GIL.
        unsafe { python::incref(cached) };
        Some(cached)
    }

    /// A read-only, C-ordered copy of this host tensor, as a new `DLPackObject`: what the
    /// buffer protocol and the array interface lend when they can't lend the memory itself.
    fn read_only_copy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let mut copy = copy::to_c_order(py, &self.tensor)?;
        copy.readonly = true;
        new_object(py, DLPackObject::new(copy))
    }

    /// The device's name when it is not host memory, for "no such attribute" errors.
    fn device_memory(&self) -> Option<String> {
        match &self.tensor.device {
            Device::Known(device) if device.is_host() => None,
            Device::Known(device) => Some(device.name()),
            Device::Unresolved { .. } => Some("cuda:?".to_owned()),
        }
    }

    /// `__array_interface__`: host memory only (an AttributeError otherwise, so that consumers
    /// probing for it move on); memory behind suboffsets as a read-only copy.
    fn array_interface<'py>(&self, slf: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        if let Some(device) = self.device_memory() {
            return Err(PyAttributeError::new_err(format!(
                "DLPackObject of {device} memory has no __array_interface__ (host memory only; \
                 see __cuda_array_interface__ and __dlpack__)"
            )));
        }
        if self.tensor.indirect {
            let copy = self.read_only_copy(py)?;
            // SAFETY: `copy` is a live DLPackObject, which outlives this use of its state.
            let copied = unsafe { state_unchecked(copy.as_ptr()) }.tensor();
            let dict = interface::array_interface(py, copied, Data::Buffer(copy.clone()))?;
            return Ok(dict.into_any());
        }
        Ok(interface::array_interface(py, &self.tensor, Data::Address)?.into_any())
    }

    /// `__array_struct__`: host memory described in place (an AttributeError otherwise).
    fn array_struct<'py>(&self, slf: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(device) = self.device_memory() {
            return Err(PyAttributeError::new_err(format!(
                "DLPackObject of {device} memory has no __array_struct__ (host memory only)"
            )));
        }
        self.check_is_state_of(slf);
        // SAFETY: `slf` is the object whose state this is (checked just above), which keeps its
        // tensor, immutable, as long as it lives.
        let capsule = unsafe { interface::array_struct(slf, &self.tensor) };
        capsule.map_err(|err| match err {
            Error::Core(CoreError::Buffer(msg)) => PyAttributeError::new_err(msg),
            other => other.into(),
        })
    }

    /// `__cuda_array_interface__`: CUDA memory only (an AttributeError otherwise).
    fn cuda_array_interface<'py>(&self, slf: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        if !interface::is_cuda(&self.tensor) {
            let device = match &self.tensor.device {
                Device::Known(device) => device.name(),
                Device::Unresolved { .. } => "cuda:?".to_owned(),
            };
            return Err(PyAttributeError::new_err(format!(
                "DLPackObject of {device} memory has no __cuda_array_interface__ (CUDA memory \
                 only; see __array_interface__ and the buffer protocol)"
            )));
        }
        Ok(interface::cuda_array_interface(slf.py(), &self.tensor)?.into_any())
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
