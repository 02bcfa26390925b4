//! The runtime's C API as this crate sees it: the declarations of the table the installed
//! `dlpack._dlpack` extension publishes as `_C_API` (the one runtime of the process: one
//! importer, one registry of borrowed memory, one `DLPackObject` type), and finding it.
//!
//! The table starts with its version and size and only ever grows, by appending: a caller
//! built against version N reads the first N's functions of any later table. Every function is
//! called with the GIL held; one that fails returns -1 (or NULL) with a Python exception set.

use std::ffi::{CStr, c_int, c_void};
use std::mem::offset_of;
use std::sync::OnceLock;

use dlpack_core::abi::{DLDataType, DLDevice};
use pyo3::exceptions::PyImportError;
use pyo3::ffi::PyObject;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// The table's version: 1 is the first. Bumped when functions are appended.
pub const VERSION: u32 = 1;

/// The capsule's name, which `PyCapsule_Import("dlpack._dlpack._C_API", 0)` finds.
pub const CAPSULE_NAME: &CStr = c"dlpack._dlpack._C_API";

/// `View::flags`: the view holds its memory exclusively and may write it.
pub const VIEW_MUTABLE: u32 = 1;
/// `View::flags`: the elements are in the other byte order (read them through `copy_to`).
pub const VIEW_SWAPPED: u32 = 2;
/// `View::flags`: rows are reached through pointers (suboffsets): `data` is not the elements
/// (read them through `copy_to`).
pub const VIEW_INDIRECT: u32 = 4;
/// `View::flags`: the elements are C-contiguous (extents of 1 may have any stride).
pub const VIEW_C_CONTIGUOUS: u32 = 8;

/// A view of an object's memory, which the runtime fills; valid, with every pointer in it,
/// until `release_view`.
#[repr(C)]
pub struct View {
    /// The first element.
    pub data: *mut c_void,
    pub device: DLDevice,
    pub dtype: DLDataType,
    pub ndim: i32,
    /// `VIEW_*` bits.
    pub flags: u32,
    /// 1 when the memory is read-only.
    pub readonly: i32,
    /// `ndim` extents.
    pub shape: *const i64,
    /// `ndim` strides, in bytes.
    pub byte_strides: *const i64,
    /// The runtime's: what keeps the memory alive and borrowed.
    pub held: *mut c_void,
}

/// Memory a caller owns, described for `from_memory`.
#[repr(C)]
pub struct Memory {
    /// The first element (host memory).
    pub data: *mut c_void,
    pub dtype: DLDataType,
    pub ndim: i32,
    pub readonly: i32,
    /// `ndim` extents.
    pub shape: *const i64,
    /// `ndim` strides in bytes, or NULL for C order.
    pub byte_strides: *const i64,
    /// Called once with `context` when nothing reaches the memory any more: on any thread,
    /// without the GIL, perhaps at interpreter shutdown. NULL: nothing to release.
    pub release: Option<unsafe extern "C" fn(context: *mut c_void)>,
    pub context: *mut c_void,
}

/// The table.
#[repr(C)]
pub struct CApi {
    pub version: u32,
    /// `size_of` this table, as the runtime was built: the functions it has.
    pub size: u32,
    /// Fill `out` with a view of `obj`'s memory (anything `dlpack.asdlpack` reads), held shared,
    /// or exclusively with `VIEW_MUTABLE` in `flags` (writable host memory no other view holds,
    /// in any extension, and the object's own: memory an import copied would never pass a
    /// write on). 0, or -1 with the exception `asdlpack` or the borrow raised. While the view
    /// lives, `dlpack.copyto` refuses to write its memory.
    pub view: unsafe extern "C" fn(obj: *mut PyObject, flags: u32, out: *mut View) -> c_int,
    /// Give a view back: its borrow ends and the source may go. Once per filled view.
    pub release_view: unsafe extern "C" fn(view: *mut View),
    /// Copy the view's elements, C-ordered and in native byte order, to `dst` (`bytes` long:
    /// exactly the elements' size). `dst` may overlap the view's memory: the result is what
    /// reading every element before writing any gives. 0 or -1.
    pub copy_to: unsafe extern "C" fn(view: *const View, dst: *mut c_void, bytes: usize) -> c_int,
    /// Write `src`'s C-ordered elements (`bytes` long) into a mutable view's memory, any layout;
    /// `src` may overlap that memory, with the same result as `copy_to`'s. 0 or -1.
    pub copy_from:
        unsafe extern "C" fn(view: *const View, src: *const c_void, bytes: usize) -> c_int,
    /// A new `DLPackObject` over `memory` (a new reference), or NULL with an exception set; on
    /// failure `release` is not called (the memory stays the caller's).
    pub from_memory: unsafe extern "C" fn(memory: *const Memory) -> *mut PyObject,
    /// 0 when this process can still have `bytes` more memory (the machine's, its cgroups',
    /// RLIMIT_AS), else -1 with a `MemoryError` saying how much it can: asked before a large
    /// allocation, so that it fails up front instead of waking the OOM killer.
    pub check_memory: unsafe extern "C" fn(bytes: u64) -> c_int,
}

/// The runtime's table: `dlpack._dlpack` imported on first use, its `_C_API` capsule read and
/// its version checked. A missing or too old `dlpack` is an `ImportError` naming the installed
/// and the needed version.
pub fn api(py: Python<'_>) -> PyResult<&'static CApi> {
    static API: OnceLock<&'static CApi> = OnceLock::new();
    if let Some(api) = API.get() {
        return Ok(api);
    }
    let needed = || {
        format!(
            "the dlpack-adapter crate {} needs the dlpack Python package (pip install \
             dlpack-adapter) with C API version {VERSION} or later",
            env!("CARGO_PKG_VERSION")
        )
    };
    let module = py
        .import("dlpack._dlpack")
        .map_err(|err| PyImportError::new_err(format!("{}: {err}", needed())))?;
    let installed = module
        .getattr("__version__")
        .and_then(|v| v.extract::<String>())
        .unwrap_or_else(|_| "of unknown version".to_owned());
    let too_old = |why: &str| {
        PyImportError::new_err(format!(
            "{}; the installed dlpack {installed} {why}",
            needed()
        ))
    };
    let capsule = module
        .getattr("_C_API")
        .map_err(|_| too_old("has no C API"))?;
    let capsule = capsule
        .cast::<PyCapsule>()
        .map_err(|_| too_old("has a _C_API that is no capsule"))?;
    let pointer = capsule
        .pointer_checked(Some(CAPSULE_NAME))
        .map_err(|_| too_old("has a _C_API capsule of another name"))?;
    // SAFETY: a capsule of this name holds the runtime's static table, whose first two fields
    // (the version and size) every version has, and which lives for the rest of the process
    // (the extension module is never unloaded).
    let api = unsafe { table(pointer.as_ptr()) }.map_err(|why| too_old(&why))?;
    Ok(API.get_or_init(|| api))
}

/// The table at `table`, once its header (read through the raw pointer) says it is of
/// `VERSION` or later and holds at least this crate's declaration: only then is a reference
/// made over that many bytes. Else what the header says, for the error.
///
/// # Safety
/// `table` is readable for the header (the version and size, two `u32`s) and, where the header
/// says so, for `size` bytes holding a table of that version, alive for the rest of the process.
unsafe fn table(table: *const c_void) -> Result<&'static CApi, String> {
    let table = table.cast::<CApi>();
    let field = |offset: usize| table.cast::<u8>().wrapping_add(offset).cast::<u32>();
    // SAFETY: a field of the header, readable (the contract); nothing is assumed of the
    // alignment of a table some other `dlpack` made.
    let version = unsafe { field(offset_of!(CApi, version)).read_unaligned() };
    // SAFETY: the header's other field, readable (the contract), read unaligned too.
    let size = unsafe { field(offset_of!(CApi, size)).read_unaligned() };
    if version < VERSION || (size as usize) < size_of::<CApi>() {
        return Err(format!(
            "has C API version {version}, a table of {size} bytes (this crate reads {})",
            size_of::<CApi>()
        ));
    }
    if !table.is_aligned() {
        return Err(format!(
            "has a C API table at a misaligned address ({table:p})"
        ));
    }
    // SAFETY: the header says the table holds at least `size_of::<CApi>()` bytes of version
    // `VERSION` or later (whose first fields are this declaration, the table only growing by
    // appending), aligned (checked), alive for the rest of the process (the contract).
    Ok(unsafe { &*table })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_smaller_than_this_crates_is_refused_from_its_header() {
        // An older runtime's table: its header, and nothing of the functions this crate reads.
        let header = [VERSION, 8u32];
        // SAFETY: the header is readable; the table is refused before anything past it is read.
        let refused = unsafe { table(header.as_ptr().cast()) }.err();
        assert_eq!(
            refused.as_deref(),
            Some(
                format!(
                    "has C API version 1, a table of 8 bytes (this crate reads {})",
                    size_of::<CApi>()
                )
                .as_str()
            )
        );
        // A version older than this crate's, whatever size it claims.
        let header = [0u32, 8];
        // SAFETY: the header is readable, and refused for its version before anything past it
        // is read.
        let refused = unsafe { table(header.as_ptr().cast()) }.err();
        assert!(refused.unwrap().starts_with("has C API version 0"));
    }
}
