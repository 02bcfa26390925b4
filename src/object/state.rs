//! `DLPackObject`'s state: the tensor it describes and the producer to ask again, with what the
//! garbage collector and the deallocator need of it, and the bytes it takes (`footprint`). (Its Python-visible behaviour is
//! `methods`'s; the instance that holds it, `instance`'s.)

use std::ffi::c_int;

use pyo3::prelude::*;

use crate::export::capsule;
use crate::ffi::python;
use crate::tensor::Tensor;
use dlpack_core::layout;

/// A DLPack view of another object's memory: pass it to any `from_dlpack`. This is the state of
/// the Python object (see `instance`), immutable once made.
pub struct DLPackObject {
    /// Shared with every capsule exported from it: each holds a reference to this object.
    pub(super) tensor: Tensor,
    /// For device data from a DLPack producer: asked again when a consumer names its stream,
    /// so the producer can order its work before the consumer's.
    pub(super) producer: Option<Py<PyAny>>,
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
    pub(super) fn references_collectable(&self) -> bool {
        self.producer.is_some()
            || self.tensor.owner().for_each_object(|object| {
                // SAFETY: the owner's objects are live (it holds references to them).
                c_int::from(unsafe { python::is_collected(object) })
            }) != 0
    }

    /// Call `visit` on each object this one references (for the garbage collector); stops at,
    /// and returns, the first non-zero result.
    pub(super) fn for_each_reference(
        &self,
        mut visit: impl FnMut(*mut python::PyObject) -> c_int,
    ) -> c_int {
        if let Some(producer) = &self.producer {
            let code = visit(producer.as_ptr());
            if code != 0 {
                return code;
            }
        }
        self.tensor.owner().for_each_object(visit)
    }

    /// Release what a dying object holds, in place (no copy of its state), on a thread known to
    /// hold the GIL (its deallocator); the state is then dead. This may run arbitrary Python
    /// code (the owner's own deallocation).
    ///
    /// # Safety
    /// `state` is a live object's state, not used again; the calling thread holds the GIL.
    pub(super) unsafe fn release_attached_in_place(state: *mut DLPackObject) {
        // SAFETY: per the contract, live and ours alone from here on.
        let DLPackObject { tensor, producer } = unsafe { &mut *state };
        // Both fields are released exactly once, the producer as a plain reference (a `Py` dropped
        // here, outside PyO3's attach, would be queued).
        // SAFETY: `state` is not used again (this function's contract), so `producer` is moved out
        // once and never read again.
        if let Some(producer) = unsafe { std::ptr::read(producer) } {
            // SAFETY: `producer` is the state's own reference, given up once, here; the GIL is held
            // (this function's contract).
            unsafe { python::decref(producer.into_ptr()) };
        }
        // SAFETY: `tensor` belongs to a live state that is not used again, and the GIL is held
        // (this function's contract).
        unsafe { Tensor::release_attached_in_place(tensor) };
    }
}

/// The same state in a PyO3 `#[pyclass]`, measured against the hand-written type (its methods
/// are `probe`'s). Defined here, below `instance`, which finds the state of either type.
#[cfg(feature = "pyclass-probe")]
#[pyclass(
    frozen,
    freelist = 64,
    module = "dlpack._dlpack",
    name = "_PyClassObject"
)]
pub struct PyClassObject(pub(super) DLPackObject);

/// The state of `object` if it is a `_PyClassObject`.
#[cfg(feature = "pyclass-probe")]
pub(super) fn probe_state<'a>(object: &'a Bound<'_, PyAny>) -> Option<&'a DLPackObject> {
    let probe = object.cast_exact::<PyClassObject>().ok()?;
    Some(&probe.get().0)
}

/// Heap bytes behind our objects, for memory reports: `(name, bytes)` pairs. Rust-side sizes
/// are exact; Python object headers are what `sys.getsizeof` adds.
pub fn footprint(ndim: usize) -> Vec<(&'static str, usize)> {
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
