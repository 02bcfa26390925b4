//! The runtime's C API: the table the installed `dlpack._dlpack` extension publishes as the
//! capsule `dlpack._dlpack._C_API` (the one runtime of a process: one importer, one registry of
//! borrowed memory, one `DLPackObject` type), declared once, here, and finding it.
//!
//! The declarations before `api` are the contract. The C header `dlpack_adapter.h`, shipped in
//! the `dlpack` wheel (`dlpack.get_include()`), is generated from them (`cargo run -p
//! dlpack-header`; `make lint` checks it is up to date), and every offset and size is pinned
//! below at compile time.
//!
//! Versions, as numpy's: `abi_version` changes only when the contract breaks (a field moves or
//! changes meaning), and a client refuses any other; `feature_version` is raised when functions
//! are appended to the table or fields to `DLPackAdapterView` and `DLPackAdapterMemory`. A
//! client states the lowest feature level it needs and runs on any runtime of its ABI version at
//! that level or later. Every function is called with the GIL held (on a free-threaded CPython:
//! attached, with a thread state; threads may then call at once, and the runtime locks what they
//! share); one that fails returns -1 (or NULL) with a Python exception set.

use std::ffi::{CStr, c_int, c_void};
use std::mem::offset_of;
use std::sync::OnceLock;

use dlpack_core::abi::{DLDataType, DLDevice};
use pyo3::exceptions::PyImportError;
use pyo3::ffi::PyObject;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// The ABI version: changed only by a change that breaks clients (fields moved, meanings
/// changed), never by appending. 2: 1 was a development layout whose first field was a single
/// version, so that a runtime of that layout is refused by its number.
pub const DLPACK_ADAPTER_ABI_VERSION: u32 = 2;

/// The feature level these declarations describe: raised when functions are appended to the
/// table or fields to the view or memory structs (each says the level it came with).
pub const DLPACK_ADAPTER_FEATURE_VERSION: u32 = 1;

/// The capsule's name, which `PyCapsule_Import("dlpack._dlpack._C_API", 0)` finds.
/// cbindgen:ignore
pub const DLPACK_ADAPTER_CAPSULE_NAME: &CStr = c"dlpack._dlpack._C_API";

/// `view`'s flags and `DLPackAdapterView::flags`: a view that holds its memory exclusively and
/// may write it (asked for by the caller, said back in the view).
pub const DLPACK_ADAPTER_VIEW_MUTABLE: u32 = 1;
/// `DLPackAdapterView::flags`: the elements are in the other byte order (read them through
/// `copy_to`).
pub const DLPACK_ADAPTER_VIEW_SWAPPED: u32 = 2;
/// `DLPackAdapterView::flags`: rows are reached through pointers (suboffsets): `data` is not
/// the elements (read them through `copy_to`).
pub const DLPACK_ADAPTER_VIEW_INDIRECT: u32 = 4;
/// `DLPackAdapterView::flags`: the elements are C-contiguous (extents of 1 may have any stride).
pub const DLPACK_ADAPTER_VIEW_C_CONTIGUOUS: u32 = 8;
/// `DLPackAdapterView::flags`: the memory is read-only.
pub const DLPACK_ADAPTER_VIEW_READONLY: u32 = 16;
/// The bits `view` takes in its `flags` argument; any other is a `ValueError`.
pub const DLPACK_ADAPTER_VIEW_REQUESTS: u32 = DLPACK_ADAPTER_VIEW_MUTABLE;

/// `DLPackAdapterMemory::flags`: the memory is read-only. Any other bit is a `ValueError`.
pub const DLPACK_ADAPTER_MEMORY_READONLY: u32 = 1;

/// A view of an object's memory, which `view` fills; valid, with every pointer in it, until
/// `release_view`. Prepare it with `DLPACK_ADAPTER_VIEW_INIT`, which zeroes it and sets `size`.
///
/// Output flag bits added at later feature levels only describe the memory further: they never
/// change how the fields of an earlier level are read, so a client may ignore bits it doesn't
/// know.
#[repr(C)]
pub struct DLPackAdapterView {
    /// The size of this struct as the caller declares it (`sizeof`): the runtime writes no
    /// byte past it, and refuses a size short of the fields of feature level 1 (a
    /// `ValueError`). Fields of a later level that the runtime doesn't know stay as the caller
    /// set them (zero, after `DLPACK_ADAPTER_VIEW_INIT`).
    pub size: u32,
    /// `DLPACK_ADAPTER_VIEW_*` bits.
    pub flags: u32,
    /// The first element.
    pub data: *mut c_void,
    pub device: DLDevice,
    pub dtype: DLDataType,
    pub ndim: i32,
    /// `ndim` extents.
    pub shape: *const i64,
    /// `ndim` strides, in bytes.
    pub byte_strides: *const i64,
    /// The runtime's: what keeps the memory alive and borrowed.
    pub held: *mut c_void,
}

/// Memory a caller owns, described for `from_memory`. Prepare it with
/// `DLPACK_ADAPTER_MEMORY_INIT`, which zeroes it and sets `size`.
#[repr(C)]
pub struct DLPackAdapterMemory {
    /// The size of this struct as the caller declares it (`sizeof`): the runtime reads no byte
    /// past it, and refuses a size short of the fields of feature level 1 (a `ValueError`).
    /// Fields of a later level past the caller's size read as zero.
    pub size: u32,
    /// `DLPACK_ADAPTER_MEMORY_*` bits.
    pub flags: u32,
    /// The first element (host memory).
    pub data: *mut c_void,
    pub dtype: DLDataType,
    pub ndim: i32,
    /// `ndim` extents.
    pub shape: *const i64,
    /// `ndim` strides in bytes, or NULL for C order.
    pub byte_strides: *const i64,
    /// Called once with `context` when nothing reaches the memory any more: on any thread,
    /// without the GIL, perhaps at interpreter shutdown. NULL: nothing to release.
    pub release: Option<unsafe extern "C" fn(context: *mut c_void)>,
    pub context: *mut c_void,
}

/// The table. Its first two fields are the same in every ABI version.
#[repr(C)]
pub struct DLPackAdapterAPI {
    /// `DLPACK_ADAPTER_ABI_VERSION` of the runtime: a client needs its own.
    pub abi_version: u32,
    /// `DLPACK_ADAPTER_FEATURE_VERSION` of the runtime: a client needs the level it asks for,
    /// or a later one.
    pub feature_version: u32,
    /// `sizeof` this table in the runtime.
    pub size: u32,
    /// Zero.
    pub reserved: u32,
    /// Feature level 1. Fill `out` with a view of `obj`'s memory (anything `dlpack.asdlpack`
    /// reads), held shared, or exclusively with `DLPACK_ADAPTER_VIEW_MUTABLE` in `flags`
    /// (writable host memory no other view holds, in any extension, and the object's own:
    /// memory an import copied, see `copy_reason`, would never pass a write on: else a
    /// `BufferError`). Other bits in `flags` are a `ValueError`. 0, or -1 with the exception
    /// `asdlpack` or the borrow raised. While the view lives, `dlpack.copyto` refuses to write
    /// its memory.
    pub view:
        unsafe extern "C" fn(obj: *mut PyObject, flags: u32, out: *mut DLPackAdapterView) -> c_int,
    /// Feature level 1. Give a view back: its borrow ends and the source may go. Once per
    /// filled view; again, or NULL, does nothing.
    pub release_view: unsafe extern "C" fn(view: *mut DLPackAdapterView),
    /// Feature level 1. Copy the view's elements, C-ordered and in native byte order, to `dst`
    /// (`bytes` long: exactly the elements' size, counted without wrapping, else a
    /// `ValueError`). `dst` may overlap the view's memory: the result is what reading every
    /// element before writing any gives. 0 or -1.
    pub copy_to: unsafe extern "C" fn(
        view: *const DLPackAdapterView,
        dst: *mut c_void,
        bytes: usize,
    ) -> c_int,
    /// Feature level 1. Write `src`'s C-ordered elements (`bytes` long) into a mutable view's
    /// memory, any layout; `src` may overlap that memory, with the same result as `copy_to`'s.
    /// 0 or -1.
    pub copy_from: unsafe extern "C" fn(
        view: *const DLPackAdapterView,
        src: *const c_void,
        bytes: usize,
    ) -> c_int,
    /// Feature level 1. A new `DLPackObject` over `memory` (a new reference), or NULL with an
    /// exception set; on failure `release` is not called (the memory stays the caller's).
    pub from_memory: unsafe extern "C" fn(memory: *const DLPackAdapterMemory) -> *mut PyObject,
    /// Feature level 1. 0 when this process can still have `bytes` more memory (the machine's,
    /// its cgroups', RLIMIT_AS), else -1 with a `MemoryError` saying how much it can: asked
    /// before a large allocation, so that it fails up front instead of waking the OOM killer.
    pub check_memory: unsafe extern "C" fn(bytes: u64) -> c_int,
}

/// The end of a view's fields of feature level 1: the least `size` the runtime takes.
/// cbindgen:ignore
pub const VIEW_SIZE_1: usize = offset_of!(DLPackAdapterView, held) + PTR;
/// The end of a memory's fields of feature level 1: the least `size` the runtime takes.
/// cbindgen:ignore
pub const MEMORY_SIZE_1: usize = offset_of!(DLPackAdapterMemory, context) + PTR;

/// A pointer's size: the fields below are laid out for 4 and 8.
/// cbindgen:ignore
const PTR: usize = size_of::<*const c_void>();

// Every offset and size, as C lays the structs out (and as the header and the ctypes
// declarations of the tests say): a field moved or resized is an ABI change, which must not
// build unnoticed. No struct has padding, so every byte of one is a field's.
const _: () = {
    assert!(size_of::<DLDevice>() == 8 && align_of::<DLDevice>() == 4);
    assert!(size_of::<DLDataType>() == 4 && align_of::<DLDataType>() == 2);

    assert!(offset_of!(DLPackAdapterView, size) == 0);
    assert!(offset_of!(DLPackAdapterView, flags) == 4);
    assert!(offset_of!(DLPackAdapterView, data) == 8);
    assert!(offset_of!(DLPackAdapterView, device) == 8 + PTR);
    assert!(offset_of!(DLPackAdapterView, dtype) == 16 + PTR);
    assert!(offset_of!(DLPackAdapterView, ndim) == 20 + PTR);
    assert!(offset_of!(DLPackAdapterView, shape) == 24 + PTR);
    assert!(offset_of!(DLPackAdapterView, byte_strides) == 24 + 2 * PTR);
    assert!(offset_of!(DLPackAdapterView, held) == 24 + 3 * PTR);
    assert!(size_of::<DLPackAdapterView>() == 24 + 4 * PTR);
    assert!(VIEW_SIZE_1 == size_of::<DLPackAdapterView>());

    assert!(offset_of!(DLPackAdapterMemory, size) == 0);
    assert!(offset_of!(DLPackAdapterMemory, flags) == 4);
    assert!(offset_of!(DLPackAdapterMemory, data) == 8);
    assert!(offset_of!(DLPackAdapterMemory, dtype) == 8 + PTR);
    assert!(offset_of!(DLPackAdapterMemory, ndim) == 12 + PTR);
    assert!(offset_of!(DLPackAdapterMemory, shape) == 16 + PTR);
    assert!(offset_of!(DLPackAdapterMemory, byte_strides) == 16 + 2 * PTR);
    assert!(offset_of!(DLPackAdapterMemory, release) == 16 + 3 * PTR);
    assert!(offset_of!(DLPackAdapterMemory, context) == 16 + 4 * PTR);
    assert!(size_of::<DLPackAdapterMemory>() == 16 + 5 * PTR);
    assert!(MEMORY_SIZE_1 == size_of::<DLPackAdapterMemory>());

    assert!(offset_of!(DLPackAdapterAPI, abi_version) == 0);
    assert!(offset_of!(DLPackAdapterAPI, feature_version) == 4);
    assert!(offset_of!(DLPackAdapterAPI, size) == 8);
    assert!(offset_of!(DLPackAdapterAPI, reserved) == 12);
    assert!(offset_of!(DLPackAdapterAPI, view) == 16);
    assert!(offset_of!(DLPackAdapterAPI, release_view) == 16 + PTR);
    assert!(offset_of!(DLPackAdapterAPI, copy_to) == 16 + 2 * PTR);
    assert!(offset_of!(DLPackAdapterAPI, copy_from) == 16 + 3 * PTR);
    assert!(offset_of!(DLPackAdapterAPI, from_memory) == 16 + 4 * PTR);
    assert!(offset_of!(DLPackAdapterAPI, check_memory) == 16 + 5 * PTR);
    assert!(size_of::<DLPackAdapterAPI>() == 16 + 6 * PTR);
};

impl DLPackAdapterView {
    /// A view to fill, as `DLPACK_ADAPTER_VIEW_INIT` prepares one: empty, its size set.
    pub const fn new() -> Self {
        DLPackAdapterView {
            size: size_of::<Self>() as u32,
            flags: 0,
            data: std::ptr::null_mut(),
            device: DLDevice {
                device_type: 0,
                device_id: 0,
            },
            dtype: DLDataType {
                code: 0,
                bits: 0,
                lanes: 0,
            },
            ndim: 0,
            shape: std::ptr::null(),
            byte_strides: std::ptr::null(),
            held: std::ptr::null_mut(),
        }
    }
}

impl Default for DLPackAdapterView {
    fn default() -> Self {
        Self::new()
    }
}

/// The runtime's table: `dlpack._dlpack` imported on first use, its `_C_API` capsule read and
/// its versions checked: this crate's ABI version, at its feature level or later. A missing
/// `dlpack`, or one of another ABI or an older level, is an `ImportError` naming both sides.
pub fn api(py: Python<'_>) -> PyResult<&'static DLPackAdapterAPI> {
    static API: OnceLock<&'static DLPackAdapterAPI> = OnceLock::new();
    if let Some(api) = API.get() {
        return Ok(api);
    }
    let needed = || {
        format!(
            "the dlpack-adapter crate {} needs the dlpack Python package (pip install \
             dlpack-adapter) with C API ABI version {DLPACK_ADAPTER_ABI_VERSION} at feature level \
             {DLPACK_ADAPTER_FEATURE_VERSION} or later",
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
    let refused = |why: &str| {
        PyImportError::new_err(format!(
            "{}; the installed dlpack {installed} {why}",
            needed()
        ))
    };
    let capsule = module
        .getattr("_C_API")
        .map_err(|_| refused("has no C API"))?;
    let capsule = capsule
        .cast::<PyCapsule>()
        .map_err(|_| refused("has a _C_API that is no capsule"))?;
    let pointer = capsule
        .pointer_checked(Some(DLPACK_ADAPTER_CAPSULE_NAME))
        .map_err(|_| refused("has a _C_API capsule of another name"))?;
    // SAFETY: a capsule of this name holds the runtime's static table, whose first two fields
    // (the versions) every ABI version has, which holds the rest as its ABI version says, and
    // which lives for the rest of the process (the extension module is never unloaded).
    let api = unsafe { table(pointer.as_ptr()) }.map_err(|why| refused(&why))?;
    Ok(API.get_or_init(|| api))
}

/// The table at `table`, once its header (read through the raw pointer) says it is of this
/// crate's ABI version, at its feature level or later, and holds at least this crate's
/// declaration: only then is a reference made over that many bytes. Else what the header
/// says, for the error.
///
/// # Safety
/// `table` is readable for the two versions (two `u32`s) and, where they are this crate's ABI
/// version, for the header (`size` after them) and for `size` bytes holding a table of those
/// versions, alive for the rest of the process.
unsafe fn table(table: *const c_void) -> Result<&'static DLPackAdapterAPI, String> {
    let table = table.cast::<DLPackAdapterAPI>();
    let field = |offset: usize| table.cast::<u8>().wrapping_add(offset).cast::<u32>();
    // SAFETY: a field of the header every ABI version has, readable (the contract); nothing is
    // assumed of the alignment of a table some other `dlpack` made.
    let abi = unsafe { field(offset_of!(DLPackAdapterAPI, abi_version)).read_unaligned() };
    // SAFETY: the header's other field of every ABI version, read unaligned too.
    let feature = unsafe { field(offset_of!(DLPackAdapterAPI, feature_version)).read_unaligned() };
    if abi != DLPACK_ADAPTER_ABI_VERSION || feature < DLPACK_ADAPTER_FEATURE_VERSION {
        return Err(format!(
            "has C API ABI version {abi} at feature level {feature}"
        ));
    }
    // SAFETY: this ABI version's header holds `size` after the versions (the contract).
    let size = unsafe { field(offset_of!(DLPackAdapterAPI, size)).read_unaligned() };
    if (size as usize) < size_of::<DLPackAdapterAPI>() {
        return Err(format!(
            "has a C API table of {size} bytes at feature level {feature} (this crate reads {})",
            size_of::<DLPackAdapterAPI>()
        ));
    }
    if !table.is_aligned() {
        return Err(format!(
            "has a C API table at a misaligned address ({table:p})"
        ));
    }
    // SAFETY: the header says the table holds at least `size_of::<DLPackAdapterAPI>()` bytes of
    // this ABI version, at this crate's feature level or later (whose first fields are this
    // declaration, the table only growing by appending), aligned (checked), alive for the rest
    // of the process (the contract).
    Ok(unsafe { &*table })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_of_another_abi_or_an_older_level_are_refused_from_their_versions() {
        // Another ABI version: refused from its first field, whatever the rest says (the
        // layout of ABI version 1, a version and a size, among them).
        for header in [[1u32, 56, 0, 0], [3, 1, 4096, 0]] {
            // SAFETY: the header is readable; the table is refused before anything past the
            // versions is read.
            let refused = unsafe { table(header.as_ptr().cast()) }.err();
            let abi = header[0];
            let feature = header[1];
            assert_eq!(
                refused.as_deref(),
                Some(format!("has C API ABI version {abi} at feature level {feature}").as_str())
            );
        }
        // This ABI at an older feature level (0 stands for one, below this crate's 1).
        let header = [
            DLPACK_ADAPTER_ABI_VERSION,
            DLPACK_ADAPTER_FEATURE_VERSION - 1,
            4096,
            0,
        ];
        // SAFETY: the header is readable; the table is refused for its level before anything
        // past the versions is read.
        let refused = unsafe { table(header.as_ptr().cast()) }.err();
        assert!(refused.unwrap().ends_with(&format!(
            "at feature level {}",
            DLPACK_ADAPTER_FEATURE_VERSION - 1
        )));
    }

    #[test]
    fn a_table_smaller_than_this_crates_is_refused_from_its_header() {
        // This crate's versions, and nothing of the functions it reads.
        let header = [
            DLPACK_ADAPTER_ABI_VERSION,
            DLPACK_ADAPTER_FEATURE_VERSION,
            16,
            0,
        ];
        // SAFETY: the header is readable; the table is refused before anything past it is read.
        let refused = unsafe { table(header.as_ptr().cast()) }.err();
        assert_eq!(
            refused.as_deref(),
            Some(
                format!(
                    "has a C API table of 16 bytes at feature level 1 (this crate reads {})",
                    size_of::<DLPackAdapterAPI>()
                )
                .as_str()
            )
        );
    }
}
