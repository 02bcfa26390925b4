//! `copyto(dst, src)`: the module function, on the copy engines' `copy::copyto`.

use pyo3::prelude::*;

use super::instance::state;
use super::state::DLPackObject;
use crate::copy;
use crate::error::{Error, Result};
use crate::import::{self, array_interface::to_i64, array_interface::type_name};
use crate::tensor::Tensor;

/// Copy `src` into the existing array `dst`, as `numpy.copyto(dst, src)` does: any supported
/// source into any writable destination, host or CUDA (broadcasting `src` like numpy; dtypes
/// must match). Overlapping memory is handled; the GIL is released while large copies run.
/// Host memory a view of a Rust or C extension holds (through the C API) is not written.
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
    // An exact numpy array of a dtype seen before is read from its struct without Python
    // code (what every import starts with for one): the common case's cost is mostly the
    // call's. It is neither immutable nor a copy of the memory.
    let target = match known(dst) {
        Some(tensor) => TensorOf::Imported(tensor),
        None => {
            if import::is_immutable(dst) {
                return Err(Error::value(format!(
                    "{} objects are immutable (to refill a JAX array, use \
                     dlpack.interop.copyto_jax)",
                    type_name(dst)
                ))
                .into());
            }
            destination(dst)?
        }
    };
    let source = match known(src) {
        Some(tensor) => TensorOf::Imported(tensor),
        None => tensor_of(src, import::import)?,
    };
    copy::copy_into(py, &target, &source, stream)?;
    Ok(())
}

/// `obj`'s tensor where it is an exact numpy array whose import needs no Python code
/// (`import::import_known_into`); `None`: ask the general import.
fn known(obj: &Bound<'_, PyAny>) -> Option<Tensor> {
    let mut tensor = std::mem::MaybeUninit::<Tensor>::uninit();
    // SAFETY: `tensor` is valid for writes of a `Tensor`, all `import_known_into` asks.
    let written = unsafe { import::import_known_into(obj, tensor.as_mut_ptr()) };
    // SAFETY: `import_known_into` wrote the tensor whole when it says so.
    written.then(|| unsafe { tensor.assume_init() })
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
