//! `view` and `view_mut`: any array Python hands over, read (or written) from Rust in place.

use std::ptr::NonNull;

use dlpack_core::abi::DLDevice;
use dlpack_core::dtype::DType;
use pyo3::prelude::*;

use super::borrows::Borrow;
use super::element::Element;
use crate::copy::host;
use crate::error::{Error, Result};
use crate::import;
use crate::object::tensor_of;
use crate::tensor::Tensor;
use dlpack_core::layout::{SelfOverlap, self_overlap};

/// A read-only view of an array's memory, from any object `asdlpack` accepts, without a copy.
/// It keeps the source alive and holds its memory as borrowed (see the crate's safety model)
/// until dropped.
pub struct ArrayView<'py> {
    held: Held,
    // Tied to the interpreter's lock: the source's Python references are released with it, and
    // copies release it while they run.
    py: Python<'py>,
}

/// What a view holds, free of the interpreter's lifetime (the C API hands it out boxed): the
/// source that keeps the memory alive, and the memory's borrow. Dropped with the GIL held.
pub(crate) struct Held {
    source: Source,
    _borrow: Option<Borrow>,
    exclusive: bool,
}

/// A view that may also write: only of writable host memory, and only while no other view of
/// this crate holds any of that memory. Reads as an `ArrayView` does (it derefs to one).
pub struct ArrayViewMut<'py> {
    view: ArrayView<'py>,
}

enum Source {
    /// A `DLPackObject`: its own tensor, read in place.
    Object(Py<PyAny>),
    Imported(Tensor),
}

/// A view of `obj`'s memory: numpy, torch, JAX, CuPy, bytes, array.array, a `DLPackObject`,
/// anything `dlpack.asdlpack` accepts. Errors as `asdlpack` raises them (a `TypeError` for an
/// object that supports no protocol, the producer's own error for memory it won't export);
/// a `BufferError` if a mutable view holds some of the memory.
pub fn view<'py>(obj: &Bound<'py, PyAny>) -> PyResult<ArrayView<'py>> {
    Ok(ArrayView {
        held: Held::new(obj, false)?,
        py: obj.py(),
    })
}

/// A mutable view of `obj`'s memory, which must be writable host memory that no other view of
/// this crate holds: a `BufferError` otherwise (read-only memory, an immutable JAX array,
/// device memory, memory another view holds).
pub fn view_mut<'py>(obj: &Bound<'py, PyAny>) -> PyResult<ArrayViewMut<'py>> {
    let view = ArrayView {
        held: Held::new(obj, true)?,
        py: obj.py(),
    };
    Ok(ArrayViewMut { view })
}

impl Held {
    /// `obj`'s memory, held shared, or `exclusive`ly (writable host memory only).
    pub(crate) fn new(obj: &Bound<'_, PyAny>, exclusive: bool) -> Result<Self> {
        let source = if tensor_of(obj).is_some() {
            Source::Object(obj.clone().unbind())
        } else {
            Source::Imported(import::import_in_place(obj)?.tensor)
        };
        let mut view = Held {
            source,
            _borrow: None,
            exclusive,
        };
        let tensor = view.tensor(obj.py());
        if exclusive {
            host_memory(tensor)?;
            if tensor.readonly() || import::is_immutable(obj) {
                return Err(Error::buffer(
                    "this array's memory is read-only, so it can't be viewed mutably; \
                     view() reads it, or copy it first",
                ));
            }
            if tensor.indirect() {
                return Err(not_direct());
            }
        }
        // Only host memory is read in place by Rust, so only host memory is held.
        if host_memory(tensor).is_ok() && !tensor.indirect() {
            let (low, high) = tensor.layout().byte_extent(tensor.dtype().itemsize())?;
            let start = (tensor.data() as usize).wrapping_add_signed(low as isize);
            let end = (tensor.data() as usize).wrapping_add_signed(high as isize);
            view._borrow = Borrow::take(start, end, exclusive)?;
        }
        Ok(view)
    }

    /// The memory held, as described when the view was made (a `DLPackObject`'s tensor never
    /// changes).
    pub(crate) fn tensor<'a>(&'a self, py: Python<'a>) -> &'a Tensor {
        match &self.source {
            Source::Object(object) => {
                tensor_of(object.bind(py)).expect("a DLPackObject when the view was made, and still")
            }
            Source::Imported(tensor) => tensor,
        }
    }

    /// Whether the memory is held exclusively (a mutable view).
    pub(crate) fn exclusive(&self) -> bool {
        self.exclusive
    }
}

impl<'py> ArrayView<'py> {
    fn tensor(&self) -> &Tensor {
        self.held.tensor(self.py)
    }

    /// Extents, one per dimension.
    pub fn shape(&self) -> &[i64] {
        self.tensor().layout().shape()
    }

    /// Strides in bytes, one per dimension (negative where the memory runs backwards).
    pub fn byte_strides(&self) -> &[i64] {
        self.tensor().layout().byte_strides()
    }

    pub fn ndim(&self) -> usize {
        self.tensor().layout().ndim()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.tensor().numel() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type (`dtype().name()`: "float32", "bfloat16", ...).
    pub fn dtype(&self) -> DType {
        self.tensor().dtype()
    }

    /// Where the memory is; a `BufferError` for CUDA memory whose device could not be found
    /// (no driver here).
    pub fn device(&self) -> PyResult<DLDevice> {
        Ok(self.tensor().device().get()?)
    }

    pub fn is_readonly(&self) -> bool {
        self.tensor().readonly()
    }

    /// Whether the elements lie densely in C (row-major) order.
    pub fn is_c_contiguous(&self) -> bool {
        self.tensor().layout().is_c_contiguous()
    }

    /// Address of the first element (for handing to C; Rust reads through `as_slice`).
    pub fn data_ptr(&self) -> *const u8 {
        self.tensor().data().cast()
    }

    /// The elements as a slice: C-contiguous host memory of `T`'s type, in native byte order
    /// and aligned for `T`; a `TypeError` for another element type, a `BufferError` for other
    /// memory (`to_vec` and `copy_to_slice` read any host layout).
    pub fn as_slice<T: Element>(&self) -> PyResult<&[T]> {
        let tensor = self.tensor();
        check_type::<T>(tensor)?;
        in_place::<T>(tensor)?;
        if !tensor.layout().is_c_contiguous() {
            return Err(Error::buffer(format!(
                "this array is not C-contiguous (shape {:?}, byte strides {:?}), so it is no \
                 slice; to_vec() or copy_to_slice() copy any layout into C order",
                tensor.layout().shape(),
                tensor.layout().byte_strides()
            ))
            .into());
        }
        let len = self.len();
        let data = element_ptr::<T>(tensor);
        // SAFETY: `data` addresses `len` elements of `T`'s type, densely, in host memory
        // (checked above) that the source keeps alive while `self` lives, aligned for `T`; no
        // mutable view of this crate holds it (`Borrow`).
        let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len * size_of::<T>()) };
        check_valid::<T>(bytes)?;
        // SAFETY: as above; and every element is a valid `T` (`check_valid`).
        Ok(unsafe { std::slice::from_raw_parts(data, len) })
    }

    /// A C-ordered copy of the elements, from host memory of any layout or byte order; a
    /// `TypeError` for another element type, a `BufferError` for device memory.
    pub fn to_vec<T: Element>(&self) -> PyResult<Vec<T>> {
        let tensor = self.tensor();
        check_type::<T>(tensor)?;
        host_memory(tensor)?;
        let len = self.len();
        dlpack_core::available::check((len * size_of::<T>()) as u64, "memory")
            .map_err(Error::Core)?;
        let mut out = Vec::<T>::with_capacity(len);
        // SAFETY: the spare capacity holds `len` elements, ours alone.
        unsafe { write_c_order(self.py, tensor, out.as_mut_ptr(), len)? };
        // SAFETY: `write_c_order` wrote all `len` elements, each a valid `T` (it checked).
        unsafe { out.set_len(len) };
        Ok(out)
    }

    /// Copy the elements, in C order, into `dst`, which has exactly as many; as `to_vec`.
    pub fn copy_to_slice<T: Element>(&self, dst: &mut [T]) -> PyResult<()> {
        let tensor = self.tensor();
        check_type::<T>(tensor)?;
        host_memory(tensor)?;
        check_len(dst.len(), self.len())?;
        if T::CHECKED {
            // Checked before anything reaches `dst`, which must only ever hold valid `T`s.
            dst.copy_from_slice(&self.to_vec::<T>()?);
            return Ok(());
        }
        // SAFETY: `dst` holds `len` elements, borrowed mutably, so no one else's.
        unsafe { write_c_order(self.py, tensor, dst.as_mut_ptr(), dst.len()) }?;
        Ok(())
    }

    /// The elements as an `ndarray` view: host memory of `T`'s type in native byte order,
    /// strides in whole elements (any sign), aligned for `T`.
    #[cfg(feature = "ndarray")]
    pub fn as_array<T: Element>(&self) -> PyResult<ndarray::ArrayViewD<'_, T>> {
        let tensor = self.tensor();
        check_type::<T>(tensor)?;
        in_place::<T>(tensor)?;
        if T::CHECKED {
            self.to_vec::<T>()?; // reads, and so checks, every element
        }
        let (ptr, shape, reversed) =
            super::ndarray::lowest_first::<T>(tensor, element_ptr::<T>(tensor))?;
        // SAFETY: `ptr` and `shape` address the tensor's elements of `T`'s type (aligned, every
        // one valid: checked above) in host memory the source keeps alive while `self` lives,
        // strides non-negative; no mutable view of this crate holds it (`Borrow`).
        let mut array = unsafe { ndarray::ArrayViewD::from_shape_ptr(shape, ptr) };
        reversed.restore(&mut array);
        Ok(array)
    }
}

impl<'py> std::ops::Deref for ArrayViewMut<'py> {
    type Target = ArrayView<'py>;
    fn deref(&self) -> &ArrayView<'py> {
        &self.view
    }
}

impl ArrayViewMut<'_> {
    /// The elements as a mutable slice (as `as_slice` asks of the memory).
    pub fn as_slice_mut<T: Element>(&mut self) -> PyResult<&mut [T]> {
        let data = self.view.as_slice::<T>()?.as_ptr().cast_mut();
        let len = self.view.len();
        // SAFETY: `as_slice` vouched for `len` valid, aligned elements of `T` at `data`, in
        // writable host memory (`view_mut` checked) that this view alone holds (`Borrow`,
        // exclusive), and `&mut self` ends the shared slice's borrow.
        Ok(unsafe { std::slice::from_raw_parts_mut(data, len) })
    }

    /// Write `src`, in C order, into the elements wherever the layout puts them (any layout,
    /// in the memory's byte order); `src` has exactly as many elements.
    pub fn copy_from_slice<T: Element>(&mut self, src: &[T]) -> PyResult<()> {
        let tensor = self.view.tensor();
        check_type::<T>(tensor)?;
        check_len(src.len(), self.view.len())?;
        check_disjoint(tensor)?;
        // SAFETY: `src` holds the tensor's element count of `T`'s type; the tensor's memory is
        // writable, direct host memory (`view_mut` checked) that this view alone holds, so it
        // shares no bytes with `src` (a Rust slice, not one of this memory while it is held
        // here), and no two of its elements share bytes (checked above).
        unsafe { host::read_c_order(self.view.py, tensor, src.as_ptr().cast(), size_of_val(src)) }?;
        Ok(())
    }

    /// The elements as a mutable `ndarray` view (as `as_array` asks of the memory, and no two
    /// elements in the same bytes).
    #[cfg(feature = "ndarray")]
    pub fn as_array_mut<T: Element>(&mut self) -> PyResult<ndarray::ArrayViewMutD<'_, T>> {
        let tensor = self.view.tensor();
        check_disjoint(tensor)?;
        // Checks the type, the memory and (for `bool`) every element.
        self.view.as_array::<T>()?;
        let (ptr, shape, reversed) =
            super::ndarray::lowest_first::<T>(tensor, element_ptr::<T>(tensor))?;
        // SAFETY: as `as_array` vouched, plus: writable memory (`view_mut` checked) this view
        // alone holds (`Borrow`, exclusive; `&mut self` for the result's life), no two elements
        // sharing bytes (checked above).
        let mut array = unsafe { ndarray::ArrayViewMutD::from_shape_ptr(shape, ptr) };
        reversed.restore(&mut array);
        Ok(array)
    }
}

// -- what each access checks ------------------------------------------------------------------

/// A `TypeError` unless the elements are of `T`'s type.
fn check_type<T: Element>(tensor: &Tensor) -> Result<()> {
    if tensor.dtype() != T::DTYPE {
        return Err(Error::type_(format!(
            "this array holds {}, not {} (the element type asked for)",
            tensor.dtype().name(),
            T::DTYPE.name()
        )));
    }
    Ok(())
}

/// A `BufferError` unless the CPU reads the memory directly (the CPU's, or pinned host memory).
fn host_memory(tensor: &Tensor) -> Result<()> {
    let device = tensor.device().get()?;
    if !device.is_host() {
        return Err(Error::buffer(format!(
            "this array's memory is on {}, which Rust can't read in place; copy it to the host              first (e.g. .cpu() in torch, jax.device_get, .get() in CuPy)",
            device.name()
        )));
    }
    Ok(())
}

#[cold]
fn not_direct() -> Error {
    Error::buffer(
        "this buffer reaches its rows through pointers (suboffsets), so it can't be read in          place; to_vec() copies it",
    )
}

/// A `BufferError` unless `T`s can be read where they are: direct host memory, native byte
/// order, aligned for `T`.
fn in_place<T: Element>(tensor: &Tensor) -> Result<()> {
    host_memory(tensor)?;
    if tensor.indirect() {
        return Err(not_direct());
    }
    if tensor.swapped() {
        return Err(Error::buffer(
            "this array's elements are in non-native byte order; to_vec() copies them in native              order",
        ));
    }
    let aligned = |address: i64| address.rem_euclid(align_of::<T>() as i64) == 0;
    if !aligned(tensor.data() as i64) || !tensor.layout().byte_strides().iter().all(|&s| aligned(s))
    {
        return Err(Error::buffer(format!(
            "this array's elements are not aligned for {} in memory; to_vec() copies them",
            T::DTYPE.name()
        )));
    }
    Ok(())
}

/// The address of the first element, never null (an empty array's may be).
fn element_ptr<T>(tensor: &Tensor) -> *mut T {
    NonNull::new(tensor.data().cast::<T>())
        .unwrap_or(NonNull::dangling())
        .as_ptr()
}

/// A `ValueError` unless `bytes` (whole elements) are all valid `T`s.
fn check_valid<T: Element>(bytes: &[u8]) -> Result<()> {
    if T::CHECKED && !T::valid(bytes) {
        return Err(Error::value(format!(
            "this array holds bytes that are no valid {} (a bool is 0 or 1)",
            T::DTYPE.name()
        )));
    }
    Ok(())
}

fn check_len(given: usize, elements: usize) -> Result<()> {
    if given != elements {
        return Err(Error::value(format!(
            "the array has {elements} elements, the slice {given}"
        )));
    }
    Ok(())
}

/// A `BufferError` if two of the elements lie in the same bytes (a broadcast view), which no
/// write can serve faithfully.
pub(super) fn check_disjoint(tensor: &Tensor) -> Result<()> {
    let layout = tensor.layout();
    let dims = layout.shape().iter().zip(layout.byte_strides());
    let overlap = self_overlap(
        dims.map(|(&n, &s)| (n as u64, s)),
        tensor.dtype().itemsize() as u64,
    );
    if overlap != SelfOverlap::Disjoint {
        return Err(Error::buffer(
            "elements of this array share memory (a broadcast view), so it can't be written              element by element",
        ));
    }
    Ok(())
}

/// Write the tensor's elements, C-ordered in native byte order, to `len` `T`s at `dst`, and
/// check they are valid `T`s.
///
/// # Safety
/// `dst` is writable memory for `len` `T`s, which no one else reads or writes during the call
/// and which shares no bytes with the tensor's; `len` is the tensor's element count and `T` its
/// element type.
unsafe fn write_c_order<T: Element>(
    py: Python<'_>,
    tensor: &Tensor,
    dst: *mut T,
    len: usize,
) -> Result<()> {
    let nbytes = len * size_of::<T>();
    // SAFETY: per the contract.
    unsafe { host::write_c_order(py, tensor, dst.cast(), nbytes)? };
    // SAFETY: just written, whole.
    let bytes = unsafe { std::slice::from_raw_parts(dst.cast::<u8>(), nbytes) };
    check_valid::<T>(bytes)
}
