//! The Arrow PyCapsule interface out: `__arrow_c_array__` and `__arrow_c_stream__` of host
//! memory, and their device variants (`__arrow_c_device_array__`, `__arrow_c_device_stream__`)
//! of it as CPU memory, so that `pyarrow.array(obj)`, `pyarrow.chunked_array(obj)`,
//! `polars.Series(obj)` and other Arrow consumers take a `DLPackObject`. All give the same one
//! array (a stream is that array alone, `export::arrow_stream`). A 1-D array of numbers is its
//! memory as it is; N-d C-ordered memory an `arrow.fixed_shape_tensor`; other layouts one
//! C-ordered copy, booleans one copy into bits. A consumer's requested type is given where it is
//! a row the array has in our element type (`Row::requested`), refused otherwise. The Arrow
//! array keeps the source alive (a reference to the object, released by Python's own rules when
//! the consumer lets go on a thread without the interpreter).

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
use crate::copy::to_c_order;
use crate::error::{Error, Result};
use crate::ffi::arrow::{FFI_ArrowDeviceArray, Method, SCHEMA};
use crate::import::arrow_check;
use crate::import::arrow_values::{arrow_type, fixed_shape_tensor};
use crate::tensor::Tensor;

/// What keeps exported memory alive: the `DLPackObject`, or a copy of our own.
struct Keep(#[allow(dead_code, reason = "held until Arrow lets go")] AssertUnwindSafe<Keeper>);

enum Keeper {
    Object(std::mem::ManuallyDrop<Py<PyAny>>),
    Copy(#[allow(dead_code, reason = "held")] Box<Tensor>),
}

impl Drop for Keeper {
    fn drop(&mut self) {
        // Arrow consumers release on any thread, with or without the interpreter: the reference
        // goes at once where this thread can attach (PyO3 would otherwise queue it until its
        // next call), and is left to the process' exit where it can't (shutdown).
        if let Keeper::Object(object) = self {
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
    if shape.is_empty() {
        return Err(Error::value(
            "a 0-d array is no Arrow array (Arrow arrays have a length): reshape it to (1,)",
        ));
    }
    let row = match requested_schema {
        None => Row::of(&shape),
        Some(requested) => Row::requested(requested, &leaf_type, &shape)?,
    };
    // Arrow's list sizes are 32-bit: a row of more elements has no Arrow type.
    let list_size = |size: Option<usize>| {
        size.and_then(|size| i32::try_from(size).ok()).ok_or_else(|| {
            Error::value(format!(
                "rows of shape {:?} hold {}, more than an Arrow fixed-size list can (2**31 - 1): \
                 reshape the array so that each row holds fewer",
                row.shape,
                size.map_or_else(|| "more than 2**64 elements".to_owned(), |n| format!("{n} elements"))
            ))
        })
    };
    let sizes = row
        .shape
        .iter()
        .map(|&n| list_size(Some(n)))
        .collect::<Result<Vec<i32>>>()?;
    let row_size = list_size(
        row.shape
            .iter()
            .try_fold(1usize, |n, &extent| n.checked_mul(extent)),
    )?;
    // The dimensions before the row's are the rows: a prefix of the shape, whose products the
    // layout checked when it was made (they fit an i64).
    let rows: usize = shape[..shape.len() - row.dims].iter().product();
    // The memory, C-ordered in native byte order: the tensor's own, or a copy (whose buffer
    // stays where it is when the copy moves into `Keeper`).
    // Arrow buffers are aligned to their elements (arrow-rs refuses others): a misaligned
    // source is copied, as other layouts are.
    let aligned = (tensor.data() as usize).is_multiple_of(tensor.dtype().itemsize().max(1));
    let in_place = tensor.layout().is_c_contiguous() && tensor.exportable().is_ok() && aligned;
    let (data, held) = if in_place {
        (
            tensor.data(),
            Keeper::Object(std::mem::ManuallyDrop::new(object.clone().unbind())),
        )
    } else {
        let copy = to_c_order(py, tensor)?;
        (copy.data(), Keeper::Copy(Box::new(copy)))
    };
    let numel = tensor.layout().numel() as usize;
    let itemsize = tensor.dtype().itemsize();
    let keep: Arc<dyn arrow_buffer::alloc::Allocation> = Arc::new(Keep(AssertUnwindSafe(held)));
    let values = if leaf_type == DataType::Boolean {
        // SAFETY: `numel` one-byte elements at `data`, C-ordered (above), alive while `keep` is
        // (here); none may be at NULL (torch's empty tensors), which `c_array` allows.
        let bytes = unsafe { dlpack_core::abi::c_array(data.cast::<u8>().cast_const(), numel) };
        BooleanBuffer::collect_bool(numel, |k| bytes[k] != 0).into_inner()
    } else {
        // Without elements the address may be anything (torch's is NULL), but Arrow consumers
        // check a buffer's alignment whatever its length: an empty one gets an aligned address.
        let start = match NonNull::new(data.cast::<u8>()) {
            Some(start) if numel > 0 => start,
            _ => super::buffer::empty_elements(),
        };
        // SAFETY: `numel * itemsize` bytes at `start` are the C-ordered elements, which `keep`
        // keeps alive as long as the buffer lives (none at `empty_elements`); Arrow only reads
        // them.
        unsafe { Buffer::from_custom_allocation(start, numel * itemsize, keep) }
    };
    let leaf = ArrayData::builder(leaf_type.clone())
        .len(numel)
        .add_buffer(values)
        .build()
        .map_err(|e| Error::buffer(format!("this memory can't be an Arrow array: {e}")))?;
    let (data, field) = match row.form {
        Form::Plain => (leaf, Field::new("", leaf_type, false)),
        Form::Nested => {
            let mut data = leaf;
            let mut item = Field::new("item", leaf_type, true);
            for (level, &size) in sizes.iter().enumerate().rev() {
                // As many lists at this level as the rows hold: a product of the shape's
                // prefix, which fits (above).
                let len = rows * row.shape[..level].iter().product::<usize>();
                let list = DataType::FixedSizeList(Arc::new(item), size);
                data = fixed_size_list(list.clone(), len, data)?;
                item = Field::new("item", list, true);
            }
            let data_type = item.data_type().clone();
            (data, Field::new("", data_type, false))
        }
        Form::Tensor(metadata) => {
            let list =
                DataType::FixedSizeList(Arc::new(Field::new("item", leaf_type, true)), row_size);
            let data = fixed_size_list(list.clone(), rows, leaf)?;
            let metadata = [
                (EXTENSION_NAME.to_owned(), FIXED_SHAPE_TENSOR.to_owned()),
                (EXTENSION_METADATA.to_owned(), metadata),
            ];
            (
                data,
                Field::new("", list, false)
                    .with_metadata(std::collections::HashMap::from(metadata)),
            )
        }
    };
    Ok((FFI_ArrowArray::new(&data), field))
}

const EXTENSION_NAME: &str = "ARROW:extension:name";
const EXTENSION_METADATA: &str = "ARROW:extension:metadata";
const FIXED_SHAPE_TENSOR: &str = "arrow.fixed_shape_tensor";

/// What each element of the exported Arrow array is: a row of the array, of `shape`, which
/// holds the array's last `dims` dimensions (those before them count the rows): they are its
/// shape, or one list of all their elements. Typed as `form` says.
struct Row {
    shape: Vec<usize>,
    dims: usize,
    form: Form,
}

/// How a row is typed.
enum Form {
    /// A number: a column of them.
    Plain,
    /// Nested fixed-size lists, one level per dimension of the row.
    Nested,
    /// The `arrow.fixed_shape_tensor` extension type over a fixed-size list of the row's
    /// elements; its extension metadata (JSON).
    Tensor(String),
}

impl Row {
    /// What we give unasked: a column for 1-D arrays, a tensor of the rest of the shape per row
    /// for N-d ones.
    fn of(shape: &[usize]) -> Row {
        let inner = shape[1..].to_vec();
        let dims = inner.len();
        if inner.is_empty() {
            return Row {
                shape: inner,
                dims,
                form: Form::Plain,
            };
        }
        let metadata = format!("{{\"shape\":{inner:?}}}");
        Row {
            shape: inner,
            dims,
            form: Form::Tensor(metadata),
        }
    }

    /// What a consumer's requested schema asks, where we can give it: our element type, and a
    /// row that is the array's last dimensions (a plain type, nested lists of their sizes, a
    /// fixed shape tensor of their shape: the dimensions before them count the rows), or all
    /// the elements of its last dimensions in one list. A `ValueError` naming both types for
    /// anything else, which would need a cast, a transposing copy or a row that splits a
    /// dimension (none is made here).
    fn requested(requested: &Bound<'_, PyAny>, leaf: &DataType, shape: &[usize]) -> Result<Row> {
        let wrong = || Error::type_("requested_schema must be a PyCapsule named \"arrow_schema\"");
        let capsule = requested.cast::<PyCapsule>().map_err(|_| wrong())?;
        let pointer = capsule.pointer_checked(Some(SCHEMA)).map_err(|_| wrong())?;
        // SAFETY: a capsule of this name holds an `ArrowSchema`, which we only read (the
        // consumer keeps and releases it).
        let schema = unsafe { &*pointer.as_ptr().cast::<FFI_ArrowSchema>() };
        let field = arrow_check::readable(schema)?;
        let refuse = |why: String| {
            let extension = match field.metadata().get(EXTENSION_NAME) {
                Some(name) => format!(
                    "{name} {} over ",
                    field
                        .metadata()
                        .get(EXTENSION_METADATA)
                        .map_or("", String::as_str)
                ),
                None => String::new(),
            };
            Error::value(format!(
                "this array is {leaf} of shape {shape:?}; it can't be given as the requested \
                 Arrow type {extension}{}: {why}",
                field.data_type()
            ))
        };
        // The requested element type under its fixed-size lists, and their sizes.
        let (mut element, mut sizes) = (field.data_type(), Vec::new());
        while let DataType::FixedSizeList(item, size) = element {
            let size = usize::try_from(*size)
                .map_err(|_| refuse(format!("its list size {size} is negative")))?;
            sizes.push(size);
            element = item.data_type();
        }
        let extension = field.metadata().get(EXTENSION_NAME).map(String::as_str);
        let (row, form) = match (fixed_shape_tensor(&field)?, extension) {
            (None, None) if sizes.is_empty() => (sizes, Form::Plain),
            (None, None) => (sizes, Form::Nested),
            (Some(tensor), _) => {
                let elements = tensor
                    .shape
                    .iter()
                    .try_fold(1usize, |n, &extent| n.checked_mul(extent));
                if elements.is_none_or(|n| sizes != [n]) {
                    return Err(refuse(
                        "its storage is not one fixed-size list of its tensors' elements".into(),
                    ));
                }
                if let Some(permutation) = &tensor.permutation
                    && permutation.iter().enumerate().any(|(k, &p)| k != p)
                {
                    return Err(refuse(format!(
                        "its tensors are permuted ({permutation:?}), which needs a transposing \
                         copy (none is made here): ask for them unpermuted"
                    )));
                }
                let metadata = field
                    .metadata()
                    .get(EXTENSION_METADATA)
                    .cloned()
                    .unwrap_or_default();
                (tensor.shape, Form::Tensor(metadata))
            }
            (None, Some(other)) => {
                return Err(refuse(format!(
                    "the extension type {other} is not one given here (a column, fixed-size \
                     lists or {FIXED_SHAPE_TENSOR})"
                )));
            }
        };
        if !same_type(element, leaf) {
            return Err(refuse(format!(
                "its elements are {element}, this array's {leaf}, and nothing is cast here: \
                 cast the array first"
            )));
        }
        // A column of numbers is a 1-D array's alone: flattening an N-d one would hand its
        // rows over as if they were one dimension, which pyarrow refuses of numpy too.
        if matches!(form, Form::Plain) && shape.len() > 1 {
            return Err(refuse(format!(
                "a column is 1-D, and this array has {} dimensions: ask for fixed-size lists or                  {FIXED_SHAPE_TENSOR}, or reshape(-1) it first",
                shape.len()
            )));
        }
        // The row is the array's last dimensions, or one list of all their elements.
        let n = shape.len();
        let suffix = (row.len() <= n && shape[n - row.len()..] == row[..]).then_some(row.len());
        let flat = || match row[..] {
            [elements] => (1..=n).find(|&k| {
                shape[n - k..]
                    .iter()
                    .try_fold(1usize, |m, &extent| m.checked_mul(extent))
                    == Some(elements)
            }),
            _ => None,
        };
        let Some(covered) = suffix.or_else(flat) else {
            return Err(refuse(format!(
                "a row of shape {row:?} is neither the array's last dimensions nor all the \
                 elements of them"
            )));
        };
        Ok(Row {
            shape: row,
            dims: covered,
            form,
        })
    }
}

fn fixed_size_list(data_type: DataType, len: usize, child: ArrayData) -> Result<ArrayData> {
    ArrayData::builder(data_type)
        .len(len)
        .add_child_data(child)
        .build()
        .map_err(arrow_error)
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
