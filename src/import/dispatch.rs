//! `import`: which protocol an object is read through (see the module's doc for the order), and
//! what a type's exports mean (immutable JAX arrays, masked numpy arrays, torch's flags).

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyString;

use super::{array_interface, arrow, buffer, cuda_array_interface, dlpack, numpy, protocols};
use crate::arrow_c::Method;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// What `asdlpack` imported, and the DLPack producer to ask again when a consumer names a
/// stream (device data only).
pub struct Imported {
    pub tensor: Tensor,
    pub producer: Option<Py<PyAny>>,
}

/// `import` for the commonest case, when it needs no Python code: an exact numpy array of a
/// dtype seen last time, written into `dst` (see `numpy::import_known_into`). False otherwise
/// (`dst` untouched; `import` then says what it is, or what is wrong).
///
/// # Safety
/// `dst` is valid for writes of a `Tensor`.
#[inline(always)]
pub unsafe fn import_known_into(obj: &Bound<'_, PyAny>, dst: *mut Tensor) -> bool {
    let Some(array) = numpy::ExactNdarray::new(obj) else {
        return false;
    };
    // SAFETY: per the contract.
    unsafe { numpy::import_known_into(array, dst) }
}

/// Whether `obj` is an array its library keeps immutable (JAX), whatever its exports say.
pub fn is_immutable(obj: &Bound<'_, PyAny>) -> bool {
    protocols::of_type(&obj.get_type()).immutable
}

pub fn import(obj: &Bound<'_, PyAny>) -> Result<Imported> {
    import_with(obj, true)
}

/// `import` of the memory itself, never a copy a producer substitutes: C exchange APIs may hand
/// over a copy of read-only memory (ours does, see `object::exchange_api`), so only torch's
/// (which exports the tensor's own memory) is used. For callers that write through what they
/// import, or report its flags.
pub fn import_in_place(obj: &Bound<'_, PyAny>) -> Result<Imported> {
    import_with(obj, false)
}

fn import_with<'py>(obj: &Bound<'py, PyAny>, any_exchange_api: bool) -> Result<Imported> {
    let py = obj.py();
    // The common case first, without the per-type lookup: an exact numpy array.
    let exact_ndarray = numpy::ExactNdarray::new(obj);
    if let Some(array) = exact_ndarray
        && let Some(tensor) = numpy::import(array)?
    {
        return Ok(Imported {
            tensor,
            producer: None,
        });
    }
    if let Some(kind) = arrow::stream_capsule_kind(obj) {
        return Ok(Imported {
            tensor: arrow::import_stream(obj, kind)?,
            producer: None,
        });
    }
    if dlpack::is_capsule(obj) {
        return Ok(Imported {
            tensor: dlpack::import_capsule(obj)?,
            producer: None,
        });
    }
    let protocols = protocols::of_type(&obj.get_type());
    if protocols.numpy_masked {
        refuse_masked_elements(obj)?;
    }
    // The first array of the process: the probe just found numpy's type.
    if protocols.ndarray
        && exact_ndarray.is_none()
        && let Some(array) = numpy::ExactNdarray::new(obj)
        && let Some(tensor) = numpy::import(array)?
    {
        return Ok(Imported {
            tensor,
            producer: None,
        });
    }
    let attr = |name: &Bound<'py, PyString>, on_type: bool| -> Result<Option<Bound<'py, PyAny>>> {
        // A type that declares the Arrow interface is served through what it declares: its
        // instances are not asked for protocols it lacks (a failed lookup on a polars Series
        // runs its `__getattr__`, several microseconds each).
        let instance_lookups = protocols.dynamic && !protocols.arrow;
        if on_type || instance_lookups {
            Ok(obj.getattr_opt(name)?)
        } else {
            Ok(None) // neither the type nor (lacking a __dict__ or __getattr__) the instance has it
        }
    };
    // The Arrow PyCapsule interface, its methods in `Method::ALL`'s order: `None` for an object
    // without it.
    let arrow_import = || -> Result<Option<Tensor>> {
        for method in Method::ALL {
            let declared = protocols.arrow_methods[method as usize];
            if let Some(bound) = attr(protocols::arrow_name(py, method), declared)? {
                return arrow::import_method(&bound, method).map(Some);
            }
        }
        Ok(None)
    };
    if (any_exchange_api || protocols.torch)
        && let Some(table) = protocols.exchange_api
        && (!protocols.torch || torch_exports_faithfully(obj)?)
    {
        // SAFETY: `protocols` are those of `obj`'s type, so `table` is its exchange API.
        if let Some(mut tensor) = unsafe { dlpack::import_exchange_api(obj, table) } {
            if protocols.immutable {
                tensor.make_readonly(); // as below
            }
            return Ok(Imported {
                tensor,
                producer: None,
            });
        }
    }
    let mut refused = None;
    if let Some(method) = attr(intern!(py, "__dlpack__"), protocols.dlpack)? {
        match dlpack::import_producer(&method, None) {
            Ok(mut tensor) => {
                // Lent on to consumers that may write (the buffer protocol, the array
                // interface), an immutable array's memory must say it is read-only.
                if protocols.immutable {
                    tensor.make_readonly();
                }
                let on_device = !matches!(tensor.device().get(), Ok(d) if d.is_host());
                let producer = on_device.then(|| obj.clone().unbind());
                return Ok(Imported { tensor, producer });
            }
            // torch refuses nested tensors by their layout, or fails with an "internal error":
            // say what is wrong instead.
            Err(_) if protocols.torch && is_nested(obj) => return Err(nested_tensor()),
            // Arrow arrays' own DLPack export refuses much the Arrow interface serves
            // (booleans, fixed-size lists, any validity bitmap), with errors of its own types.
            Err(_) if protocols.arrow => {
                let tensor =
                    arrow_import()?.ok_or_else(|| Error::type_("the Arrow interface went away"))?;
                return Ok(Imported {
                    tensor,
                    producer: None,
                });
            }
            Err(err) if err.is_buffer_error(py) => refused = Some(err),
            Err(err) => return Err(err),
        }
    }
    let fallback = || -> Result<Option<Tensor>> {
        if let Some(cai) = attr(
            intern!(py, "__cuda_array_interface__"),
            protocols.cuda_array_interface,
        )? {
            return cuda_array_interface::import(obj, cai).map(Some);
        }
        if let Some(capsule) = attr(intern!(py, "__array_struct__"), protocols.array_struct)? {
            return array_interface::import_struct(obj, capsule).map(Some);
        }
        if let Some(interface) = attr(
            intern!(py, "__array_interface__"),
            protocols.array_interface,
        )? {
            return array_interface::import(obj, interface).map(Some);
        }
        // After the array interface: an object with both (a Pillow image) describes its shape
        // there, while its Arrow export is a flat column of pixels.
        if let Some(tensor) = arrow_import()? {
            return Ok(Some(tensor));
        }
        if buffer::supports(obj) {
            return buffer::import(obj).map(Some);
        }
        if let Some(method) = attr(intern!(py, "__array__"), protocols.numpy_array)? {
            return numpy_array(obj, &method).map(Some);
        }
        Ok(None)
    };
    match (fallback(), refused) {
        (Ok(Some(mut tensor)), _) => {
            if protocols.immutable {
                tensor.make_readonly(); // immutable, whatever its exports say
            }
            Ok(Imported {
                tensor,
                producer: None,
            })
        }
        // The producer's own refusal explains best what is wrong.
        (Ok(None), Some(refusal)) | (Err(_), Some(refusal)) => Err(refusal),
        (Err(err), None) => Err(err),
        (Ok(None), None) => Err(Error::type_(format!(
            "asdlpack() needs an object that supports DLPack (__dlpack__ or a DLPack capsule), \
             the CUDA array interface (__cuda_array_interface__), the Arrow PyCapsule interface \
             (__arrow_c_array__ / __arrow_c_stream__ and their device variants), the array \
             interface (__array_interface__ / __array_struct__), the buffer protocol or numpy's \
             __array__; {} supports none",
            array_interface::type_name(obj)
        ))),
    }
}

/// numpy's `__array__(copy=False)`, the last resort: the object's own memory as a numpy array,
/// or its own error (never a silent copy).
fn numpy_array(obj: &Bound<'_, PyAny>, method: &Bound<'_, PyAny>) -> Result<Tensor> {
    let py = obj.py();
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item(intern!(py, "copy"), false)?;
    let array = method.call((), Some(&kwargs))?;
    if !protocols::of_type(&array.get_type()).ndarray {
        return Err(Error::type_(format!(
            "{}.__array__() returned {}, not a numpy array",
            array_interface::type_name(obj),
            array_interface::type_name(&array)
        )));
    }
    Ok(import(&array)?.tensor)
}

/// A numpy masked array exports its data without the mask (numpy's own `__dlpack__` and array
/// interface drop it), so one with masked elements would reach the consumer with whatever those
/// elements' memory holds: refused. Without masked elements its data are its values.
fn refuse_masked_elements(array: &Bound<'_, PyAny>) -> Result<()> {
    let py = array.py();
    let is_masked = py
        .import(intern!(py, "numpy.ma"))?
        .getattr(intern!(py, "is_masked"))?;
    if is_masked.call1((array,))?.is_truthy()? {
        return Err(Error::buffer(
            "a numpy masked array with masked elements can't be DLPack (DLPack has no mask): \
             pass .filled(value) for its values, or .data for the memory as it is",
        ));
    }
    Ok(())
}

/// Whether `tensor` (a torch tensor) is a nested one: a list of tensors of different shapes.
fn is_nested(tensor: &Bound<'_, PyAny>) -> bool {
    let py = tensor.py();
    tensor
        .getattr(intern!(py, "is_nested"))
        .and_then(|flag| flag.is_truthy())
        .unwrap_or(false)
}

#[cold]
fn nested_tensor() -> Error {
    Error::buffer(
        "a torch nested tensor has no single strided layout, so DLPack can't describe it: pad it \
         (nested.to_padded_tensor(0.0)) or unbind() it into a list of tensors",
    )
}

/// Whether torch's C exchange API gives this tensor's true values. It exports the raw memory
/// of tensors whose conjugate or negative bit is set (their values are the memory's conjugate
/// or negation) and of tensors that require grad, all of which torch's `__dlpack__` refuses:
/// those take the `__dlpack__` path, which raises torch's own error. The negative bit is
/// refused here, since torch's `__dlpack__` exports it without a word.
fn torch_exports_faithfully(tensor: &Bound<'_, PyAny>) -> Result<bool> {
    let py = tensor.py();
    let flag = |name| -> Result<bool> { Ok(tensor.call_method0(name)?.is_truthy()?) };
    if flag(intern!(py, "is_neg"))? {
        return Err(Error::buffer(
            "this torch tensor has its negative bit set (a lazy negation DLPack can't carry); \
             call .resolve_neg() first",
        ));
    }
    Ok(!flag(intern!(py, "is_conj"))?
        && !tensor.getattr(intern!(py, "requires_grad"))?.is_truthy()?)
}
