//! `asdlpack`, its fast path (for `pytype`'s entry point), and `read`: what it takes an object
//! as without making one.

use pyo3::prelude::*;

use super::instance::{self, new_object, state_unchecked};
use super::stand_in;
use super::state::DLPackObject;
use crate::error::Result;
use crate::import;
use crate::tensor::Tensor;

/// Wrap `obj` (anything with DLPack, the CUDA array interface, the array interface or the
/// buffer protocol) in a `DLPackObject`, without copying.
pub fn asdlpack<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    match read(obj)?.0 {
        Read::Object(object) => Ok(object),
        Read::Imported(import::Imported { tensor, producer }) => {
            new_object(obj.py(), DLPackObject { tensor, producer })
        }
    }
}

/// What `asdlpack` takes an object as, for callers that only read its memory (`tensor`): the
/// `DLPackObject` it is or stands for, or what was imported from it, without making an object.
pub struct AsRead<'py>(Read<'py>);

enum Read<'py> {
    /// Only ever a `DLPackObject` (checked where it is made, in `read`).
    Object(Bound<'py, PyAny>),
    Imported(import::Imported),
}

/// `obj` as `asdlpack` takes it.
pub fn read<'py>(obj: &Bound<'py, PyAny>) -> Result<AsRead<'py>> {
    // DLPackObject is final: an exact type check suffices (and skips a subtype walk).
    if instance::is_instance(obj) {
        return Ok(AsRead(Read::Object(obj.clone())));
    }
    if let Some(view) = stand_in::view_of(obj).filter(instance::is_instance) {
        return Ok(AsRead(Read::Object(view)));
    }
    Ok(AsRead(Read::Imported(import::import(obj)?)))
}

impl AsRead<'_> {
    /// The description of the memory.
    pub fn tensor(&self) -> &Tensor {
        match &self.0 {
            // SAFETY: a `DLPackObject` (`read` checked it), live while `self` holds it.
            Read::Object(object) => unsafe { state_unchecked(object.as_ptr()) }.tensor(),
            Read::Imported(imported) => &imported.tensor,
        }
    }
}

/// `asdlpack`'s fast path, for `pytype`'s entry point (outside PyO3's, so it calls no Python
/// code of its own, though allocating the object may run a garbage collection): a
/// `DLPackObject`, or an exact ndarray whose description needs nothing new. `None`: take
/// `asdlpack`, which also gives errors; `Some(Err)`: the object could not be made.
#[inline(always)]
pub(super) fn asdlpack_known<'py>(obj: &Bound<'py, PyAny>) -> Option<PyResult<Bound<'py, PyAny>>> {
    if instance::is_instance(obj) {
        return Some(Ok(obj.clone()));
    }
    let init = |state: *mut DLPackObject| {
        // A declined state holds only the producer's `None`, which needs no drop.
        // SAFETY: `state` points at a new instance's uninitialised state (`new_object_with`'s
        // word), so its fields' addresses lie inside it.
        let producer = unsafe { &raw mut (*state).producer };
        // SAFETY: the field is uninitialised memory of the new instance, ours to write once.
        unsafe { producer.write(None) };
        // SAFETY: `state` points at the new instance's state, which the field lies inside.
        let tensor = unsafe { &raw mut (*state).tensor };
        // SAFETY: the tensor field is uninitialised memory of the new instance, valid for
        // writes of a `Tensor`, which is what `import_known_into` asks.
        unsafe { import::import_known_into(obj, tensor) }
    };
    // SAFETY: `init` writes the state whole when it says so.
    unsafe { instance::new_object_with(obj.py(), init) }
}
