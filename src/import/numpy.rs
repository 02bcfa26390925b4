//! A fast importer for exact `numpy.ndarray`s: reads the array's C struct directly instead of
//! calling its `__dlpack__` (a method call, a keyword dict, a capsule, and a deleter that takes
//! the GIL again). It describes exactly what the DLPack path would, holding a reference to the
//! array as numpy's own export does.
//!
//! The struct layout is numpy's stable ABI, but it is only trusted after a self-check on the
//! first array seen: every field must agree with that array's `__array_interface__`. Element
//! types are parsed once per dtype object (numpy's builtin dtypes are singletons). Anything
//! unusual (a dtype we can't express) goes back to the general path, which gives the errors.

use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyTuple};
use pyo3::{PyTypeInfo, intern};

use super::address_map::AddressMap;
use super::array_interface::resolve_dtype;
use crate::error::Result;
use crate::ffi::python;
use crate::ffi::{NPY_ARRAY_WRITEABLE, NumpyArrayFields};
use crate::tensor::{Device, Owner, Storage, Tensor};
use dlpack_core::abi::DLDataType;
use dlpack_core::dtype::DType;
use dlpack_core::dtype::StoredType;
use dlpack_core::layout::Layout;

/// Whether `ty` is numpy's ndarray itself (not a subclass, which may export differently, nor a
/// class made at run time under its name). Remembers it for `ExactNdarray::new`.
pub fn is_ndarray_type(ty: &Bound<'_, pyo3::types::PyType>) -> bool {
    let py = ty.py();
    let named = |attr, want: &str| {
        ty.getattr(attr)
            .is_ok_and(|v| v.cast::<PyString>().is_ok_and(|s| s == want))
    };
    let is_ndarray = !python::is_heap_type(ty)
        && named(intern!(py, "__module__"), "numpy")
        && named(intern!(py, "__name__"), "ndarray");
    if is_ndarray {
        NDARRAY.store(ty.as_type_ptr(), Ordering::Relaxed);
    }
    is_ndarray
}

/// numpy's ndarray type once a probe found it: a static type, which lives as long as the
/// process, so its address identifies it (`import` checks it before any per-type lookup).
static NDARRAY: AtomicPtr<python::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());

/// An object whose type is exactly numpy's ndarray (as a probe found it): only `new`, which
/// checks, makes one, so its struct is numpy's.
#[derive(Clone, Copy)]
pub struct ExactNdarray<'a, 'py>(&'a Bound<'py, PyAny>);

impl<'a, 'py> ExactNdarray<'a, 'py> {
    /// `obj` if it is exactly numpy's ndarray, as a previous probe found it (`None` before).
    #[inline(always)]
    pub fn new(obj: &'a Bound<'py, PyAny>) -> Option<Self> {
        let ndarray = NDARRAY.load(Ordering::Relaxed);
        // SAFETY: `obj` is a live object; reading its type pointer touches nothing else.
        let ty = unsafe { python::type_of(obj.as_ptr()) };
        (!ndarray.is_null() && ty == ndarray).then_some(ExactNdarray(obj))
    }

    fn py(self) -> Python<'py> {
        self.0.py()
    }

    /// The array's fields at `offset`, which the self-check found to agree with what an array
    /// says.
    fn fields(self, offset: FieldsOffset) -> Fields<'a, 'py> {
        // SAFETY: `FieldsOffset` comes only from `self_check`, which found these fields after
        // the object header on an ndarray; every ndarray has the same struct.
        let fields = unsafe { fields_at(self.0, offset.0) };
        Fields {
            array: self.0,
            fields,
        }
    }
}

/// An ndarray's own fields, as numpy keeps them while the array lives: only
/// `ExactNdarray::fields` makes one.
#[derive(Clone, Copy)]
struct Fields<'a, 'py> {
    array: &'a Bound<'py, PyAny>,
    fields: &'a NumpyArrayFields,
}

/// Byte offset of the fields after the object header, once the self-check passed. (A
/// `PyOnceLock`: the check runs Python code, so a plain lock could deadlock against the GIL.)
static FIELDS_OFFSET: PyOnceLock<Option<FieldsOffset>> = PyOnceLock::new();

/// Where numpy's fields start in an ndarray: only `self_check` makes one, having compared them
/// with an array's own description.
#[derive(Clone, Copy)]
struct FieldsOffset(usize);

/// The fields `offset` bytes into `array`.
///
/// # Safety
/// `array` is an ndarray whose struct has numpy's array fields `offset` bytes in (numpy's ABI:
/// right after the object header).
unsafe fn fields_at<'a>(array: &'a Bound<'_, PyAny>, offset: usize) -> &'a NumpyArrayFields {
    let at = array.as_ptr().cast::<u8>().wrapping_add(offset);
    // SAFETY: per the contract, the fields live there as long as the array.
    unsafe { &*at.cast::<NumpyArrayFields>() }
}

/// Compare the struct with what the array interface says, on one array.
fn self_check(array: ExactNdarray<'_, '_>) -> Option<FieldsOffset> {
    let py = array.py();
    let offset = PyAny::type_object(py)
        .getattr(intern!(py, "__basicsize__"))
        .ok()?
        .extract()
        .ok()?;
    // SAFETY: numpy's ABI puts the fields right after the object header, which is `offset`
    // bytes; what follows checks that they say what the array does.
    let f = unsafe { fields_at(array.0, offset) };
    let array = array.0;
    let interface = array.getattr(intern!(py, "__array_interface__")).ok()?;
    let interface = interface.cast::<PyDict>().ok()?;
    let data = interface.get_item("data").ok()??;
    let data = data.cast::<PyTuple>().ok()?;
    let address: usize = data.get_item(0).ok()?.extract().ok()?;
    let readonly: bool = data.get_item(1).ok()?.extract().ok()?;
    let shape: Vec<isize> = interface.get_item("shape").ok()??.extract().ok()?;
    let strides: Vec<isize> = array.getattr(intern!(py, "strides")).ok()?.extract().ok()?;
    let descr = array.getattr(intern!(py, "dtype")).ok()?;
    let nd = usize::try_from(f.nd).ok()?;
    let header_agrees = nd == shape.len()
        && f.data as usize == address
        && (f.flags & NPY_ARRAY_WRITEABLE == 0) == readonly
        && f.descr == descr.as_ptr();
    // SAFETY: the header matches, so these are numpy's fields: its dimensions have `nd`
    // entries while the array lives.
    let agrees = header_agrees
        && unsafe { dlpack_core::abi::c_array(f.dimensions, nd) } == shape.as_slice()
        // SAFETY: the header matches, so these are numpy's fields: its strides have `nd`
        // entries while the array lives.
        && unsafe { dlpack_core::abi::c_array(f.strides, nd) } == strides.as_slice();
    agrees.then_some(FieldsOffset(offset))
}

/// Element types by dtype object, each dtype held alive so its address stays its own.
type DescrCache = AddressMap<(Py<PyAny>, Option<StoredType>)>;
static DESCRS: Mutex<Option<DescrCache>> = Mutex::new(None);
const MAX_CACHED_DESCRS: usize = 256;

/// The last dtype found in `DESCRS`, readable without its lock: the dtype's address and its
/// packed element, published under a sequence number (a seqlock; writers hold `DESCRS`' lock).
/// Only dtypes `DESCRS` holds are published, so an address can't come back as another dtype.
static LAST_SEQ: AtomicU64 = AtomicU64::new(0);
static LAST_DESCR: AtomicUsize = AtomicUsize::new(0);
static LAST_ELEMENT: AtomicU64 = AtomicU64::new(0);

fn pack(element: StoredType) -> u64 {
    let DLDataType { code, bits, lanes } = element.dtype.0;
    1 | u64::from(code) << 8
        | u64::from(bits) << 16
        | u64::from(lanes) << 24
        | u64::from(element.swapped) << 40
}

fn unpack(packed: u64) -> Option<StoredType> {
    (packed & 1 == 1).then_some(StoredType {
        dtype: DType(DLDataType {
            code: (packed >> 8) as u8,
            bits: (packed >> 16) as u8,
            lanes: (packed >> 24) as u16,
        }),
        swapped: (packed >> 40) & 1 == 1,
    })
}

/// The element of the last dtype published, if `key` is its address.
fn last(key: usize) -> Option<Option<StoredType>> {
    let seq = LAST_SEQ.load(Ordering::Acquire);
    if seq & 1 == 1 || LAST_DESCR.load(Ordering::Relaxed) != key {
        return None;
    }
    let packed = LAST_ELEMENT.load(Ordering::Relaxed);
    fence(Ordering::Acquire);
    (LAST_SEQ.load(Ordering::Relaxed) == seq).then(|| unpack(packed))
}

/// Publish a dtype held by `DESCRS` (the caller holds its lock).
fn publish(key: usize, element: Option<StoredType>) {
    LAST_SEQ.fetch_add(1, Ordering::Relaxed);
    fence(Ordering::Release);
    LAST_DESCR.store(key, Ordering::Relaxed);
    LAST_ELEMENT.store(element.map_or(0, pack), Ordering::Relaxed);
    LAST_SEQ.fetch_add(1, Ordering::Release);
}

/// The element type of the array's dtype, if DLPack has it.
fn element(fields: Fields<'_, '_>) -> Option<StoredType> {
    let (array, descr) = (fields.array, fields.fields.descr);
    let key = descr as usize;
    if let Some(element) = last(key) {
        return element;
    }
    if let Ok(cache) = DESCRS.lock()
        && let Some((_, element)) = cache.as_ref().and_then(|c| c.get(&key))
    {
        publish(key, *element);
        return *element;
    }
    let py = array.py();
    // SAFETY: `descr` is the live array's dtype, borrowed while the array is.
    let descr = unsafe { Bound::from_borrowed_ptr(py, descr) };
    let element = descr
        .getattr(intern!(py, "str"))
        .ok()
        .and_then(|s| s.extract::<String>().ok())
        .and_then(|typestr| resolve_dtype(array, &typestr).ok());
    if let Ok(mut cache) = DESCRS.lock() {
        let cache = cache.get_or_insert_with(AddressMap::default);
        if cache.len() < MAX_CACHED_DESCRS {
            cache.insert(key, (descr.unbind(), element));
            publish(key, element);
        }
    }
    element
}

/// Describe an exact ndarray from its struct; `None` sends it down the general path.
pub fn import(array: ExactNdarray<'_, '_>) -> Result<Option<Tensor>> {
    let Some(offset) = *FIELDS_OFFSET.get_or_init(array.py(), || self_check(array)) else {
        return Ok(None);
    };
    let fields = array.fields(offset);
    let Some(element) = element(fields) else {
        return Ok(None);
    };
    describe(fields, element)
}

/// `import` for an exact ndarray when everything it needs is already known: the struct was
/// checked and the dtype is the last one seen. Runs no Python code, so it may run outside
/// PyO3's entry points; `None` means "ask `import`", which also gives any error.
///
/// The tensor is written into `dst` (uninitialised memory, left so when this returns false):
/// built on the stack and moved, the description cost more in copying than in reading.
///
/// # Safety
/// `dst` is valid for writes of a `Tensor`.
#[inline(always)]
pub unsafe fn import_known_into(array: ExactNdarray<'_, '_>, dst: *mut Tensor) -> bool {
    let Some(&Some(offset)) = FIELDS_OFFSET.get(array.py()) else {
        return false;
    };
    let fields = array.fields(offset);
    let Some(Some(element)) = last(fields.fields.descr as usize) else {
        return false;
    };
    // SAFETY: `dst` is valid for writes of a `Tensor` (this function's contract), as
    // `describe_into` asks.
    matches!(unsafe { describe_into(fields, element, dst) }, Ok(true))
}

fn describe(fields: Fields<'_, '_>, element: StoredType) -> Result<Option<Tensor>> {
    let mut tensor = std::mem::MaybeUninit::<Tensor>::uninit();
    // SAFETY: `tensor` is valid for writes.
    let written = unsafe { describe_into(fields, element, tensor.as_mut_ptr())? };
    // SAFETY: `describe_into` initialised the tensor when it says it wrote it.
    Ok(written.then(|| unsafe { tensor.assume_init() }))
}

/// Describe the array into `dst`: `Ok(true)` when written, `Ok(false)` for the general path
/// (`dst` untouched), or what is wrong with the array.
///
/// # Safety
/// `dst` is valid for writes of a `Tensor`.
#[inline(always)]
unsafe fn describe_into(
    Fields { array, fields: f }: Fields<'_, '_>,
    StoredType { dtype, swapped }: StoredType,
    dst: *mut Tensor,
) -> Result<bool> {
    let Ok(ndim) = usize::try_from(f.nd) else {
        return Ok(false);
    };
    // SAFETY: `f` is a live ndarray's fields (`Fields` holds the array): its dimensions have
    // `nd` entries while it lives.
    let shape = unsafe { dlpack_core::abi::c_array(f.dimensions, ndim) };
    // SAFETY: `f` is a live ndarray's fields (`Fields` holds the array): its strides have `nd`
    // entries while it lives.
    let strides = unsafe { dlpack_core::abi::c_array(f.strides, ndim) };
    let strides = Some(|k: usize| Ok(strides[k] as i64));
    // The layout is built in place too (see `Layout::build_into`); every other field is written
    // once it can't fail any more (`Tensor::complete_in_place`), so `dst` is either whole or
    // untouched.
    // SAFETY: per the contract, `dst` is valid for writes of a `Tensor`.
    let layout = unsafe { Tensor::layout_place(dst) };
    // SAFETY: `layout` is `dst`'s, memory we may write; on failure the layout is left unwritten
    // (or dropped again).
    unsafe { Layout::build_into(layout, ndim, dtype.itemsize(), |k| shape[k] as i64, strides)? };
    // SAFETY: built just above.
    if let Err(err) = Tensor::check_data(f.data, unsafe { &*layout }) {
        // SAFETY: built just above, and dropped once: the tensor is not completed.
        unsafe { std::ptr::drop_in_place(layout) };
        return Err(err);
    }
    let storage = Storage {
        data: f.data,
        device: Device::CPU,
        dtype,
        readonly: f.flags & NPY_ARRAY_WRITEABLE == 0,
        swapped,
        indirect: false,
        stream: None,
    };
    // SAFETY: `dst` is valid for writes (the contract) and holds the layout just built, no other
    // part. The memory invariant is numpy's word, which nothing can check: an array's data,
    // dimensions and strides address its elements (of the dtype `element` was read from, in the
    // byte order it says) in host memory while the array, the owner here, lives; writable when
    // its WRITEABLE flag is set.
    unsafe { Tensor::complete_in_place(dst, storage, Owner::object(array.clone().unbind())) };
    Ok(true)
}
