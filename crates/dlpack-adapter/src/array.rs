//! `view` and `view_mut`: any array Python hands over, read (or written) from Rust in place,
//! through the runtime's C API (its importers, its one registry of borrowed memory).

use std::mem::MaybeUninit;
use std::ptr::NonNull;

use dlpack_core::abi::DLDevice;
use dlpack_core::dtype::DType;
#[cfg(feature = "ndarray")]
use dlpack_core::layout::Layout;
use dlpack_core::layout::{SelfOverlap, self_overlap};
use pyo3::exceptions::{PyBufferError, PyMemoryError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::capi::{
    self, DLPACK_ADAPTER_VIEW_C_CONTIGUOUS, DLPACK_ADAPTER_VIEW_INDIRECT,
    DLPACK_ADAPTER_VIEW_MUTABLE, DLPACK_ADAPTER_VIEW_READONLY, DLPACK_ADAPTER_VIEW_SWAPPED,
    DLPackAdapterAPI, DLPackAdapterView,
};
use crate::element::Element;

/// A read-only view of an array's memory, from any object `asdlpack` accepts, without a copy.
/// It keeps the source alive and holds its memory as borrowed, in the process's one registry
/// (see the crate's safety model), until dropped.
pub struct ArrayView<'py> {
    view: DLPackAdapterView,
    numel: usize,
    api: &'static DLPackAdapterAPI,
    py: Python<'py>,
}

/// A view that may also write: only of writable host memory, and only while no other view
/// (in any extension) holds any of that memory. Reads as an `ArrayView` does (it derefs to one).
pub struct ArrayViewMut<'py> {
    view: ArrayView<'py>,
}

/// A view of `obj`'s memory: numpy, torch, JAX, CuPy, bytes, array.array, a `DLPackObject`,
/// anything `dlpack.asdlpack` accepts. Errors as `asdlpack` raises them (a `TypeError` for an
/// object that supports no protocol, the producer's own error for memory it won't export);
/// a `BufferError` if a mutable view holds some of the memory.
pub fn view<'py>(obj: &Bound<'py, PyAny>) -> PyResult<ArrayView<'py>> {
    ArrayView::new(obj, 0)
}

/// A mutable view of `obj`'s memory, which must be writable host memory of `obj`'s own that no
/// other view holds: a `BufferError` otherwise (read-only memory, an immutable JAX array, device
/// memory, memory an import had to copy so that writes would never reach `obj` (a chunked Arrow
/// array, a table or data frame, Arrow booleans: the error says why, as `copy_reason` does),
/// memory another view holds, in this extension or any other).
pub fn view_mut<'py>(obj: &Bound<'py, PyAny>) -> PyResult<ArrayViewMut<'py>> {
    Ok(ArrayViewMut {
        view: ArrayView::new(obj, DLPACK_ADAPTER_VIEW_MUTABLE)?,
    })
}

impl Drop for ArrayView<'_> {
    fn drop(&mut self) {
        // SAFETY: a view the runtime filled, given back once; `py` says the GIL is held.
        unsafe { (self.api.release_view)(&mut self.view) };
    }
}

impl<'py> ArrayView<'py> {
    fn new(obj: &Bound<'py, PyAny>, flags: u32) -> PyResult<Self> {
        let py = obj.py();
        let api = capi::api(py)?;
        // Only the size is set beforehand: the runtime, of this crate's feature level or later
        // (`capi::api` checked), fills every field of this crate's declaration.
        let mut filled = MaybeUninit::<DLPackAdapterView>::uninit();
        let size = filled.as_mut_ptr().cast::<u32>();
        // SAFETY: `size` is the first field of the view `filled` has room for.
        unsafe { size.write(size_of::<DLPackAdapterView>() as u32) };
        // SAFETY: the GIL is held (`obj` is bound); `obj` is a live object; `filled` is a
        // writable view whose size says its declared size.
        let status = unsafe { (api.view)(obj.as_ptr(), flags, filled.as_mut_ptr()) };
        if status != 0 {
            return Err(PyErr::fetch(py));
        }
        // SAFETY: the runtime filled it (status 0): every field of a view of the size it was
        // given, a runtime of this crate's level or later knowing them all.
        let view = unsafe { filled.assume_init() };
        let mut made = ArrayView {
            view,
            numel: 0,
            api,
            py,
        };
        made.numel = element_count(made.shape())?;
        Ok(made)
    }

    /// `ndim` values at `ptr`: the view's shape or strides.
    fn dims(&self, ptr: *const i64) -> &[i64] {
        if self.view.ndim <= 0 {
            return &[];
        }
        // SAFETY: a filled view's shape and strides hold `ndim` values each, valid until it is
        // released (when `self` drops).
        unsafe { std::slice::from_raw_parts(ptr, self.view.ndim as usize) }
    }

    /// The view's layout, for `ndarray`'s strides in elements.
    #[cfg(feature = "ndarray")]
    fn layout(&self) -> PyResult<Layout> {
        Layout::from_byte_strides(
            self.shape(),
            Some(self.byte_strides()),
            self.dtype().itemsize(),
        )
        // A layout the runtime described is one it checked; the error is kept anyway.
        .map_err(|e| PyValueError::new_err(format!("{e:?}")))
    }

    /// Extents, one per dimension.
    pub fn shape(&self) -> &[i64] {
        self.dims(self.view.shape)
    }

    /// Strides in bytes, one per dimension (negative where the memory runs backwards).
    pub fn byte_strides(&self) -> &[i64] {
        self.dims(self.view.byte_strides)
    }

    pub fn ndim(&self) -> usize {
        self.shape().len()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.numel
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type (`dtype().name()`: "float32", "bfloat16", ...).
    pub fn dtype(&self) -> DType {
        DType(self.view.dtype)
    }

    /// Where the memory is (`DLDevice::CPU` for host memory).
    pub fn device(&self) -> PyResult<DLDevice> {
        Ok(self.view.device)
    }

    pub fn is_readonly(&self) -> bool {
        self.view.flags & DLPACK_ADAPTER_VIEW_READONLY != 0
    }

    /// C-contiguous (extents of 1 may have any stride).
    pub fn is_c_contiguous(&self) -> bool {
        self.view.flags & DLPACK_ADAPTER_VIEW_C_CONTIGUOUS != 0
    }

    /// The address of the first element (device memory is described, never read).
    pub fn data_ptr(&self) -> *const u8 {
        self.view.data.cast()
    }

    /// The elements in place: C-contiguous host memory of `T`'s type, in native byte order and
    /// aligned for `T`; a `TypeError` or `BufferError` saying which it isn't otherwise.
    #[inline]
    pub fn as_slice<T: Element>(&self) -> PyResult<&[T]> {
        // The common case at once; the checks one by one only to say what is wrong. A slice
        // reads `len` elements from `data` on, so an aligned `data` is all the alignment needed.
        let layout_bits = DLPACK_ADAPTER_VIEW_C_CONTIGUOUS
            | DLPACK_ADAPTER_VIEW_SWAPPED
            | DLPACK_ADAPTER_VIEW_INDIRECT;
        let direct = self.view.flags & layout_bits == DLPACK_ADAPTER_VIEW_C_CONTIGUOUS
            && self.dtype() == T::DTYPE
            && self.view.device.is_host()
            && self.view.data.cast::<T>().is_aligned();
        if !direct {
            self.slice_refused::<T>()?;
        }
        let data = self.element_ptr::<T>();
        // SAFETY: `len` aligned elements of `T`'s type, contiguous, in host memory this view
        // keeps alive and holds borrowed (no mutable view aliases it) for `&self`'s life.
        let slice = unsafe { std::slice::from_raw_parts(data, self.len()) };
        // SAFETY: the memory `slice` covers, read as bytes, borrowed for as long as it is.
        let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), size_of_val(slice)) };
        check_valid::<T>(bytes)?;
        Ok(slice)
    }

    /// What keeps `as_slice` from reading the elements in place, checked one by one.
    fn slice_refused<T: Element>(&self) -> PyResult<()> {
        self.check_type::<T>()?;
        self.in_place::<T>()?;
        if !self.is_c_contiguous() {
            return Err(PyBufferError::new_err(format!(
                "this array is not C-contiguous (shape {:?}, byte strides {:?}); to_vec() \
                 copies it in C order",
                self.shape(),
                self.byte_strides()
            )));
        }
        Ok(())
    }

    /// The elements in C order, native byte order, as a new `Vec` (one copy): host memory of
    /// `T`'s type in any layout.
    pub fn to_vec<T: Element>(&self) -> PyResult<Vec<T>> {
        self.check_type::<T>()?;
        self.host_memory()?;
        let len = self.len();
        // A MemoryError before allocating what this process can't have (a broadcast view may
        // describe more than exists, even more bytes than a usize counts).
        let nbytes = self.nbytes_of::<T>(len)?;
        // SAFETY: the GIL is held.
        if unsafe { (self.api.check_memory)(nbytes as u64) } != 0 {
            return Err(PyErr::fetch(self.py));
        }
        let mut out = Vec::<T>::new();
        out.try_reserve_exact(len).map_err(|err| {
            PyMemoryError::new_err(format!("can't allocate {nbytes} bytes for a copy: {err}"))
        })?;
        self.copy_out(out.as_mut_ptr(), len)?;
        // SAFETY: `copy_out` wrote all `len` elements, checked valid.
        unsafe { out.set_len(len) };
        Ok(out)
    }

    /// `to_vec` into `dst`, which must hold exactly `len()` elements.
    pub fn copy_to_slice<T: Element>(&self, dst: &mut [T]) -> PyResult<()> {
        self.check_type::<T>()?;
        self.host_memory()?;
        check_len(dst.len(), self.len())?;
        if T::CHECKED {
            // Checked before anything reaches `dst`, which must only ever hold valid `T`s.
            dst.copy_from_slice(&self.to_vec::<T>()?);
            return Ok(());
        }
        self.copy_out(dst.as_mut_ptr(), dst.len())
    }

    /// An `ndarray` view of the elements in place (feature `ndarray`): host memory of `T`'s type,
    /// native byte order, strides in whole elements of any sign.
    #[cfg(feature = "ndarray")]
    pub fn as_array<T: Element>(&self) -> PyResult<::ndarray::ArrayViewD<'_, T>> {
        self.check_type::<T>()?;
        self.in_place::<T>()?;
        let (ptr, shape, reversed) =
            crate::ndarray::lowest_first::<T>(&self.layout()?, self.element_ptr::<T>())?;
        if T::CHECKED {
            self.to_vec::<T>()?; // reads, and so checks, every element
        }
        // SAFETY: `ptr` and `shape` address the elements of `T`'s type (aligned, native order,
        // host memory this view keeps alive and holds borrowed for `&self`'s life), checked valid.
        let mut array = unsafe { ::ndarray::ArrayViewD::from_shape_ptr(shape, ptr) };
        reversed.restore(&mut array);
        Ok(array)
    }

    /// Write the elements, C-ordered in native byte order, to `len` `T`s at `dst`, and check
    /// they are valid `T`s (`len` is the element count; `dst` writable, apart from the view).
    fn copy_out<T: Element>(&self, dst: *mut T, len: usize) -> PyResult<()> {
        let nbytes = self.nbytes_of::<T>(len)?;
        // SAFETY: a filled view; `dst` is writable for `nbytes` bytes (the caller's `Vec` or
        // slice of `len` elements, apart from the view's memory); the GIL is held.
        let status = unsafe { (self.api.copy_to)(&self.view, dst.cast(), nbytes) };
        if status != 0 {
            return Err(PyErr::fetch(self.py));
        }
        // SAFETY: just written, whole.
        let bytes = unsafe { std::slice::from_raw_parts(dst.cast::<u8>(), nbytes) };
        check_valid::<T>(bytes)
    }

    /// The bytes of `len` `T`s, or a `MemoryError` naming them where more than a `usize`
    /// counts (past any allocation).
    fn nbytes_of<T>(&self, len: usize) -> PyResult<usize> {
        len.checked_mul(size_of::<T>())
            .filter(|&nbytes| nbytes <= isize::MAX as usize)
            .ok_or_else(|| {
                PyMemoryError::new_err(format!(
                    "can't copy this array: its {len} elements of {} take {} bytes, more than \
                     this process can address",
                    self.dtype().name(),
                    len as u128 * size_of::<T>() as u128
                ))
            })
    }

    /// A `TypeError` unless the elements are of `T`'s type.
    fn check_type<T: Element>(&self) -> PyResult<()> {
        if self.dtype() != T::DTYPE {
            return Err(PyTypeError::new_err(format!(
                "this array holds {}, not {} (the element type asked for)",
                self.dtype().name(),
                T::DTYPE.name()
            )));
        }
        Ok(())
    }

    /// A `BufferError` unless the CPU reads the memory directly (the CPU's, or pinned host
    /// memory).
    fn host_memory(&self) -> PyResult<()> {
        let device = self.view.device;
        if !device.is_host() {
            return Err(PyBufferError::new_err(format!(
                "this array's memory is on {}, which Rust can't read in place; copy it to the \
                 host first (e.g. .cpu() in torch, jax.device_get, .get() in CuPy)",
                device.name()
            )));
        }
        Ok(())
    }

    /// A `BufferError` unless `T`s can be read where they are: direct host memory, native byte
    /// order, aligned for `T`.
    fn in_place<T: Element>(&self) -> PyResult<()> {
        self.host_memory()?;
        if self.view.flags & DLPACK_ADAPTER_VIEW_INDIRECT != 0 {
            return Err(PyBufferError::new_err(
                "this buffer reaches its rows through pointers (suboffsets), so it can't be read \
                 in place; to_vec() copies it",
            ));
        }
        if self.view.flags & DLPACK_ADAPTER_VIEW_SWAPPED != 0 {
            return Err(PyBufferError::new_err(
                "this array's elements are in non-native byte order; to_vec() copies them in \
                 native order",
            ));
        }
        let aligned = |address: i64| address.rem_euclid(align_of::<T>() as i64) == 0;
        if !aligned(self.view.data as i64) || !self.byte_strides().iter().all(|&s| aligned(s)) {
            return Err(PyBufferError::new_err(format!(
                "this array's elements are not aligned for {} in memory; to_vec() copies them",
                T::DTYPE.name()
            )));
        }
        Ok(())
    }

    /// The address of the first element, never null (an empty array's may be).
    fn element_ptr<T>(&self) -> *mut T {
        NonNull::new(self.view.data.cast::<T>())
            .unwrap_or(NonNull::dangling())
            .as_ptr()
    }
}

impl<'py> std::ops::Deref for ArrayViewMut<'py> {
    type Target = ArrayView<'py>;
    fn deref(&self) -> &ArrayView<'py> {
        &self.view
    }
}

impl ArrayViewMut<'_> {
    /// The elements in place, writable: as `as_slice` asks, of memory whose elements share no
    /// bytes.
    pub fn as_slice_mut<T: Element>(&mut self) -> PyResult<&mut [T]> {
        self.view.as_slice::<T>()?;
        self.check_disjoint()?;
        let data = self.view.element_ptr::<T>();
        // SAFETY: `len` aligned elements of `T`'s type, contiguous, in host memory this view
        // keeps alive (`as_slice` checked all that just above), writable (`view_mut`) and held
        // by this view alone (the runtime's registry, exclusive; `&mut self` for the result's
        // life), no two elements sharing bytes (`check_disjoint`).
        Ok(unsafe { std::slice::from_raw_parts_mut(data, self.view.len()) })
    }

    /// Write `src` (C order, exactly `len()` elements) into the memory, whatever its layout.
    pub fn copy_from_slice<T: Element>(&mut self, src: &[T]) -> PyResult<()> {
        self.view.check_type::<T>()?;
        self.view.host_memory()?;
        check_len(src.len(), self.view.len())?;
        // The runtime refuses elements that share bytes (a broadcast view).
        // SAFETY: a filled mutable view; `src` is readable for its own size; the GIL is held.
        let status = unsafe {
            (self.view.api.copy_from)(&self.view.view, src.as_ptr().cast(), size_of_val(src))
        };
        if status != 0 {
            return Err(PyErr::fetch(self.view.py));
        }
        Ok(())
    }

    /// A writable `ndarray` view of the elements in place (feature `ndarray`).
    #[cfg(feature = "ndarray")]
    pub fn as_array_mut<T: Element>(&mut self) -> PyResult<::ndarray::ArrayViewMutD<'_, T>> {
        self.check_disjoint()?;
        self.view.as_array::<T>()?;
        let (ptr, shape, reversed) =
            crate::ndarray::lowest_first::<T>(&self.view.layout()?, self.view.element_ptr::<T>())?;
        // SAFETY: `ptr` and `shape` address the elements of `T`'s type (aligned, native order,
        // host memory this view keeps alive: `as_array` checked it just above), writable
        // (`view_mut`) and held by this view alone (exclusive; `&mut self` for the result's
        // life), no two elements sharing bytes (`check_disjoint`).
        let mut array = unsafe { ::ndarray::ArrayViewMutD::from_shape_ptr(shape, ptr) };
        reversed.restore(&mut array);
        Ok(array)
    }

    /// A `BufferError` if two elements lie in the same bytes (a broadcast view), which no
    /// write can serve faithfully.
    fn check_disjoint(&self) -> PyResult<()> {
        let dims = self.view.shape().iter().zip(self.view.byte_strides());
        let overlap = self_overlap(
            dims.map(|(&n, &s)| (n as u64, s)),
            self.view.dtype().itemsize() as u64,
        );
        if overlap != SelfOverlap::Disjoint {
            return Err(PyBufferError::new_err(
                "elements of this array share memory (a broadcast view), so it can't be written \
                 element by element",
            ));
        }
        Ok(())
    }
}

/// The number of elements of `shape`, counted without wrapping: the count is the runtime's word,
/// read across the C API, and becomes a size.
fn element_count(shape: &[i64]) -> PyResult<usize> {
    if shape.contains(&0) {
        return Ok(0);
    }
    shape
        .iter()
        .try_fold(1usize, |n, &k| n.checked_mul(usize::try_from(k).ok()?))
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "shape {shape:?} counts more elements than a usize holds"
            ))
        })
}

/// A `ValueError` unless `bytes` (whole elements) are all valid `T`s.
fn check_valid<T: Element>(bytes: &[u8]) -> PyResult<()> {
    if T::CHECKED && !T::valid(bytes) {
        return Err(PyValueError::new_err(format!(
            "this array holds bytes that are no valid {} (a bool is 0 or 1)",
            T::DTYPE.name()
        )));
    }
    Ok(())
}

fn check_len(given: usize, elements: usize) -> PyResult<()> {
    if given != elements {
        return Err(PyValueError::new_err(format!(
            "the array has {elements} elements, the slice {given}"
        )));
    }
    Ok(())
}
