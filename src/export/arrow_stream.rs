//! One Arrow array as an Arrow C stream, for `__arrow_c_stream__` (`ArrowArrayStream`) and
//! `__arrow_c_device_stream__` (`ArrowDeviceArrayStream`, the C Device interface's).
//!
//! arrow-rs exports streams only of record batches (a struct per batch); a column is one array
//! of its own type, so the stream's callbacks are ours, over arrow-rs's structs: `get_schema`
//! writes a fresh schema of the field each call, `get_next` hands out the array once and then a
//! released array (the end of the stream), `get_last_error` is NULL or the message of the last
//! failure, and `release` frees it all once and marks the stream released.
//!
//! The callbacks run on whatever thread the consumer calls them from, without the interpreter
//! (one call at a time, as the interface requires of consumers), and never unwind into C: a
//! panic is caught and reported as an error code. What the array holds is released where its
//! own release runs (see `export::arrow`).

use std::ffi::{CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;

use arrow_array::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
use arrow_array::ffi_stream::FFI_ArrowArrayStream;
use arrow_schema::Field;

use crate::ffi::arrow::{FFI_ArrowDeviceArray, FFI_ArrowDeviceArrayStream, StreamKind};

/// `errno` values the interface returns; the same numbers on every platform CPython runs on
/// (POSIX systems and the Windows C runtime).
const EIO: c_int = 5;
const EINVAL: c_int = 22;

/// What the stream owns (its private data), until it is released.
struct State<K: StreamKind> {
    field: Field,
    /// The one array, until `get_next` hands it out.
    array: Option<K::Array>,
    /// What `get_last_error` returns.
    last_error: Option<CString>,
}

fn boxed<K: StreamKind>(field: Field, array: K::Array) -> *mut c_void {
    Box::into_raw(Box::new(State::<K> {
        field,
        array: Some(array),
        last_error: None,
    }))
    .cast()
}

/// A stream of `array` alone, whose type and metadata are `field`'s.
pub fn one_array(field: Field, array: FFI_ArrowArray) -> FFI_ArrowArrayStream {
    let state = boxed::<FFI_ArrowArrayStream>(field, array);
    // SAFETY: the callbacks implement the interface over the `State` boxed above, which the
    // private data owns until `release` frees it (once: it marks the stream released, all
    // callbacks and the private data NULL).
    unsafe {
        FFI_ArrowArrayStream::new_unchecked(
            Some(get_schema::<FFI_ArrowArrayStream>),
            Some(get_next::<FFI_ArrowArrayStream>),
            Some(get_last_error::<FFI_ArrowArrayStream>),
            Some(release::<FFI_ArrowArrayStream>),
            state,
        )
    }
}

/// A device stream of the device array `array` alone (of its device type), whose type and
/// metadata are `field`'s. As `one_array`'s, its callbacks own the boxed state.
pub fn one_device_array(field: Field, array: FFI_ArrowDeviceArray) -> FFI_ArrowDeviceArrayStream {
    FFI_ArrowDeviceArrayStream {
        device_type: array.device_type,
        private_data: boxed::<FFI_ArrowDeviceArrayStream>(field, array),
        get_schema: Some(get_schema::<FFI_ArrowDeviceArrayStream>),
        get_next: Some(get_next::<FFI_ArrowDeviceArrayStream>),
        get_last_error: Some(get_last_error::<FFI_ArrowDeviceArrayStream>),
        release: Some(release::<FFI_ArrowDeviceArrayStream>),
    }
}

/// The state of `stream`, if it is a live stream of ours.
///
/// # Safety
/// `stream` is NULL or points to a stream of kind `K` made by `one_array` or
/// `one_device_array` (moved or not, released or not) that no other call uses meanwhile (the
/// interface has consumers call one callback at a time).
unsafe fn state<'a, K: StreamKind>(stream: *mut K) -> Option<&'a mut State<K>> {
    // SAFETY: NULL or a stream, per the contract.
    let stream = unsafe { stream.as_ref() }?;
    // SAFETY: a stream of ours holds its `State` until it is released, and NULL after; no
    // other reference to it exists during this call (the contract).
    unsafe { stream.private_data().cast::<State<K>>().as_mut() }
}

/// Run a callback's body on the state of `stream`: 0 when it succeeds; `EINVAL` when it fails
/// or the stream is not live, `EIO` when it panics, either kept for `get_last_error` (where
/// there is a state to keep it in).
///
/// # Safety
/// As `state`'s.
unsafe fn run<K: StreamKind>(
    stream: *mut K,
    body: impl FnOnce(&mut State<K>) -> std::result::Result<(), String>,
) -> c_int {
    // SAFETY: `stream` is NULL or a stream of ours that no other call uses meanwhile (this
    // function's contract, which is `state`'s).
    let Some(state) = (unsafe { state(stream) }) else {
        return EINVAL;
    };
    let (code, message) = match catch_unwind(AssertUnwindSafe(|| body(&mut *state))) {
        Ok(Ok(())) => return 0,
        Ok(Err(message)) => (EINVAL, message),
        Err(payload) => {
            // Its drop could panic in turn: leaked instead (a panic here is a bug already).
            std::mem::forget(payload);
            (
                EIO,
                "the Arrow stream panicked (a bug in dlpack-adapter)".to_owned(),
            )
        }
    };
    state.last_error = CString::new(message.replace('\0', " ")).ok();
    code
}

/// `get_schema`: a fresh schema of the field, the consumer's to release.
///
/// # Safety
/// As the interface calls it: with a stream of ours and an `ArrowSchema` to write (its old
/// contents are not read).
unsafe extern "C" fn get_schema<K: StreamKind>(stream: *mut K, out: *mut FFI_ArrowSchema) -> c_int {
    let body = |state: &mut State<K>| {
        if out.is_null() {
            return Err("get_schema was given no ArrowSchema to write".to_owned());
        }
        let schema = FFI_ArrowSchema::try_from(&state.field)
            .map_err(|e| format!("the Arrow schema can't be written: {e}"))?;
        // SAFETY: `out` is the consumer's `ArrowSchema`, which we fill without reading or
        // releasing what it held (the interface's rule for outputs).
        unsafe { out.write(schema) };
        Ok(())
    };
    // SAFETY: the interface calls a stream's callbacks with that stream, one call at a time.
    unsafe { run(stream, body) }
}

/// `get_next`: the array, the first time; after it a released array (the end of the stream).
///
/// # Safety
/// As the interface calls it: with a stream of ours and an array of its kind to write (its old
/// contents are not read).
unsafe extern "C" fn get_next<K: StreamKind>(stream: *mut K, out: *mut K::Array) -> c_int {
    let body = |state: &mut State<K>| {
        if out.is_null() {
            return Err("get_next was given no ArrowArray to write".to_owned());
        }
        let array = state.array.take().unwrap_or_else(K::end);
        // SAFETY: `out` is the consumer's array, which we fill without reading or releasing
        // what it held (the interface's rule for outputs); the array is now the consumer's to
        // release.
        unsafe { out.write(array) };
        Ok(())
    };
    // SAFETY: the interface calls a stream's callbacks with that stream, one call at a time.
    unsafe { run(stream, body) }
}

/// `get_last_error`: the message of the last failed call, or NULL; valid until the next call on
/// the stream.
///
/// # Safety
/// As the interface calls it: with a stream of ours.
unsafe extern "C" fn get_last_error<K: StreamKind>(stream: *mut K) -> *const c_char {
    // SAFETY: the interface calls a stream's callbacks with that stream, one call at a time.
    match unsafe { state(stream) } {
        Some(State {
            last_error: Some(message),
            ..
        }) => message.as_ptr(),
        _ => ptr::null(),
    }
}

/// `release`: frees the state (the array, if no consumer took it, and with it what keeps the
/// memory alive) and marks the stream released; nothing for a stream released already.
///
/// # Safety
/// As the interface calls it: with a stream of ours, or NULL.
unsafe extern "C" fn release<K: StreamKind>(stream: *mut K) {
    // SAFETY: NULL or a stream of ours, per the contract, used by no one else during the call.
    let Some(stream) = (unsafe { stream.as_mut() }) else {
        return;
    };
    if !stream.is_live() {
        return;
    }
    let state = stream.private_data().cast::<State<K>>();
    let released = stream.released();
    // SAFETY: the stream is overwritten as released (all NULL) without dropping what it held:
    // its `Drop` would call this release again, and its state is freed below, once.
    unsafe { ptr::write(stream, released) };
    if state.is_null() {
        return;
    }
    // SAFETY: the `State` boxed by `boxed`, which the stream no longer points to.
    let state = unsafe { Box::from_raw(state) };
    // Releasing the array lets go of the source object (attaching to Python where it can).
    if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(state))) {
        std::mem::forget(payload);
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::Array;
    use arrow_array::ffi_stream::ArrayStreamReader;
    use arrow_array::{ArrayReader, Float64Array};
    use arrow_schema::DataType;

    use super::*;

    fn stream_of(values: &[f64]) -> FFI_ArrowArrayStream {
        let data = Float64Array::from(values.to_vec()).into_data();
        let field = Field::new("", DataType::Float64, false);
        one_array(field, FFI_ArrowArray::new(&data))
    }

    #[test]
    fn arrow_rs_reads_one_array_then_the_end() {
        let reader = ArrayStreamReader::try_new(stream_of(&[1.0, 2.0])).unwrap();
        assert_eq!(reader.field().data_type(), &DataType::Float64);
        let chunks: Vec<_> = reader.map(Result::unwrap).collect();
        assert_eq!(chunks.len(), 1);
        let values = chunks[0].as_any().downcast_ref::<Float64Array>().unwrap();
        assert_eq!(values.values(), &[1.0, 2.0]);
    }

    #[test]
    fn callbacks_by_hand_schema_each_time_end_and_release_once() {
        let mut stream = stream_of(&[3.0]);
        let raw: *mut FFI_ArrowArrayStream = &mut stream;
        let get_schema = stream.get_schema().unwrap();
        let get_next = stream.get_next().unwrap();
        let get_last_error = stream.get_last_error().unwrap();
        let release_stream = stream.release().unwrap();
        for _ in 0..2 {
            let mut schema = FFI_ArrowSchema::empty();
            // SAFETY: our stream and a schema to write.
            assert_eq!(unsafe { get_schema(raw, &mut schema) }, 0);
            assert_eq!(
                Field::try_from(&schema).unwrap().data_type(),
                &DataType::Float64
            );
        }
        let mut first = FFI_ArrowArray::empty();
        // SAFETY: our stream and an array to write.
        assert_eq!(unsafe { get_next(raw, &mut first) }, 0);
        assert_eq!(first.len(), 1);
        let mut end = FFI_ArrowArray::empty();
        // SAFETY: `raw` is our live stream, one call at a time, and `end` an array to write.
        assert_eq!(unsafe { get_next(raw, &mut end) }, 0);
        assert!(end.is_released());
        // SAFETY: `raw` is our live stream, one call at a time; a NULL output is refused.
        assert_eq!(unsafe { get_next(raw, ptr::null_mut()) }, EINVAL);
        // SAFETY: `raw` is our live stream, one call at a time.
        let message = unsafe { get_last_error(raw) };
        assert!(!message.is_null());
        // SAFETY: a message of ours, valid until the next call.
        let message = unsafe { std::ffi::CStr::from_ptr(message) };
        assert!(message.to_str().unwrap().contains("no ArrowArray"));
        // SAFETY: our stream, released here and again: the second is nothing.
        unsafe { release_stream(raw) };
        assert!(stream.release().is_none() && stream.private_data().is_null());
        // SAFETY: `raw` still points at `stream`, ours, now released: release returns at once.
        unsafe { release_stream(raw) };
        // The array handed out outlives the stream.
        drop(stream);
        assert_eq!(first.len(), 1);
    }
}
