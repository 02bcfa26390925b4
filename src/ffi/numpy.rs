//! numpy's C structs: the `PyArrayInterface` of `__array_struct__` capsules, and the leading
//! fields of an ndarray. Sizes and field offsets are checked at compile time.

use std::ffi::{c_int, c_void};
use std::mem::{offset_of, size_of};

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
    /// `descr` holds a dtype (anything `numpy.dtype()` takes), read in place of `typekind` and
    /// `itemsize`.
    pub const HAS_DESCR: i32 = 0x800;
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(offset_of!(PyArrayInterface, typekind) == 8);
    assert!(offset_of!(PyArrayInterface, itemsize) == 12);
    assert!(offset_of!(PyArrayInterface, shape) == 24);
    assert!(size_of::<PyArrayInterface>() == 56);
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
