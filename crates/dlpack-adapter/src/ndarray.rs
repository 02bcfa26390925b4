//! `ndarray` views of a tensor's elements (the `ndarray` feature): ndarray takes non-negative
//! strides from the lowest address, so reversed axes are built forwards and flipped back.

use dlpack_core::layout::Layout;
use ndarray::{ArrayBase, Axis, IxDyn, RawData, ShapeBuilder, StrideShape};
use pyo3::PyResult;
use pyo3::exceptions::PyBufferError;

/// The axes of a layout that run backwards in memory, to flip back once built forwards.
pub(super) struct Reversed(Vec<usize>);

impl Reversed {
    /// Flip back the axes that run backwards in memory.
    pub fn restore<S: RawData>(&self, array: &mut ArrayBase<S, IxDyn>) {
        for &axis in &self.0 {
            array.invert_axis(Axis(axis));
        }
    }
}

/// The address of the element at the lowest address (from `first`, the first element's), the
/// layout from there (strides in whole elements, none negative) and the axes it reverses; a
/// `BufferError` for byte strides that are not whole elements.
pub(super) fn lowest_first<T>(
    layout: &Layout,
    first: *mut T,
) -> PyResult<(*mut T, StrideShape<IxDyn>, Reversed)> {
    let Some(strides) = layout.strides() else {
        return Err(PyBufferError::new_err(
            "this array's byte strides are not whole elements, so ndarray can't view it; \
             to_vec() copies it",
        ));
    };
    let shape = layout.shape();
    let empty = shape.contains(&0);
    let mut ptr = first;
    let mut forwards = Vec::with_capacity(strides.len());
    let mut reversed = Vec::new();
    for (axis, (&n, &stride)) in shape.iter().zip(strides).enumerate() {
        if stride < 0 && !empty {
            // Along this axis, the last element lies lowest.
            ptr = ptr.wrapping_offset((stride * (n - 1)) as isize);
            reversed.push(axis);
        }
        forwards.push(stride.unsigned_abs() as usize);
    }
    let extents: Vec<usize> = shape.iter().map(|&n| n as usize).collect();
    let shape = IxDyn(&extents).strides(IxDyn(&forwards));
    Ok((ptr, shape, Reversed(reversed)))
}
