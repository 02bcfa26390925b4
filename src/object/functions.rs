//! The module's functions: `asdlpack` (and its fast path, for `pytype`'s entry point, and
//! `read`, what it takes an object as without making one), `copyto` and `_footprint`.

use pyo3::prelude::*;

use super::instance::{self, new_object, state, state_unchecked};
use super::stand_in;
use super::state::DLPackObject;
use crate::copy;
use crate::error::{Error, Result};
use crate::export::capsule;
use crate::import::{self, array_interface::to_i64, array_interface::type_name};
use crate::tensor::Tensor;
use dlpack_core::layout;

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
    unsafe { instance::new_object_with(obj.py(), init) }
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
            "{} objects are immutable; copyto can't write into them",
            type_name(dst)
        ))
        .into());
    }
    let target = destination(dst)?;
    let source = tensor_of(src, import::import)?;
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

/// A `DLPackObject`'s own tensor, or `obj` imported by `import`.
fn tensor_of<'a>(
    obj: &'a Bound<'_, PyAny>,
    import: fn(&Bound<'_, PyAny>) -> Result<import::Imported>,
) -> Result<TensorOf<'a>> {
    if let Some(existing) = state(obj) {
        return Ok(TensorOf::Object(existing));
    }
    Ok(TensorOf::Imported(import(obj)?.tensor))
}

/// The memory `copyto` writes: the destination's own, never a copy an import made (values
/// written there would never reach it), which is a `ValueError` saying why it was a copy.
fn destination<'a>(obj: &'a Bound<'_, PyAny>) -> Result<TensorOf<'a>> {
    let target = tensor_of(obj, import::import_in_place)?;
    if let Some(why) = target.copied() {
        return Err(Error::value(format!(
            "copyto can't write into this {}: its memory could only be read as a copy ({why}), \
             so the values would never reach it",
            type_name(obj)
        )));
    }
    Ok(target)
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
