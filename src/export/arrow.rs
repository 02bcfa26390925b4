//! The Arrow PyCapsule interface out: `__arrow_c_array__` and `__arrow_c_stream__` of host
//! memory, and their device variants (`__arrow_c_device_array__`, `__arrow_c_device_stream__`)
//! of it as CPU memory, so that `pyarrow.array(obj)`, `pyarrow.chunked_array(obj)`,
//! `polars.Series(obj)` and other Arrow consumers take a `DLPackObject`. All give the same one
//! array (a stream is that array alone, `export::arrow_stream`). A 1-D array of numbers is its
//! memory as it is; N-d C-ordered memory an `arrow.fixed_shape_tensor` (or nested fixed-size
//! lists, when the consumer asks for them); other layouts one C-ordered copy, booleans one copy
//! into bits. The Arrow array keeps the source alive (a reference to the object, released by Python's own
//! rules when the consumer lets go on a thread without the interpreter).

use std::panic::AssertUnwindSafe;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_array::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
use arrow_buffer::{BooleanBuffer, Buffer};
use arrow_data::ArrayData;
use arrow_schema::{DataType, Field};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyTuple};

use super::arrow_stream;
use crate::arrow_c::{FFI_ArrowDeviceArray, Method, SCHEMA};
use crate::copy::to_c_order;
use crate::error::{Error, Result};
use crate::import::arrow_check;
use crate::import::arrow_values::arrow_type;
use crate::tensor::Tensor;

/// What keeps exported memory alive: the `DLPackObject`, or a copy of our own.
struct Keep(#[allow(dead_code, reason = "held until Arrow lets go")] AssertUnwindSafe<Held>);

enum Held {
    Object(std::mem::ManuallyDrop<Py<PyAny>>),
    Copy(#[allow(dead_code, reason = "held")] Box<Tensor>),
}

impl Drop for Held {
    fn drop(&mut self) {
        // Arrow consumers release on any thread, with or without the interpreter: the reference
        // goes at once where this thread can attach (PyO3 would otherwise queue it until its
        // next call), and is left to the process' exit where it can't (shutdown).
        if let Held::Object(object) = self {
            // SAFETY: taken once, here; the field is not used again.
            let object = unsafe { std::mem::ManuallyDrop::take(object) };
            let mut slot = Some(object);
            Python::try_attach(|_| drop(slot.take()));
            if let Some(object) = slot {
                std::mem::forget(object);
            }
        }
    }
}

/// What `method(requested_schema)` of `object`, whose tensor is `tensor`, returns: (schema,
/// array) capsules from the array methods, a stream capsule from the stream ones. All four give
/// the same one array (the device ones as the CPU's: device id -1, no event); a stream is of
/// that array alone, made now (a copy, where there is one, is made here, on the caller's
/// thread). A capsule no consumer takes releases what it holds.
pub fn export_method<'py>(
    object: &Bound<'py, PyAny>,
    tensor: &Tensor,
    requested_schema: Option<&Bound<'py, PyAny>>,
    method: Method,
) -> Result<Bound<'py, PyAny>> {
    let py = object.py();
    let (array, field) = export(object, tensor, requested_schema, method.name())?;
    // Written now for the arrays; a stream writes its own on each `get_schema`, and this one
    // shows that it can.
    let schema = FFI_ArrowSchema::try_from(&field).map_err(arrow_error)?;
    let capsule = match method {
        Method::Array => PyCapsule::new_with_value(py, array, method.capsule())?,
        Method::DeviceArray => {
            PyCapsule::new_with_value(py, FFI_ArrowDeviceArray::cpu(array), method.capsule())?
        }
        Method::Stream => {
            let stream = arrow_stream::one_array(field, array);
            return Ok(PyCapsule::new_with_value(py, stream, method.capsule())?.into_any());
        }
        Method::DeviceStream => {
            let stream = arrow_stream::one_device_array(field, FFI_ArrowDeviceArray::cpu(array));
            return Ok(PyCapsule::new_with_value(py, stream, method.capsule())?.into_any());
        }
    };
    let schema = PyCapsule::new_with_value(py, schema, SCHEMA)?;
    Ok(PyTuple::new(py, [schema.into_any(), capsule.into_any()])?.into_any())
}

/// The Arrow array of `object`'s memory and its field (type and extension metadata), for
/// `method` (named in the error for device memory).
fn export(
    object: &Bound<'_, PyAny>,
    tensor: &Tensor,
    requested_schema: Option<&Bound<'_, PyAny>>,
    method: &str,
) -> Result<(FFI_ArrowArray, Field)> {
    let py = object.py();
    let device = tensor.device().get()?;
    if !device.is_host() {
        return Err(Error::buffer(format!(
            "memory on {} can't be an Arrow array on the CPU ({method}), and Arrow device arrays \
             are made here of CPU memory only: copy it to the host first, or pass it through \
             DLPack",
            device.name()
        )));
    }
    let leaf_type = arrow_type(tensor.dtype())
        .ok_or_else(|| Error::type_(format!("{} has no Arrow type", tensor.dtype().name())))?;
    let shape: Vec<usize> = tensor
        .layout()
        .shape()
        .iter()
        .map(|&n| n as usize)
        .collect();
    let Some((&rows, inner)) = shape.split_first() else {
        return Err(Error::value(
            "a 0-d array is no Arrow array (Arrow arrays have a length): reshape it to (1,)",
        ));
    };
    // Arrow's list sizes are 32-bit: a row of more elements has no Arrow type.
    let list_size = |size: u128| {
        i32::try_from(size).map_err(|_| {
            Error::value(format!(
                "rows of shape {inner:?} hold {size} elements, more than an Arrow fixed-size \
                 list can (2**31 - 1): reshape the array so that each row holds fewer"
            ))
        })
    };
    let sizes = inner
        .iter()
        .map(|&n| list_size(n as u128))
        .collect::<Result<Vec<i32>>>()?;
    let row_size = list_size(
        inner
            .iter()
            .fold(1u128, |a, &n| a.saturating_mul(n as u128)),
    )?;
    let nested = match requested_schema {
        None => false,
        Some(requested) => requested_nested(requested, &leaf_type, &sizes)?,
    };
    // The memory, C-ordered in native byte order: the tensor's own, or a copy (whose buffer
    // stays where it is when the copy moves into `Held`).
    // Arrow buffers are aligned to their elements (arrow-rs refuses others): a misaligned
    // source is copied, as other layouts are.
    let aligned = (tensor.data() as usize).is_multiple_of(tensor.dtype().itemsize().max(1));
    let in_place = tensor.layout().is_c_contiguous() && tensor.exportable().is_ok() && aligned;
    let (data, held) = if in_place {
        (
            tensor.data(),
            Held::Object(std::mem::ManuallyDrop::new(object.clone().unbind())),
        )
    } else {
        let copy = to_c_order(py, tensor)?;
        (copy.data(), Held::Copy(Box::new(copy)))
    };
    let numel: usize = shape.iter().product();
    let itemsize = tensor.dtype().itemsize();
    let keep: Arc<dyn arrow_buffer::alloc::Allocation> = Arc::new(Keep(AssertUnwindSafe(held)));
    let values = if leaf_type == DataType::Boolean {
        // SAFETY: `numel` one-byte elements at `data`, C-ordered (above), alive while `keep` is
        // (here).
        let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), numel) };
        BooleanBuffer::collect_bool(numel, |k| bytes[k] != 0).into_inner()
    } else {
        let start = NonNull::new(data.cast::<u8>()).unwrap_or(NonNull::dangling());
        // SAFETY: `numel * itemsize` bytes at `start` are the C-ordered elements, which `keep`
        // keeps alive as long as the buffer lives; Arrow only reads them.
        unsafe { Buffer::from_custom_allocation(start, numel * itemsize, keep) }
    };
    let leaf = ArrayData::builder(leaf_type.clone())
        .len(numel)
        .add_buffer(values)
        .build()
        .map_err(|e| Error::buffer(format!("this memory can't be an Arrow array: {e}")))?;
    let (data, field) = if inner.is_empty() {
        (leaf, Field::new("", leaf_type, false))
    } else if nested {
        let mut data = leaf;
        let mut item = Field::new("item", leaf_type, true);
        for (level, &size) in sizes.iter().enumerate().rev() {
            let len = shape[..=level].iter().product::<usize>();
            let list = DataType::FixedSizeList(Arc::new(item), size);
            data = fixed_size_list(list.clone(), len, data)?;
            item = Field::new("item", list, true);
        }
        let data_type = item.data_type().clone();
        (data, Field::new("", data_type, false))
    } else {
        let list = DataType::FixedSizeList(Arc::new(Field::new("item", leaf_type, true)), row_size);
        let data = fixed_size_list(list.clone(), rows, leaf)?;
        let metadata = [
            (
                "ARROW:extension:name".to_owned(),
                "arrow.fixed_shape_tensor".to_owned(),
            ),
            (
                "ARROW:extension:metadata".to_owned(),
                format!("{{\"shape\":{inner:?}}}"),
            ),
        ];
        (
            data,
            Field::new("", list, false).with_metadata(std::collections::HashMap::from(metadata)),
        )
    };
    Ok((FFI_ArrowArray::new(&data), field))
}

fn fixed_size_list(data_type: DataType, len: usize, child: ArrayData) -> Result<ArrayData> {
    ArrayData::builder(data_type)
        .len(len)
        .add_child_data(child)
        .build()
        .map_err(arrow_error)
}

/// Whether the consumer's requested schema asks for nested fixed-size lists rather than the
/// tensor extension type; a `ValueError` for any other request that isn't what we give.
fn requested_nested(requested: &Bound<'_, PyAny>, leaf: &DataType, inner: &[i32]) -> Result<bool> {
    let capsule = requested
        .cast::<PyCapsule>()
        .map_err(|_| Error::type_("requested_schema must be a PyCapsule named \"arrow_schema\""))?;
    let pointer = capsule
        .pointer_checked(Some(SCHEMA))
        .map_err(|_| Error::type_("requested_schema must be a PyCapsule named \"arrow_schema\""))?;
    // SAFETY: a capsule of this name holds an `ArrowSchema`, which we only read (the consumer
    // keeps and releases it).
    let schema = unsafe { &*pointer.as_ptr().cast::<FFI_ArrowSchema>() };
    let field = arrow_check::readable(schema)?;
    let mut nested = leaf.clone();
    for &size in inner.iter().rev() {
        nested = DataType::FixedSizeList(Arc::new(Field::new("item", nested, true)), size);
    }
    let is_extension = field.metadata().contains_key("ARROW:extension:name");
    if !is_extension && same_type(field.data_type(), &nested) {
        return Ok(!inner.is_empty());
    }
    let tensor = !inner.is_empty()
        && field
            .metadata()
            .get("ARROW:extension:name")
            .map(String::as_str)
            == Some("arrow.fixed_shape_tensor");
    if tensor || (inner.is_empty() && same_type(field.data_type(), leaf)) {
        return Ok(false);
    }
    Err(Error::value(format!(
        "this array is {} of shape {inner:?} per row; it can't be given as the requested Arrow \
         type {}",
        leaf,
        field.data_type()
    )))
}

/// Types equal up to the names and nullability of list items.
fn same_type(a: &DataType, b: &DataType) -> bool {
    match (a, b) {
        (DataType::FixedSizeList(x, n), DataType::FixedSizeList(y, m)) => {
            n == m && same_type(x.data_type(), y.data_type())
        }
        _ => a == b,
    }
}

#[cold]
fn arrow_error(err: arrow_schema::ArrowError) -> Error {
    Error::value(format!("Arrow export failed: {err}"))
}
