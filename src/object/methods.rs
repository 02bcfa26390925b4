//! `DLPackObject`'s behaviour as Python sees it, behind `pytype`'s entry points: its exports
//! (through `export::policy` and `export::capsule`), its device, its array interfaces, its
//! properties and its repr.

use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};

use dlpack_core::dtype::DType;
use pyo3::exceptions::PyAttributeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use super::instance::{new_object, state, state_unchecked};
use super::state::DLPackObject;
use crate::copy;
use crate::error::{Error, Result};
use crate::export::capsule::{self, Described, Kind};
use crate::export::interface::{self, Data};
use crate::export::policy::{self, MANAGED_REQUEST, Request};
use crate::ffi::python;
use crate::tensor::{Device, Tensor};
use dlpack_core::abi::DLDevice;
use dlpack_core::abi::DLManagedTensorVersioned;

impl DLPackObject {
    /// What the export of this object's tensor shares it through: a reference to `slf`, this
    /// object's Python side.
    pub(super) fn lent<'a>(&'a self, slf: &Bound<'a, PyAny>) -> Described<'a> {
        self.check_is_state_of(slf);
        // SAFETY: `slf` is the object whose state this is (checked just above), which keeps its
        // tensor, immutable, as long as it lives.
        unsafe { Described::lent(slf.py(), slf.clone().unbind(), &self.tensor) }
    }

    /// That `slf` is the object whose state this is: an export through it lives on `slf`'s
    /// reference (a mix-up would be a bug, caught here before anything dangles).
    pub(super) fn check_is_state_of(&self, slf: &Bound<'_, PyAny>) {
        let ours = state(slf).is_some_and(|state| std::ptr::eq(state, self));
        assert!(
            ours,
            "a DLPackObject's state was paired with another object"
        );
    }

    /// The tensor an export `policy::prepare` decided on describes: this object's, or its own.
    pub(super) fn described<'a>(
        &'a self,
        slf: &Bound<'a, PyAny>,
        own: Option<Arc<Tensor>>,
    ) -> Described<'a> {
        match own {
            None => self.lent(slf),
            Some(tensor) => Described::Own(tensor),
        }
    }

    pub(super) fn export<'py>(
        &self,
        slf: &Bound<'py, PyAny>,
        request: Request,
    ) -> Result<Bound<'py, PyAny>> {
        let py = slf.py();
        let producer = self.producer.as_ref();
        let (own, device, kind) = policy::prepare(py, &self.tensor, producer, &request)?;
        capsule::to_capsule(py, self.described(slf, own), device, kind)
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
                capsule::new_versioned(self.described(slf, own), device, minor, flags)
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
                capsule::new_versioned(self.lent(slf), device, minor, flags).ok()
            }
            (_, Kind::Legacy) => None,
        }
    }
}

/// `(1, 0)`, the device of CPU memory, once made (asked on every torch exchange): a strong
/// reference, set once (threads racing to set it keep the first, and release their own).
static CPU_DEVICE: AtomicPtr<python::PyObject> = AtomicPtr::new(ptr::null_mut());

/// The dtype objects `dtype_object` has made, by element type: making one calls `numpy.dtype`
/// (about 0.6 µs, on every leaf `dlpack.interop` converts), and numpy's dtypes are immutable.
/// Few element types exist (a few dozen at most), so a list searched in order serves. The lock is
/// never held while Python runs.
static DTYPE_OBJECTS: Mutex<Vec<(DType, Py<PyAny>)>> = Mutex::new(Vec::new());

/// `.dtype`: numpy's dtype of the element type where numpy can be imported (ml_dtypes' types
/// where ml_dtypes can), since numpy 2 (`np.dtype(obj)`, `np.result_type(obj)`) and JAX
/// (`jnp.asarray(obj)`) read an array-like's `.dtype` and need a real one; its name otherwise.
/// No `from_dlpack` reads it, so the exchange never pays for it. A library that fails to import
/// or doesn't know the type gives the name; anything that isn't an ordinary failure (a
/// KeyboardInterrupt or SystemExit while ml_dtypes imports, a MemoryError) is the caller's.
pub(super) fn dtype_object(py: Python<'_>, dtype: DType) -> PyResult<Bound<'_, PyAny>> {
    let known = |objects: &Vec<(DType, Py<PyAny>)>| {
        objects
            .iter()
            .find(|(of, _)| *of == dtype)
            .map(|(_, object)| object.bind(py).clone())
    };
    if let Some(found) = DTYPE_OBJECTS
        .lock()
        .ok()
        .and_then(|objects| known(&objects))
    {
        return Ok(found);
    }
    let name = dtype.name();
    let numpy_dtype = || -> PyResult<Bound<'_, PyAny>> {
        let make = py
            .import(intern!(py, "numpy"))?
            .getattr(intern!(py, "dtype"))?;
        let found = match make.call1((&name,)) {
            Ok(found) => found,
            Err(_) => {
                let ml_dtypes = py.import(intern!(py, "ml_dtypes"))?;
                make.call1((ml_dtypes.getattr(name.as_str())?,))?
            }
        };
        // numpy reads some names otherwise than DLPack does: only a dtype of the same size is
        // taken for this one.
        let itemsize: usize = found.getattr(intern!(py, "itemsize"))?.extract()?;
        if itemsize != dtype.itemsize() {
            return Err(pyo3::exceptions::PyTypeError::new_err("another type"));
        }
        Ok(found)
    };
    match numpy_dtype() {
        Ok(found) => {
            // Only numpy's answers are kept: a name given for want of numpy (or of ml_dtypes)
            // becomes a dtype once the library can be imported.
            if let Ok(mut objects) = DTYPE_OBJECTS.lock()
                && known(&objects).is_none()
            {
                objects.push((dtype, found.clone().unbind()));
            }
            Ok(found)
        }
        Err(err) if is_ordinary_failure(py, &err) => Ok(PyString::new(py, &name).into_any()),
        Err(err) => Err(err),
    }
}

/// Whether `err` is a library's ordinary failure (an `Exception` other than `MemoryError`), as
/// opposed to an interrupt, an exit or exhausted memory, which must reach the user.
fn is_ordinary_failure(py: Python<'_>, err: &PyErr) -> bool {
    err.is_instance_of::<pyo3::exceptions::PyException>(py)
        && !err.is_instance_of::<pyo3::exceptions::PyMemoryError>(py)
}

/// The Python-visible behaviour behind `pytype`'s entry points.
impl DLPackObject {
    /// `(device_type, device_id)`, for `__dlpack_device__()` and the `device` property.
    pub(super) fn dlpack_device<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let device = self.tensor.device().get()?;
        let tuple = PyTuple::new(py, [device.device_type, device.device_id])?;
        if device == DLDevice::CPU && CPU_DEVICE.load(Ordering::Acquire).is_null() {
            // The cache keeps a reference of its own (leaked: one tuple per process).
            let kept = tuple.clone().into_ptr();
            if CPU_DEVICE
                .compare_exchange(ptr::null_mut(), kept, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // SAFETY: the reference taken just above, which the cache didn't keep; we hold
                // the GIL (`py`).
                unsafe { python::decref(kept) };
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
    pub(super) unsafe fn cached_dlpack_device(&self) -> Option<*mut python::PyObject> {
        if !matches!(*self.tensor.device(), Device::Known(d) if d == DLDevice::CPU) {
            return None;
        }
        let cached = CPU_DEVICE.load(Ordering::Acquire);
        if cached.is_null() {
            return None;
        }
        // SAFETY: the cached tuple is alive (the cache holds a reference); we hold the GIL.
        unsafe { python::incref(cached) };
        Some(cached)
    }

    /// A read-only, C-ordered copy of this host tensor, as a new `DLPackObject`: what the
    /// buffer protocol and the array interface lend when they can't lend the memory itself.
    pub(super) fn read_only_copy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let mut copy = copy::to_c_order(py, &self.tensor)?;
        copy.make_readonly();
        new_object(py, DLPackObject::new(copy))
    }

    /// The device's name when it is not host memory, for "no such attribute" errors.
    pub(super) fn device_memory(&self) -> Option<String> {
        match self.tensor.device() {
            Device::Known(device) if device.is_host() => None,
            Device::Known(device) => Some(device.name()),
            Device::Unresolved { .. } => Some("cuda:?".to_owned()),
        }
    }

    /// `__array_interface__`: host memory only (an AttributeError otherwise, so that consumers
    /// probing for it move on); memory behind suboffsets as a read-only copy.
    pub(super) fn array_interface<'py>(
        &self,
        slf: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        if let Some(device) = self.device_memory() {
            return Err(PyAttributeError::new_err(format!(
                "DLPackObject of {device} memory has no __array_interface__ (host memory only; \
                 see __cuda_array_interface__ and __dlpack__)"
            )));
        }
        if self.tensor.indirect() {
            let copy = self.read_only_copy(py)?;
            // SAFETY: `copy` is a live DLPackObject, which outlives this use of its state.
            let copied = unsafe { state_unchecked(copy.as_ptr()) }.tensor();
            let dict = interface::array_interface(py, copied, Data::Buffer(copy.clone()))?;
            return Ok(dict.into_any());
        }
        Ok(interface::array_interface(py, &self.tensor, Data::Address)?.into_any())
    }

    /// `__array_struct__`: host memory described in place (an AttributeError otherwise).
    pub(super) fn array_struct<'py>(&self, slf: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(device) = self.device_memory() {
            return Err(PyAttributeError::new_err(format!(
                "DLPackObject of {device} memory has no __array_struct__ (host memory only)"
            )));
        }
        self.check_is_state_of(slf);
        // An element type numpy names only by its dtype (bfloat16, the float8 types) travels
        // as that dtype where numpy (and ml_dtypes) can make it; as bytes ("V2") otherwise.
        let dtype = self.tensor.dtype();
        let descr = match dtype.typekind() {
            b'V' => {
                Some(dtype_object(slf.py(), dtype)?).filter(|d| !d.is_instance_of::<PyString>())
            }
            _ => None,
        };
        // SAFETY: `slf` is the object whose state this is (checked just above), which keeps its
        // tensor, immutable, as long as it lives.
        let capsule = unsafe { interface::array_struct(slf, &self.tensor, descr) };
        capsule.map_err(|err| match err {
            Error::Core(dlpack_core::error::Error::Buffer(msg)) => PyAttributeError::new_err(msg),
            other => other.into(),
        })
    }

    /// `__cuda_array_interface__`: CUDA memory only (an AttributeError otherwise).
    pub(super) fn cuda_array_interface<'py>(
        &self,
        slf: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if !interface::is_cuda(&self.tensor) {
            let device = match self.tensor.device() {
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

    pub(super) fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.tensor.layout().shape().iter())
    }

    /// Element strides, or None (see the property's doc in `pytype`).
    pub(super) fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self.tensor.layout().strides() {
            Some(strides) => Ok(PyTuple::new(py, strides)?.into_any()),
            None => Ok(py.None().into_bound(py)),
        }
    }

    pub(super) fn byte_strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.tensor.layout().byte_strides().iter())
    }

    pub(super) fn repr(&self) -> String {
        let t = &self.tensor;
        let device = match t.device() {
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
        let strides = match t.layout().strides() {
            Some(strides) => format!("strides={}", tuple(strides)),
            None => format!("byte_strides={}", tuple(t.layout().byte_strides())),
        };
        let copy = if t.exportable().is_err() {
            ", needs_copy=True"
        } else {
            ""
        };
        format!(
            "DLPackObject(shape={}, dtype={}, {strides}, device={device}, readonly={}{copy})",
            tuple(t.layout().shape()),
            t.dtype().name(),
            if t.readonly() { "True" } else { "False" }
        )
    }
}
