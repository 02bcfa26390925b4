//! What both directions of the Arrow PyCapsule interface share: its four methods and the names
//! of their capsules, the two kinds of C stream (`StreamKind`), and the Arrow C Device data
//! interface's two structs, `ArrowDeviceArray` and `ArrowDeviceArrayStream`. arrow-rs binds the
//! C data and stream interfaces but not these (as of arrow-rs 60), so they are declared here as
//! `arrow/c/abi.h` has them, over arrow-rs's own `FFI_ArrowArray` and `FFI_ArrowSchema`; their
//! layout is checked against the header's below. Device types are DLPack's device type codes (the interface keeps them equal).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr;

use arrow_array::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
use arrow_array::ffi_stream::FFI_ArrowArrayStream;

/// The capsule of an `ArrowSchema`.
pub const SCHEMA: &CStr = c"arrow_schema";

/// The Arrow PyCapsule interface's methods, by which an object gives its Arrow data; a
/// `DLPackObject`'s entry for each is told apart by its number (`as u8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Method {
    /// `__arrow_c_array__`: (schema, array) capsules.
    Array,
    /// `__arrow_c_stream__`: a stream capsule.
    Stream,
    /// `__arrow_c_device_array__`: (schema, device array) capsules.
    DeviceArray,
    /// `__arrow_c_device_stream__`: a device stream capsule.
    DeviceStream,
}

impl Method {
    /// In the order a consumer asks for them: arrays before streams, each device variant
    /// first (as pyarrow reads them: it says where the memory is).
    pub const ALL: [Method; 4] = [
        Method::DeviceArray,
        Method::Array,
        Method::DeviceStream,
        Method::Stream,
    ];

    /// The method numbered `number` (`as u8`); `None` for a number no method has.
    pub const fn from_u8(number: u8) -> Option<Method> {
        match number {
            0 => Some(Method::Array),
            1 => Some(Method::Stream),
            2 => Some(Method::DeviceArray),
            3 => Some(Method::DeviceStream),
            _ => None,
        }
    }

    /// The method numbered `NUMBER`, found at compile time: a number no method has doesn't
    /// compile.
    pub const fn numbered<const NUMBER: u8>() -> Method {
        match Method::from_u8(NUMBER) {
            Some(method) => method,
            None => panic!("no Arrow method has this number"),
        }
    }

    /// Its name, a C string (for a method definition).
    pub const fn c_name(self) -> &'static CStr {
        match self {
            Method::Array => c"__arrow_c_array__",
            Method::Stream => c"__arrow_c_stream__",
            Method::DeviceArray => c"__arrow_c_device_array__",
            Method::DeviceStream => c"__arrow_c_device_stream__",
        }
    }

    pub const fn name(self) -> &'static str {
        match self.c_name().to_str() {
            Ok(name) => name,
            Err(_) => panic!("an ASCII name"),
        }
    }

    /// The name of the capsule of its array or stream.
    pub fn capsule(self) -> &'static CStr {
        match self {
            Method::Array => c"arrow_array",
            Method::Stream => c"arrow_array_stream",
            Method::DeviceArray => c"arrow_device_array",
            Method::DeviceStream => c"arrow_device_array_stream",
        }
    }

    /// One of the C Device interface's: its `**kwargs` are taken when None.
    pub fn is_device(self) -> bool {
        matches!(self, Method::DeviceArray | Method::DeviceStream)
    }
}

/// `ARROW_DEVICE_CPU`: memory the CPU reads directly, as with the plain C data interface.
pub const ARROW_DEVICE_CPU: i32 = 1;

/// An `ArrowDeviceArray`: an `ArrowArray` whose buffers are memory of one device, and the event
/// (for CUDA, a `CUevent*`) a consumer waits on before reading it. The array's own `release`
/// releases everything, event included: dropping this drops (releases) the array.
#[repr(C)]
#[derive(Debug)]
#[allow(non_camel_case_types, reason = "named as arrow-rs names its C structs")]
pub struct FFI_ArrowDeviceArray {
    pub array: FFI_ArrowArray,
    pub device_id: i64,
    pub device_type: i32,
    pub sync_event: *mut c_void,
    pub reserved: [i64; 3],
}

// SAFETY: the interface lets whichever thread holds an array release it; `sync_event` is only
// carried, never used here.
unsafe impl Send for FFI_ArrowDeviceArray {}

impl FFI_ArrowDeviceArray {
    /// A CPU device array of `array` (device id -1: the CPU has no number; no event).
    pub fn cpu(array: FFI_ArrowArray) -> Self {
        Self {
            array,
            device_id: -1,
            device_type: ARROW_DEVICE_CPU,
            sync_event: ptr::null_mut(),
            reserved: [0; 3],
        }
    }

    /// A released device array: what `get_next` writes at the end of a stream.
    pub fn empty() -> Self {
        Self {
            array: FFI_ArrowArray::empty(),
            device_id: 0,
            device_type: 0,
            sync_event: ptr::null_mut(),
            reserved: [0; 3],
        }
    }

    /// Move the device array at `raw` out, leaving it released (its array's `release` NULL),
    /// as the interface moves structs.
    ///
    /// # Safety
    /// `raw` points to a valid `ArrowDeviceArray`, live or released, writable.
    pub unsafe fn from_raw(raw: *mut Self) -> Self {
        // SAFETY: a valid device array, per the contract, which we may read and write.
        let raw = unsafe { &mut *raw };
        let (device_id, device_type, sync_event) = (raw.device_id, raw.device_type, raw.sync_event);
        // SAFETY: its array is a valid `ArrowArray`, which arrow-rs moves out and marks released.
        let array = unsafe { FFI_ArrowArray::from_raw(&raw mut raw.array) };
        Self {
            array,
            device_id,
            device_type,
            sync_event,
            reserved: [0; 3],
        }
    }
}

/// An `ArrowDeviceArrayStream`: an `ArrowArrayStream` whose arrays are `ArrowDeviceArray`s of
/// one device type. Dropping a live stream releases it.
#[repr(C)]
#[derive(Debug)]
#[allow(non_camel_case_types, reason = "named as arrow-rs names its C structs")]
pub struct FFI_ArrowDeviceArrayStream {
    pub device_type: i32,
    pub get_schema: Option<GetSchema<Self>>,
    pub get_next: Option<GetNext<Self, FFI_ArrowDeviceArray>>,
    pub get_last_error: Option<GetLastError<Self>>,
    pub release: Option<unsafe extern "C" fn(*mut Self)>,
    pub private_data: *mut c_void,
}

// SAFETY: the interface lets whichever thread holds a stream use and release it (one call at
// a time).
unsafe impl Send for FFI_ArrowDeviceArrayStream {}

impl FFI_ArrowDeviceArrayStream {
    /// A released stream (all NULL), of `device_type`.
    pub fn empty(device_type: i32) -> Self {
        Self {
            device_type,
            get_schema: None,
            get_next: None,
            get_last_error: None,
            release: None,
            private_data: ptr::null_mut(),
        }
    }

    /// Move the stream at `raw` out, leaving it released.
    ///
    /// # Safety
    /// `raw` points to a valid `ArrowDeviceArrayStream`, live or released, writable.
    pub unsafe fn from_raw(raw: *mut Self) -> Self {
        // SAFETY: a valid stream, per the contract: read, then marked released (its `release`
        // NULL, below), so that only the copy releases it.
        let stream = unsafe { ptr::read(raw) };
        // SAFETY: `raw` points to a valid stream, writable (this function's contract): its
        // `release` field may be set.
        unsafe { (*raw).release = None };
        stream
    }
}

impl Drop for FFI_ArrowDeviceArrayStream {
    fn drop(&mut self) {
        if let Some(release) = self.release {
            // SAFETY: a live stream's own release, called once: it marks the stream released.
            unsafe { release(self) };
        }
    }
}

/// A stream callback that writes a schema, as `get_schema`.
pub type GetSchema<S> = unsafe extern "C" fn(*mut S, *mut FFI_ArrowSchema) -> c_int;
/// A stream callback that writes an array of the stream's kind, as `get_next`.
pub type GetNext<S, A> = unsafe extern "C" fn(*mut S, *mut A) -> c_int;
/// A stream callback that returns its last error's message or NULL, as `get_last_error`.
pub type GetLastError<S> = unsafe extern "C" fn(*mut S) -> *const c_char;

/// The two kinds of C stream, alike but for the arrays they hand out: the C stream interface's
/// `ArrowArrayStream` (of `ArrowArray`s) and the C Device interface's `ArrowDeviceArrayStream`
/// (of `ArrowDeviceArray`s). Read by the importer, made by the exporter.
pub trait StreamKind: Sized {
    type Array;
    /// A released array: what `get_next` writes at the end of the stream.
    fn end() -> Self::Array;
    fn is_end(array: &Self::Array) -> bool;
    fn get_schema(&self) -> Option<GetSchema<Self>>;
    fn get_next(&self) -> Option<GetNext<Self, Self::Array>>;
    fn get_last_error(&self) -> Option<GetLastError<Self>>;
    fn private_data(&self) -> *mut c_void;
    fn is_live(&self) -> bool;
    /// This stream marked released (all NULL).
    fn released(&self) -> Self;
}

impl StreamKind for FFI_ArrowArrayStream {
    type Array = FFI_ArrowArray;
    fn end() -> FFI_ArrowArray {
        FFI_ArrowArray::empty()
    }
    fn is_end(array: &FFI_ArrowArray) -> bool {
        array.is_released()
    }
    fn get_schema(&self) -> Option<GetSchema<Self>> {
        FFI_ArrowArrayStream::get_schema(self)
    }
    fn get_next(&self) -> Option<GetNext<Self, FFI_ArrowArray>> {
        FFI_ArrowArrayStream::get_next(self)
    }
    fn get_last_error(&self) -> Option<GetLastError<Self>> {
        FFI_ArrowArrayStream::get_last_error(self)
    }
    fn private_data(&self) -> *mut c_void {
        FFI_ArrowArrayStream::private_data(self)
    }
    fn is_live(&self) -> bool {
        self.release().is_some()
    }
    fn released(&self) -> Self {
        FFI_ArrowArrayStream::empty()
    }
}

impl StreamKind for FFI_ArrowDeviceArrayStream {
    type Array = FFI_ArrowDeviceArray;
    fn end() -> FFI_ArrowDeviceArray {
        FFI_ArrowDeviceArray::empty()
    }
    fn is_end(array: &FFI_ArrowDeviceArray) -> bool {
        array.array.is_released()
    }
    fn get_schema(&self) -> Option<GetSchema<Self>> {
        self.get_schema
    }
    fn get_next(&self) -> Option<GetNext<Self, FFI_ArrowDeviceArray>> {
        self.get_next
    }
    fn get_last_error(&self) -> Option<GetLastError<Self>> {
        self.get_last_error
    }
    fn private_data(&self) -> *mut c_void {
        self.private_data
    }
    fn is_live(&self) -> bool {
        self.release.is_some()
    }
    fn released(&self) -> Self {
        FFI_ArrowDeviceArrayStream::empty(self.device_type)
    }
}

// The header's layout (64-bit platforms): `ArrowArray` is 80 bytes.
#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<FFI_ArrowArray>() == 80);
    assert!(offset_of!(FFI_ArrowDeviceArray, device_id) == 80);
    assert!(offset_of!(FFI_ArrowDeviceArray, device_type) == 88);
    assert!(offset_of!(FFI_ArrowDeviceArray, sync_event) == 96);
    assert!(offset_of!(FFI_ArrowDeviceArray, reserved) == 104);
    assert!(size_of::<FFI_ArrowDeviceArray>() == 128);
    assert!(offset_of!(FFI_ArrowDeviceArrayStream, get_schema) == 8);
    assert!(offset_of!(FFI_ArrowDeviceArrayStream, private_data) == 40);
    assert!(size_of::<FFI_ArrowDeviceArrayStream>() == 48);
};

/// The fields of an `ArrowSchema`, as the header declares them, to check a producer's schema
/// before anything reads it: arrow-rs keeps its struct's fields private, and its accessors
/// assert (a panic) on exactly the lies a check must refuse (a NULL format, a NULL child).
/// Only ever read through `SchemaFields::of`; its pointers are the producer's word.
#[repr(C)]
pub struct SchemaFields {
    pub format: *const c_char,
    pub name: *const c_char,
    pub metadata: *const c_char,
    pub flags: i64,
    pub n_children: i64,
    pub children: *const *const FFI_ArrowSchema,
    pub dictionary: *const FFI_ArrowSchema,
    pub release: Option<unsafe extern "C" fn(*mut FFI_ArrowSchema)>,
    pub private_data: *mut c_void,
}

impl SchemaFields {
    pub fn of(schema: &FFI_ArrowSchema) -> &SchemaFields {
        // SAFETY: both are the header's `ArrowSchema`, `#[repr(C)]` with the same fields
        // (sizes and offsets asserted below), all plain data that any bits make valid; read
        // only, for as long as the borrow of `schema`.
        unsafe { &*std::ptr::from_ref(schema).cast::<SchemaFields>() }
    }
}

/// The fields of an `ArrowArray`, as the header declares them, to check a producer's array
/// before anything reads it (as `SchemaFields`, for the same reason).
#[repr(C)]
pub struct ArrayFields {
    pub length: i64,
    pub null_count: i64,
    pub offset: i64,
    pub n_buffers: i64,
    pub n_children: i64,
    pub buffers: *const *const c_void,
    pub children: *const *const FFI_ArrowArray,
    pub dictionary: *const FFI_ArrowArray,
    pub release: Option<unsafe extern "C" fn(*mut FFI_ArrowArray)>,
    pub private_data: *mut c_void,
}

impl ArrayFields {
    pub fn of(array: &FFI_ArrowArray) -> &ArrayFields {
        // SAFETY: both are the header's `ArrowArray`, `#[repr(C)]` with the same fields (sizes
        // and offsets asserted below), plain data any bits make valid; read only, for the borrow.
        unsafe { &*std::ptr::from_ref(array).cast::<ArrayFields>() }
    }
}

// The header's layout (64-bit platforms), which arrow-rs's structs follow: the views above
// read the same bytes.
#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<SchemaFields>() == size_of::<FFI_ArrowSchema>());
    assert!(align_of::<SchemaFields>() == align_of::<FFI_ArrowSchema>());
    assert!(size_of::<SchemaFields>() == 72);
    assert!(offset_of!(SchemaFields, n_children) == 32);
    assert!(offset_of!(SchemaFields, release) == 56);
    assert!(size_of::<ArrayFields>() == size_of::<FFI_ArrowArray>());
    assert!(align_of::<ArrayFields>() == align_of::<FFI_ArrowArray>());
    assert!(offset_of!(ArrayFields, buffers) == 40);
    assert!(offset_of!(ArrayFields, release) == 64);
};

#[cfg(test)]
mod method_numbers {
    use super::Method;

    #[test]
    fn each_method_is_its_own_number_and_no_other_number_is_a_method() {
        for method in Method::ALL {
            assert_eq!(Method::from_u8(method as u8), Some(method));
        }
        for number in 4..=u8::MAX {
            assert_eq!(Method::from_u8(number), None, "{number}");
        }
    }
}
