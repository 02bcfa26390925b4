//! The C ABIs we speak: DLPack's (header version 1.3), laid out exactly as `dlpack.h` declares
//! it, numpy's structs, and (in `python`) every raw call into CPython's C API.
//!
//! This is the only module that spells out raw DLPack structs; everything else works with the
//! safe description in `crate::tensor`. Sizes and field offsets are checked at compile time so a
//! layout mistake cannot build.

pub mod python;

use std::ffi::{CStr, c_char, c_int, c_void};
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
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// The DLPack version this crate implements and reports in versioned capsules.
pub const DLPACK_MAJOR_VERSION: u32 = 1;
pub const DLPACK_MINOR_VERSION: u32 = 3;

/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write through the tensor.
pub const FLAG_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the producer made a copy the consumer owns alone.
pub const FLAG_IS_COPIED: u64 = 1 << 1;

/// Capsule names of the Python DLPack protocol; consumers rename a capsule to the `used_` form
/// when they take ownership of its tensor.
pub const CAPSULE_LEGACY: &CStr = c"dltensor";
pub const CAPSULE_VERSIONED: &CStr = c"dltensor_versioned";
pub const CAPSULE_LEGACY_USED: &CStr = c"used_dltensor";
pub const CAPSULE_VERSIONED_USED: &CStr = c"used_dltensor_versioned";

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

impl DLDevice {
    pub const CPU: DLDevice = DLDevice {
        device_type: device_type::CPU,
        device_id: 0,
    };

    /// A short name: "cpu:0", "cuda:1", or the type's number for codes we don't name.
    pub fn name(self) -> String {
        let kind = match self.device_type {
            device_type::CPU => "cpu",
            device_type::CUDA => "cuda",
            device_type::CUDA_HOST => "cuda_host",
            device_type::CUDA_MANAGED => "cuda_managed",
            device_type::ROCM => "rocm",
            device_type::ROCM_HOST => "rocm_host",
            device_type::OPENCL => "opencl",
            device_type::VULKAN => "vulkan",
            device_type::METAL => "metal",
            device_type::VPI => "vpi",
            device_type::EXT_DEV => "ext_dev",
            device_type::ONE_API => "oneapi",
            device_type::WEB_GPU => "webgpu",
            device_type::HEXAGON => "hexagon",
            device_type::MAIA => "maia",
            device_type::TRN => "trn",
            _ => return format!("device_type_{}:{}", self.device_type, self.device_id),
        };
        format!("{kind}:{}", self.device_id)
    }

    /// Whether the CPU can address this memory directly (no stream to synchronise with): the
    /// CPU's, and CUDA's or ROCm's pinned host memory.
    #[inline]
    pub fn is_host(self) -> bool {
        device_type::HOST.contains(&self.device_type)
    }
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

/// `DLDeviceType` codes we name; others pass through as plain integers.
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

    /// Every code with its `dlpack.h` name, in `dlpack.h`'s order (Python's `DLDeviceType`).
    pub const NAMED: &[(&str, i32)] = &[
        ("kDLCPU", CPU),
        ("kDLCUDA", CUDA),
        ("kDLCUDAHost", CUDA_HOST),
        ("kDLOpenCL", OPENCL),
        ("kDLVulkan", VULKAN),
        ("kDLMetal", METAL),
        ("kDLVPI", VPI),
        ("kDLROCM", ROCM),
        ("kDLROCMHost", ROCM_HOST),
        ("kDLExtDev", EXT_DEV),
        ("kDLCUDAManaged", CUDA_MANAGED),
        ("kDLOneAPI", ONE_API),
        ("kDLWebGPU", WEB_GPU),
        ("kDLHexagon", HEXAGON),
        ("kDLMAIA", MAIA),
        ("kDLTrn", TRN),
    ];

    /// Host memory: the CPU addresses it directly, with no stream to order with.
    pub const HOST: &[i32] = &[CPU, CUDA_HOST, ROCM_HOST];

    /// Memory the CPU can read in place: host memory, and CUDA managed memory once its stream
    /// is done.
    pub const CPU_READABLE: &[i32] = &[CPU, CUDA_HOST, ROCM_HOST, CUDA_MANAGED];
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

/// numpy's `PyArrayInterface`, the struct inside an `__array_struct__` capsule.
#[repr(C)]
pub struct PyArrayInterface {
    /// Always 2; a sanity check.
    pub two: i32,
    pub nd: i32,
    pub typekind: u8,
    pub itemsize: i32,
    pub flags: i32,
    pub shape: *const isize,
    pub strides: *const isize,
    pub data: *mut c_void,
    pub descr: *mut pyo3::ffi::PyObject,
}

/// `PyArrayInterface.flags` bits.
#[allow(dead_code, reason = "the flags numpy defines, kept complete")]
pub mod array_struct_flags {
    pub const CONTIGUOUS: i32 = 0x1;
    pub const FORTRAN: i32 = 0x2;
    pub const ALIGNED: i32 = 0x100;
    pub const NOTSWAPPED: i32 = 0x200;
    pub const WRITEABLE: i32 = 0x400;
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(offset_of!(PyArrayInterface, typekind) == 8);
    assert!(offset_of!(PyArrayInterface, itemsize) == 12);
    assert!(offset_of!(PyArrayInterface, shape) == 24);
    assert!(size_of::<PyArrayInterface>() == 56);
};

/// Capsule name of the DLPack C exchange API table (`__dlpack_c_exchange_api__`).
pub const CAPSULE_EXCHANGE_API: &CStr = c"dlpack_exchange_api";

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

/// The leading fields of numpy's `PyArrayObject_fields` (stable since numpy 1.7, through 2.x),
/// which follow the `PyObject` header. Only read after a per-process self-check against the
/// array interface (see `import::numpy`).
#[repr(C)]
pub struct NumpyArrayFields {
    pub data: *mut c_void,
    pub nd: c_int,
    pub dimensions: *const isize,
    pub strides: *const isize,
    pub base: *mut pyo3::ffi::PyObject,
    pub descr: *mut pyo3::ffi::PyObject,
    pub flags: c_int,
}

/// `NPY_ARRAY_WRITEABLE`.
pub const NPY_ARRAY_WRITEABLE: c_int = 0x0400;
