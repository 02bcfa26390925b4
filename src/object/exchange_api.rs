//! The DLPack 1.3 C exchange API as producer: the static `DLPackExchangeAPI` table that
//! `DLPackObject.__dlpack_c_exchange_api__` publishes (a capsule named `"dlpack_exchange_api"`),
//! so C consumers (torch, tvm-ffi) take our tensors without calling `__dlpack__` in Python.
//!
//! Every entry point is `extern "C"`: panics are caught and turned into errors, and errors are
//! reported as the table's contract says (a Python exception, or `SetError` for the allocator).

use std::ffi::{CString, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use super::instance::{self, new_object};
use super::state::DLPackObject;
use crate::error::{Error, Result, at_c_boundary, panic_message};
use crate::export::capsule::{self, Described};
use crate::ffi::CAPSULE_EXCHANGE_API;
use crate::ffi::python;
use crate::import::dlpack::import_versioned;
use crate::tensor::{Device, Tensor};
use dlpack_core::abi::DLManagedTensorVersioned;
use dlpack_core::abi::DLPACK_MAJOR_VERSION;
use dlpack_core::abi::DLPACK_MINOR_VERSION;
use dlpack_core::abi::DLPackExchangeAPI;
use dlpack_core::abi::DLPackExchangeAPIHeader;
use dlpack_core::abi::DLPackSetError;
use dlpack_core::abi::DLPackVersion;
use dlpack_core::abi::DLTensor;
use dlpack_core::dtype::DType;
use dlpack_core::layout;
use dlpack_core::layout::Layout;
use dlpack_core::memory::AlignedBuffer;

/// The table; a plain static so its address is valid for the life of the process, as the
/// protocol requires.
struct Table(DLPackExchangeAPI);
// SAFETY: the table is immutable; `prev_api` is always null.
unsafe impl Sync for Table {}

static TABLE: Table = Table(DLPackExchangeAPI {
    header: DLPackExchangeAPIHeader {
        version: DLPackVersion {
            major: DLPACK_MAJOR_VERSION,
            minor: DLPACK_MINOR_VERSION,
        },
        prev_api: ptr::null_mut(),
    },
    managed_tensor_allocator: Some(managed_tensor_allocator),
    managed_tensor_from_py_object_no_sync: Some(managed_tensor_from_py_object),
    managed_tensor_to_py_object_no_sync: Some(managed_tensor_to_py_object),
    dltensor_from_py_object_no_sync: Some(dltensor_from_py_object),
    current_work_stream: Some(current_work_stream),
});

/// The capsule for `DLPackObject.__dlpack_c_exchange_api__`.
pub fn capsule(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
    let table: *const DLPackExchangeAPI = &TABLE.0;
    // SAFETY: the pointer is to a 'static table, so no destructor is needed; we hold the GIL.
    let capsule =
        unsafe { python::capsule_new_static(table.cast_mut().cast(), CAPSULE_EXCHANGE_API) };
    // SAFETY: a new reference (or null with an exception raised); we hold the GIL.
    let capsule = unsafe { Bound::from_owned_ptr_or_err(py, capsule)? };
    // SAFETY: `capsule_new_static` made a capsule.
    Ok(unsafe { capsule.cast_into_unchecked() })
}

/// Run `body` attached to Python, turning errors and panics into a raised exception and -1.
fn guarded(body: impl FnOnce(Python<'_>) -> Result<()>) -> c_int {
    Python::attach(|py| at_c_boundary(py, -1, |py| body(py).map(|()| 0)))
}

/// A consumer's `PyObject*` found to be a `DLPackObject`: only `new`, which checks, makes one.
struct Checked<'py>(Bound<'py, PyAny>);

impl<'py> Checked<'py> {
    /// The `DLPackObject` behind a consumer's `PyObject*`.
    ///
    /// # Safety
    /// `py_object` is null or a live object.
    unsafe fn new(py: Python<'py>, py_object: *mut c_void) -> Result<Self> {
        if py_object.is_null() {
            return Err(Error::type_("the C exchange API got a NULL object"));
        }
        // SAFETY: per the contract, a live object.
        let any = unsafe { Bound::from_borrowed_ptr(py, py_object.cast()) };
        match instance::state(&any) {
            Some(_) => Ok(Checked(any)),
            None => Err(Error::type_(
                "the C exchange API of DLPackObject got another type",
            )),
        }
    }

    fn state(&self) -> &DLPackObject {
        #[cfg(feature = "pyclass-probe")]
        if let Some(state) = super::state::probe_state(&self.0) {
            return state;
        }
        // SAFETY: `new` found the object to be one of ours, which `self` keeps alive.
        unsafe { instance::state_unchecked(self.0.as_ptr()) }
    }
}

unsafe extern "C" fn managed_tensor_from_py_object(
    py_object: *mut c_void,
    out: *mut *mut DLManagedTensorVersioned,
) -> c_int {
    // The common case (memory exported in place) without PyO3's attach, which cost a tenth of
    // a tvm-ffi exchange: it runs no Python code, so it only needs the GIL, taken (or found
    // held) by PyGILState_Ensure as numpy's deleters do. (`PyGILState_Check` can't tell: it
    // says yes on any thread once a subinterpreter has existed.)
    let fast = catch_unwind(AssertUnwindSafe(|| {
        if py_object.is_null() {
            return false;
        }
        // SAFETY: the interpreter is running: the consumer holds one of its objects.
        let _gil = unsafe { python::GilState::ensure() };
        // SAFETY: the GIL is held, just above.
        let py = unsafe { Python::assume_attached() };
        // SAFETY: the consumer passes a live object (not null: checked above), and the GIL is held
        // (`_gil`).
        let any = unsafe { pyo3::Borrowed::from_ptr(py, py_object.cast()) };
        match instance::state(&any).and_then(|state| state.export_managed_in_place(&any)) {
            Some(managed) => {
                // SAFETY: the consumer passes a writable slot for the result.
                unsafe { *out = managed.as_ptr() };
                true
            }
            None => false,
        }
    }));
    if let Ok(true) = fast {
        return 0;
    }
    guarded(|py| {
        // SAFETY: the consumer passes a live object (or null).
        let object = unsafe { Checked::new(py, py_object)? };
        let managed = object.state().export_managed(&object.0)?;
        // SAFETY: the consumer gives a writable slot for the result.
        unsafe { *out = managed.as_ptr() };
        Ok(())
    })
}

unsafe extern "C" fn managed_tensor_to_py_object(
    tensor: *mut DLManagedTensorVersioned,
    out_py_object: *mut *mut c_void,
) -> c_int {
    guarded(|py| {
        let managed = ptr::NonNull::new(tensor)
            .ok_or_else(|| Error::value("the C exchange API got a NULL managed tensor"))?;
        // SAFETY: the consumer hands over ownership of a valid managed tensor.
        let tensor = unsafe { import_versioned(managed)? };
        let object = new_object(py, DLPackObject::new(tensor))?;
        // SAFETY: the consumer gives a writable slot; it receives our new reference.
        unsafe { *out_py_object = object.into_ptr().cast() };
        Ok(())
    })
}

unsafe extern "C" fn dltensor_from_py_object(py_object: *mut c_void, out: *mut DLTensor) -> c_int {
    guarded(|py| {
        // SAFETY: the consumer passes a live object (or null).
        let object = unsafe { Checked::new(py, py_object)? };
        let tensor = object.state().tensor();
        let exportable = tensor.exportable().map_err(|reason| {
            Error::buffer(format!("{reason}; a borrowed DLTensor can't be a copy"))
        })?;
        if tensor.readonly() {
            return Err(Error::buffer(
                "read-only memory can't be lent as a bare DLTensor, which has no read-only flag",
            ));
        }
        let device = tensor.device().get()?;
        // Shape and strides point into the object's own tensor, valid while the object lives,
        // as the protocol allows.
        let shape = exportable.shape.as_ptr().cast_mut();
        let strides = exportable.strides.as_ptr().cast_mut();
        // SAFETY: the consumer gives a writable DLTensor.
        unsafe { *out = capsule::dl_tensor(exportable, device, shape, strides) };
        Ok(())
    })
}

unsafe extern "C" fn current_work_stream(
    _device_type: i32,
    _device_id: i32,
    out_current_stream: *mut *mut c_void,
) -> c_int {
    // We own no streams: work on our tensors is ordered by their producers. NULL is the
    // default stream, which the protocol allows.
    if !out_current_stream.is_null() {
        // SAFETY: the consumer gives a writable slot.
        unsafe { *out_current_stream = ptr::null_mut() };
    }
    0
}

/// A new, C-ordered, 64-byte aligned CPU tensor for the prototype's dtype and shape.
///
/// # Safety
/// `prototype.shape` has `prototype.ndim` readable entries (when `ndim > 0` and it is not null).
unsafe fn allocate(prototype: &DLTensor) -> Result<ptr::NonNull<DLManagedTensorVersioned>> {
    if Device::Known(prototype.device) != Device::CPU {
        return Err(Error::buffer(format!(
            "dlpack allocates CPU memory only, not device type {} id {}",
            prototype.device.device_type, prototype.device.device_id
        )));
    }
    let dtype = DType::from_dlpack(prototype.dtype)?;
    let ndim = usize::try_from(prototype.ndim)
        .ok()
        .filter(|&n| n <= layout::MAX_NDIM && (n == 0 || !prototype.shape.is_null()))
        .ok_or_else(|| Error::value(format!("prototype with ndim {}", prototype.ndim)))?;
    let shape = if ndim == 0 {
        &[][..]
    } else {
        // SAFETY: per the contract (`ndim` is the prototype's, the shape not null).
        unsafe { dlpack_core::abi::c_array(prototype.shape, ndim) }
    };
    let layout = Layout::from_byte_strides(shape, None, dtype.itemsize())?;
    let bytes = usize::try_from(layout.numel() * dtype.itemsize() as i64)
        .map_err(|_| Error::value("allocation too large"))?;
    let buffer = AlignedBuffer::new(bytes)?;
    let tensor = Arc::new(Tensor::host_allocation(buffer, dtype, layout)?);
    capsule::new_versioned(
        Described::Own(tensor),
        prototype.device,
        DLPACK_MINOR_VERSION,
        0,
    )
}

unsafe extern "C" fn managed_tensor_allocator(
    prototype: *mut DLTensor,
    out: *mut *mut DLManagedTensorVersioned,
    error_ctx: *mut c_void,
    set_error: Option<DLPackSetError>,
) -> c_int {
    let result = catch_unwind(AssertUnwindSafe(|| {
        if prototype.is_null() || out.is_null() {
            let null = Error::value("NULL prototype or output");
            return Err(null.python_type_name_and_message());
        }
        // SAFETY: the consumer passes a readable prototype.
        let prototype = unsafe { &*prototype };
        // SAFETY: the consumer's prototype's shape has `ndim` entries.
        let allocated = unsafe { allocate(prototype) };
        allocated.map_err(|err| err.python_type_name_and_message())
    }))
    .unwrap_or_else(|payload| {
        let panic = Error::runtime(panic_message(&*payload));
        Err(panic.python_type_name_and_message())
    });
    match result {
        Ok(managed) => {
            // SAFETY: checked non-null above; the consumer receives ownership.
            unsafe { *out = managed.as_ptr() };
            0
        }
        Err((kind, message)) => {
            if let Some(set_error) = set_error {
                let kind = CString::new(kind).unwrap_or_default();
                let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
                // SAFETY: the consumer's callback with its own context and two C strings that
                // live across the call.
                unsafe { set_error(error_ctx, kind.as_ptr(), message.as_ptr()) };
            }
            -1
        }
    }
}
