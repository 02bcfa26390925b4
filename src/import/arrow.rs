//! The Arrow PyCapsule interface in: `__arrow_c_array__` and `__arrow_c_device_array__` (a
//! schema and an array capsule), `__arrow_c_stream__` and `__arrow_c_device_stream__` (a stream
//! capsule) and raw stream capsules of either kind. One array of plain numbers (the common case)
//! is read from the C structs through arrow-rs's accessors; anything else through arrow-rs's
//! import of the C data interface (`ArrayData`: children, offsets, validity), and becomes what
//! `arrow_values` says.
//!
//! The device variants are read for memory of the CPU (their `ARROW_DEVICE_CPU`); memory of
//! any other device is refused before anything is read.

use std::ffi::{CStr, c_char, c_int, c_void};

use arrow_array::ffi::{FFI_ArrowArray, FFI_ArrowSchema, from_ffi_and_data_type};
use arrow_array::ffi_stream::FFI_ArrowArrayStream;
use arrow_schema::DataType;
use dlpack_core::abi::DLDevice;
use dlpack_core::available;
use dlpack_core::dtype::DType;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyTuple};

use super::arrow_check::{self, Array, Schema};
use super::arrow_values::{element_type, from_chunks, host_values};
use crate::error::{Error, Result};
use crate::ffi::arrow::{
    ARROW_DEVICE_CPU, FFI_ArrowDeviceArray, FFI_ArrowDeviceArrayStream, Method, SCHEMA, StreamKind,
};
use crate::tensor::{Owner, Tensor};
use dlpack_core::layout::Layout;

/// The stream method whose capsule `obj` is, if it is an Arrow stream capsule (plain or
/// device).
pub fn stream_capsule_kind(obj: &Bound<'_, PyAny>) -> Option<Method> {
    let capsule = obj.cast::<PyCapsule>().ok()?;
    [Method::Stream, Method::DeviceStream]
        .into_iter()
        .find(|method| capsule.is_valid_checked(Some(method.capsule())))
}

/// Import through `method`: an object's bound Arrow method `arrow`.
pub fn import_method(method: &Bound<'_, PyAny>, arrow: Method) -> Result<Tensor> {
    let returned = method.call0()?;
    match arrow {
        Method::Array | Method::DeviceArray => array_pair(&returned, arrow),
        Method::Stream | Method::DeviceStream => import_stream(&returned, arrow),
    }
}

/// The (schema, array) capsules an array method returned.
fn array_pair(pair: &Bound<'_, PyAny>, method: Method) -> Result<Tensor> {
    let not_a_pair = || {
        Error::type_(format!(
            "{}() must return a (schema, array) tuple of PyCapsules",
            method.name()
        ))
    };
    let pair = pair.cast::<PyTuple>().map_err(|_| not_a_pair())?;
    if pair.len() != 2 {
        return Err(not_a_pair());
    }
    let schema = take_schema(&pair.get_item(0)?)?;
    let array = if method.is_device() {
        let raw = take(&pair.get_item(1)?, method.capsule(), "device array")?;
        // SAFETY: a capsule named "arrow_device_array" holds an `ArrowDeviceArray` (the
        // interface's rule), moved out here so that only we release it.
        let array = unsafe { FFI_ArrowDeviceArray::from_raw(raw.cast()) };
        on_cpu(array)?
    } else {
        let raw = take(&pair.get_item(1)?, method.capsule(), "array")?;
        // SAFETY: a capsule named "arrow_array" holds an `ArrowArray` (the interface's rule),
        // moved out here so that only we release it.
        unsafe { FFI_ArrowArray::from_raw(raw.cast()) }
    };
    let schema = arrow_check::schema(&schema)?;
    let array = arrow_check::array(&schema, array)?;
    from_c(&schema, vec![array])
}

/// The array of a device array of CPU memory; memory of any other device is refused (and
/// released) before it is read.
fn on_cpu(array: FFI_ArrowDeviceArray) -> Result<FFI_ArrowArray> {
    if array.device_type == ARROW_DEVICE_CPU {
        return Ok(array.array);
    }
    Err(not_cpu(array.device_type, Some(array.device_id)))
}

#[cold]
fn not_cpu(device_type: i32, device_id: Option<i64>) -> Error {
    let device = match device_id.map(i32::try_from) {
        Some(Ok(device_id)) => DLDevice {
            device_type,
            device_id,
        }
        .name(),
        _ => format!("device type {device_type}"),
    };
    Error::buffer(format!(
        "this Arrow data is in memory of {device} (Arrow device type {device_type}), and the \
         Arrow device interface is read here for CPU memory only: pass the array through DLPack \
         (__dlpack__) or the CUDA array interface instead"
    ))
}

/// Import a stream capsule of `method`'s kind: its arrays read, then the stream released; a
/// `TypeError` for anything but a capsule of that kind.
pub fn import_stream(capsule: &Bound<'_, PyAny>, method: Method) -> Result<Tensor> {
    let (schema, arrays) = if method.is_device() {
        let raw = take(capsule, method.capsule(), "device stream")?;
        // SAFETY: a capsule named "arrow_device_array_stream" holds an
        // `ArrowDeviceArrayStream`, moved out here so that only we release it (on drop, once
        // its arrays are read).
        let mut stream = unsafe { FFI_ArrowDeviceArrayStream::from_raw(raw.cast()) };
        // The stream's device, then each array's (whatever the stream says): memory of another
        // device is refused and released.
        if stream.device_type != ARROW_DEVICE_CPU {
            return Err(not_cpu(stream.device_type, None));
        }
        read_stream(&mut stream, on_cpu)?
    } else {
        let raw = take(capsule, method.capsule(), "stream")?;
        // SAFETY: a capsule named "arrow_array_stream" holds an `ArrowArrayStream`, moved out
        // here so that only we release it (on drop, once its arrays are read).
        let mut stream = unsafe { FFI_ArrowArrayStream::from_raw(raw.cast()) };
        read_stream(&mut stream, Ok)?
    };
    from_c(&schema, arrays)
}

/// A stream of either kind read to its end: its schema and every array (each made a host
/// array by `host`), checked as they come. The arrays stand alone (the interface's rule), so
/// the stream can be released after. A failed call is an error carrying the producer's
/// message; a stream whose arrays pass the memory this process can still have is a
/// `MemoryError`, before the producer (which holds them all) runs out of it.
fn read_stream<K: StreamKind>(
    stream: &mut K,
    host: impl Fn(K::Array) -> Result<FFI_ArrowArray>,
) -> Result<(Schema, Vec<Array>)> {
    let (Some(get_schema), Some(get_next), true) =
        (stream.get_schema(), stream.get_next(), stream.is_live())
    else {
        return Err(Error::value(
            "the Arrow stream is released, or lacks its get_schema or get_next callback",
        ));
    };
    let get_last_error = stream.get_last_error();
    let stream: *mut K = stream;
    let last_error = || {
        // SAFETY: the stream's own get_last_error, on that stream, live while this function
        // runs (its release checked set, the caller drops it after), one call at a time, right
        // after a failed call, as the interface allows.
        get_last_error.map(|get| unsafe { get(stream) })
    };
    let mut schema = FFI_ArrowSchema::empty();
    // SAFETY: the stream's own get_schema, on that live stream, one call at a time; `schema` is
    // a place for one schema, released when dropped.
    let code = unsafe { get_schema(stream, &raw mut schema) };
    if code != 0 {
        return Err(stream_error(last_error(), "schema", code));
    }
    let schema = arrow_check::schema(&schema)?;
    let mut arrays = Vec::new();
    let mut limit = StreamLimit::default();
    loop {
        let mut array = K::end();
        // SAFETY: the stream's own get_next, on that live stream, one call at a time; `array` is
        // a place for one array of the stream's kind.
        let code = unsafe { get_next(stream, &raw mut array) };
        if code != 0 {
            return Err(stream_error(last_error(), "next array", code));
        }
        if K::is_end(&array) {
            return Ok((schema, arrays)); // the end of the stream
        }
        let array = arrow_check::array(&schema, host(array)?)?;
        limit.add(arrays.len() + 1, &array)?;
        arrays.push(array);
    }
}

/// The memory a stream's arrays hold, checked against what this process can still have each
/// time it has grown by a step (reading the limits costs tens of microseconds).
#[derive(Default)]
struct StreamLimit {
    bytes: u64,
    next_check: u64,
}

impl StreamLimit {
    fn add(&mut self, arrays: usize, array: &Array) -> Result<()> {
        // Saturating: a producer's spans can sum past any memory, which is then refused.
        let this = array
            .span_bytes()
            .saturating_add(size_of::<FFI_ArrowArray>() as u64);
        self.bytes = self.bytes.saturating_add(this);
        if self.bytes < self.next_check.max(available::CHECK_FROM) {
            return Ok(());
        }
        self.next_check = self
            .bytes
            .saturating_add((self.bytes / 8).max(available::CHECK_FROM));
        match available::available() {
            Some(free) if self.bytes > free.bytes => {
                Err(Error::Core(dlpack_core::error::Error::memory(format!(
                    "the Arrow stream's {arrays} arrays read so far hold {} ({} bytes), more \
                     than the {} this process can still have ({}): it is read whole (its \
                     chunks joined in one copy), so pass it in parts",
                    available::human(self.bytes),
                    self.bytes,
                    available::human(free.bytes),
                    free.figure_from
                ))))
            }
            _ => Ok(()),
        }
    }
}

/// A stream callback's failure, with the producer's message when it gives one.
#[cold]
fn stream_error(message: Option<*const c_char>, what: &str, code: c_int) -> Error {
    let message = message.filter(|text| !text.is_null()).map(|text| {
        // SAFETY: a non-null result of `get_last_error` is a C string the producer keeps until
        // the stream's next call; it is copied out before one.
        let text = unsafe { CStr::from_ptr(text) };
        text.to_string_lossy().into_owned()
    });
    unreadable(format_args!(
        "the stream failed to give its {what} (error code {code}){}",
        message.map_or_else(String::new, |m| format!(": {m}"))
    ))
}

/// The arrays of one schema (one from `__arrow_c_array__`, a stream's chunks), each checked
/// against it: one array of plain numbers in place from the C structs alone, anything else
/// through arrow-rs's import.
fn from_c(schema: &Schema, arrays: Vec<Array>) -> Result<Tensor> {
    let arrays = match <[Array; 1]>::try_from(arrays) {
        Ok([array]) => match plain_numbers(schema, array.get()) {
            Some(dtype) => return plain_in_place(dtype, array),
            None => vec![array],
        },
        Err(arrays) => arrays,
    };
    let field = schema.field();
    let chunks = arrays
        .into_iter()
        // SAFETY: each array passed `arrow_check::array` against this field's type: its
        // lengths, offsets, buffers and children are what the type needs; the bytes each buffer
        // holds are the producer's word.
        .map(|array| unsafe {
            from_ffi_and_data_type(array.into_inner(), field.data_type().clone())
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(arrow_error)?;
    from_chunks(&field, chunks)
}

/// The element type of an array of numbers with no nulls, children, dictionary or extension
/// type: the common case, which needs no `ArrayData` (arrow-rs's import builds the type tree
/// and the buffers). `None` for anything else.
fn plain_numbers(schema: &Schema, array: &FFI_ArrowArray) -> Option<DType> {
    if !schema.metadata().is_empty() {
        return None;
    }
    let data_type = schema.data_type();
    // A validity bitmap with nulls, or an unknown count, is left to `values`, which counts
    // them in the array's range.
    if array.null_count_opt() != Some(0) && !array.buffer(0).is_null() {
        return None;
    }
    element_type(data_type).filter(|_| *data_type != DataType::Boolean)
}

/// One array of plain numbers served where it is: its values from the array's offset.
fn plain_in_place(dtype: DType, array: Array) -> Result<Tensor> {
    let array = array.into_inner();
    let itemsize = dtype.itemsize();
    // In range: checked with the array (`arrow_check`), and a NULL buffer only when empty;
    // checked again here, as the numbers are the producer's.
    let len = i64::try_from(array.len()).map_err(|_| unreadable("its length passes 2**63"))?;
    let first = array
        .offset()
        .checked_mul(itemsize)
        .ok_or_else(|| unreadable("its offset passes the address space"))?;
    let layout = Layout::c_order(&[len], itemsize)?;
    let data = array.buffer(1).wrapping_add(first).cast_mut().cast();
    let storage = host_values(data, dtype);
    // SAFETY: the producer's word, which nothing can check (the C data interface gives no
    // buffer sizes): per the Arrow C data interface, the values buffer holds the array's
    // `offset + length` elements in host memory until the array, held by the owner, is
    // released (a range of addresses that exists: `arrow_check`); read-only here.
    Ok(unsafe { Tensor::new(storage, layout, Owner::arrow_c(array)) })
}

/// The pointer a capsule of `name` holds; a `TypeError` for anything else.
fn take(obj: &Bound<'_, PyAny>, name: &CStr, what: &str) -> Result<*mut c_void> {
    let wrong = || {
        Error::type_(format!(
            "an Arrow {what} must come in a PyCapsule named {name:?}"
        ))
    };
    let capsule = obj.cast::<PyCapsule>().map_err(|_| wrong())?;
    let pointer = capsule.pointer_checked(Some(name)).map_err(|_| wrong())?;
    Ok(pointer.as_ptr())
}

fn take_schema(obj: &Bound<'_, PyAny>) -> Result<FFI_ArrowSchema> {
    let raw = take(obj, SCHEMA, "schema")?;
    // SAFETY: a capsule named "arrow_schema" holds an `ArrowSchema`, moved out here.
    Ok(unsafe { FFI_ArrowSchema::from_raw(raw.cast()) })
}

#[cold]
fn arrow_error(err: arrow_schema::ArrowError) -> Error {
    unreadable(err)
}

/// Arrow data we were handed but can't read, and why.
#[cold]
fn unreadable(why: impl std::fmt::Display) -> Error {
    Error::value(format!("the Arrow data can't be read: {why}"))
}
