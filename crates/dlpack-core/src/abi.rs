//! DLPack's C ABI (header version 1.3), laid out exactly as `dlpack.h` declares it: the tensor
//! structs, versions, flags, the device and data type codes, and the C exchange API table.
//!
//! This is the only module that spells out raw DLPack structs; everything else works with the
//! safe descriptions built from them. Sizes and field offsets are checked at compile time so a
//! layout mistake cannot build.

use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};

/// The `len` items of a C array at `ptr`, which may be null (or dangling) when `len` is 0, as C
/// allows (for a 0-d shape, say); a Rust slice may not be, even an empty one.
///
/// # Safety
/// When `len > 0`, `ptr` points at `len` initialised, aligned items that live for `'a` and are
/// not written meanwhile.
#[inline(always)]
pub unsafe fn c_array<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if len == 0 {
        return &[];
    }
    // SAFETY: `len > 0` here, so `ptr` points at `len` initialised, aligned items that live for
    // `'a` unwritten (this function's contract).
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// The DLPack version this crate implements and reports in versioned capsules.
pub const DLPACK_MAJOR_VERSION: u32 = 1;
pub const DLPACK_MINOR_VERSION: u32 = 3;

/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write through the tensor.
pub const FLAG_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the producer made a copy the consumer owns alone.
pub const FLAG_IS_COPIED: u64 = 1 << 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLPackVersion {
    pub major: u32,
    pub minor: u32,
}

/// `DLDevice`. `device_type` is kept as a plain `i32`: producers may send codes newer than ours.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDevice {
    pub device_type: i32,
    pub device_id: i32,
}

/// `DLDataType`: type code, bits per lane, lanes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

/// The legacy (unversioned) managed tensor of capsules named `"dltensor"`.
#[repr(C)]
pub struct DLManagedTensor {
    pub dl_tensor: DLTensor,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// The versioned managed tensor of capsules named `"dltensor_versioned"`.
#[repr(C)]
pub struct DLManagedTensorVersioned {
    pub version: DLPackVersion,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    pub flags: u64,
    pub dl_tensor: DLTensor,
}

/// `DLDeviceType` codes we name (see `crate::device` for their names); others pass through as
/// plain integers.
#[allow(dead_code, reason = "the full ABI enumeration, kept complete")]
pub mod device_type {
    pub const CPU: i32 = 1;
    pub const CUDA: i32 = 2;
    pub const CUDA_HOST: i32 = 3;
    pub const OPENCL: i32 = 4;
    pub const VULKAN: i32 = 7;
    pub const METAL: i32 = 8;
    pub const VPI: i32 = 9;
    pub const ROCM: i32 = 10;
    pub const ROCM_HOST: i32 = 11;
    pub const EXT_DEV: i32 = 12;
    pub const CUDA_MANAGED: i32 = 13;
    pub const ONE_API: i32 = 14;
    pub const WEB_GPU: i32 = 15;
    pub const HEXAGON: i32 = 16;
    pub const MAIA: i32 = 17;
    pub const TRN: i32 = 18;
}

/// `DLDataTypeCode` values.
#[allow(dead_code, reason = "the full ABI enumeration, kept complete")]
pub mod type_code {
    pub const INT: u8 = 0;
    pub const UINT: u8 = 1;
    pub const FLOAT: u8 = 2;
    pub const OPAQUE_HANDLE: u8 = 3;
    pub const BFLOAT: u8 = 4;
    pub const COMPLEX: u8 = 5;
    pub const BOOL: u8 = 6;
    pub const FLOAT8_E3M4: u8 = 7;
    pub const FLOAT8_E4M3: u8 = 8;
    pub const FLOAT8_E4M3B11FNUZ: u8 = 9;
    pub const FLOAT8_E4M3FN: u8 = 10;
    pub const FLOAT8_E4M3FNUZ: u8 = 11;
    pub const FLOAT8_E5M2: u8 = 12;
    pub const FLOAT8_E5M2FNUZ: u8 = 13;
    pub const FLOAT8_E8M0FNU: u8 = 14;
    pub const FLOAT6_E2M3FN: u8 = 15;
    pub const FLOAT6_E3M2FN: u8 = 16;
    pub const FLOAT4_E2M1FN: u8 = 17;
}

// The ABI on 64-bit targets, as dlpack.h lays it out.
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<DLPackVersion>() == 8);
    assert!(size_of::<DLDevice>() == 8);
    assert!(size_of::<DLDataType>() == 4);
    assert!(size_of::<DLTensor>() == 48);
    assert!(offset_of!(DLTensor, device) == 8);
    assert!(offset_of!(DLTensor, ndim) == 16);
    assert!(offset_of!(DLTensor, dtype) == 20);
    assert!(offset_of!(DLTensor, shape) == 24);
    assert!(offset_of!(DLTensor, strides) == 32);
    assert!(offset_of!(DLTensor, byte_offset) == 40);
    assert!(size_of::<DLManagedTensor>() == 64);
    assert!(offset_of!(DLManagedTensor, manager_ctx) == 48);
    assert!(offset_of!(DLManagedTensor, deleter) == 56);
    assert!(size_of::<DLManagedTensorVersioned>() == 80);
    assert!(offset_of!(DLManagedTensorVersioned, manager_ctx) == 8);
    assert!(offset_of!(DLManagedTensorVersioned, deleter) == 16);
    assert!(offset_of!(DLManagedTensorVersioned, flags) == 24);
    assert!(offset_of!(DLManagedTensorVersioned, dl_tensor) == 32);
};

/// `SetError(error_ctx, kind, message)` as the allocator receives it.
pub type DLPackSetError =
    unsafe extern "C" fn(error_ctx: *mut c_void, kind: *const c_char, message: *const c_char);

/// The DLPack 1.3 C exchange API (`DLPackExchangeAPI` in dlpack.h): a static table of functions
/// a framework publishes on its tensor type so C consumers skip the Python `__dlpack__` call.
#[repr(C)]
pub struct DLPackExchangeAPIHeader {
    pub version: DLPackVersion,
    pub prev_api: *mut DLPackExchangeAPIHeader,
}

#[repr(C)]
pub struct DLPackExchangeAPI {
    pub header: DLPackExchangeAPIHeader,
    pub managed_tensor_allocator: Option<
        unsafe extern "C" fn(
            prototype: *mut DLTensor,
            out: *mut *mut DLManagedTensorVersioned,
            error_ctx: *mut c_void,
            set_error: Option<DLPackSetError>,
        ) -> c_int,
    >,
    pub managed_tensor_from_py_object_no_sync: Option<
        unsafe extern "C" fn(
            py_object: *mut c_void,
            out: *mut *mut DLManagedTensorVersioned,
        ) -> c_int,
    >,
    pub managed_tensor_to_py_object_no_sync: Option<
        unsafe extern "C" fn(
            tensor: *mut DLManagedTensorVersioned,
            out_py_object: *mut *mut c_void,
        ) -> c_int,
    >,
    pub dltensor_from_py_object_no_sync:
        Option<unsafe extern "C" fn(py_object: *mut c_void, out: *mut DLTensor) -> c_int>,
    pub current_work_stream: Option<
        unsafe extern "C" fn(
            device_type: i32,
            device_id: i32,
            out_current_stream: *mut *mut c_void,
        ) -> c_int,
    >,
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<DLPackExchangeAPIHeader>() == 16);
    assert!(offset_of!(DLPackExchangeAPI, managed_tensor_allocator) == 16);
    assert!(offset_of!(DLPackExchangeAPI, current_work_stream) == 48);
    assert!(size_of::<DLPackExchangeAPI>() == 56);
};
