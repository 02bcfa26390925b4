//! CPU strided copy into a fresh C-ordered buffer.

use std::alloc::{self, Layout as AllocLayout};
use std::ffi::c_void;
use std::ptr::NonNull;

use crate::error::{Error, Result};
use crate::tensor::layout::{Layout, c_strides};
use crate::tensor::{Device, Owner, Tensor};

/// Alignment of buffers we allocate: a cache line, and what SIMD loads like best.
pub const ALIGNMENT: usize = 64;

/// Memory we allocated; freed on drop.
pub struct AlignedBuffer {
    ptr: NonNull<u8>,
    layout: AllocLayout,
}

// SAFETY: the buffer is plain bytes owned by this value alone.
unsafe impl Send for AlignedBuffer {}
// SAFETY: shared access only hands out the address.
unsafe impl Sync for AlignedBuffer {}

impl AlignedBuffer {
    pub fn new(bytes: usize) -> Result<Self> {
        let layout = AllocLayout::from_size_align(bytes.max(1), ALIGNMENT)
            .map_err(|_| Error::value(format!("can't allocate {bytes} bytes")))?;
        // SAFETY: the layout has non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc(layout) })
            .ok_or_else(|| Error::Runtime(format!("out of memory allocating {bytes} bytes")))?;
        Ok(AlignedBuffer { ptr, layout })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Copy elements of `itemsize` bytes from a strided source to a strided destination.
///
/// # Safety
/// Every element address `base + sum(i_k * stride_k)` (strides in bytes) for indices within
/// `shape` must be valid for reads (source) or writes (destination), and the two must not overlap.
pub unsafe fn strided_copy(
    src: *const u8,
    src_strides: &[isize],
    dst: *mut u8,
    dst_strides: &[isize],
    shape: &[usize],
    itemsize: usize,
) {
    if shape.contains(&0) {
        return;
    }
    match shape.len() {
        // SAFETY: one element, valid per the contract.
        0 => unsafe { std::ptr::copy_nonoverlapping(src, dst, itemsize) },
        1 => {
            let (n, s, d) = (shape[0], src_strides[0], dst_strides[0]);
            if s == itemsize as isize && d == itemsize as isize {
                // SAFETY: a dense run of n elements on both sides.
                unsafe { std::ptr::copy_nonoverlapping(src, dst, n * itemsize) };
            } else {
                for i in 0..n as isize {
                    // SAFETY: element i of both sides, valid per the contract.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            src.offset(i * s),
                            dst.offset(i * d),
                            itemsize,
                        )
                    };
                }
            }
        }
        _ => {
            for i in 0..shape[0] as isize {
                // SAFETY: sub-array i of both sides satisfies the contract for the inner dims.
                unsafe {
                    strided_copy(
                        src.offset(i * src_strides[0]),
                        &src_strides[1..],
                        dst.offset(i * dst_strides[0]),
                        &dst_strides[1..],
                        &shape[1..],
                        itemsize,
                    )
                };
            }
        }
    }
}

/// A fresh, writable, C-ordered CPU copy of a host tensor.
pub fn copy_to_c_order(tensor: &Tensor) -> Result<Tensor> {
    let itemsize = tensor.dtype.itemsize();
    let nbytes = usize::try_from(tensor.nbytes()).map_err(|_| Error::value("tensor too large"))?;
    let buffer = AlignedBuffer::new(nbytes)?;
    let shape = &tensor.layout.shape;
    let c = c_strides(shape);
    let to_bytes = |s: &[i64]| {
        s.iter()
            .map(|&x| x as isize * itemsize as isize)
            .collect::<Vec<_>>()
    };
    let extents: Vec<usize> = shape.iter().map(|&n| n as usize).collect();
    // SAFETY: the source tensor's layout was validated against its memory when imported and its
    // owner is alive (we borrow the tensor); the destination is a fresh buffer of exactly
    // numel * itemsize bytes addressed by C-order strides.
    unsafe {
        strided_copy(
            tensor.data as *const u8,
            &tensor
                .layout
                .byte_strides
                .iter()
                .map(|&b| b as isize)
                .collect::<Vec<_>>(),
            buffer.as_ptr(),
            &to_bytes(&c),
            &extents,
            itemsize,
        );
    }
    Ok(Tensor {
        data: buffer.as_ptr().cast::<c_void>(),
        device: Device::CPU,
        dtype: tensor.dtype,
        layout: Layout::c_order(shape, itemsize),
        readonly: false,
        swapped: false,
        indirect: false,
        stream: None,
        owner: Owner::Allocation(buffer),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Reference: element-by-element, by multi-index.
    fn reference(
        src: &[u8],
        base: isize,
        strides: &[isize],
        shape: &[usize],
        item: usize,
    ) -> Vec<u8> {
        let numel: usize = shape.iter().product();
        let mut out = Vec::with_capacity(numel * item);
        for flat in 0..numel {
            let mut rest = flat;
            let mut offset = base;
            for (k, &n) in shape.iter().enumerate().rev() {
                offset += (rest % n) as isize * strides[k];
                rest /= n;
            }
            out.extend_from_slice(&src[offset as usize..offset as usize + item]);
        }
        out
    }

    proptest! {
        #[test]
        fn matches_reference(dims in proptest::collection::vec((1usize..5, -3isize..4), 0..4),
                             item in proptest::sample::select(vec![1usize, 2, 4, 8, 16])) {
            let shape: Vec<usize> = dims.iter().map(|d| d.0).collect();
            let strides: Vec<isize> = dims.iter().map(|d| d.1 * item as isize).collect();
            // Place the base so every addressed element lies inside `src`.
            let low: isize = shape.iter().zip(&strides).map(|(&n, &s)| ((n - 1) as isize * s).min(0)).sum();
            let high: isize = shape.iter().zip(&strides).map(|(&n, &s)| ((n - 1) as isize * s).max(0)).sum();
            let size = (high - low) as usize + item;
            let src: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
            let base = -low;
            let numel: usize = shape.iter().product();
            let mut dst = vec![0u8; numel * item];
            let c: Vec<isize> = c_strides(&shape.iter().map(|&n| n as i64).collect::<Vec<_>>())
                .iter().map(|&s| s as isize * item as isize).collect();
            // SAFETY: all addresses are inside `src` / `dst` by construction.
            unsafe {
                strided_copy(src.as_ptr().offset(base), &strides, dst.as_mut_ptr(), &c, &shape, item);
            }
            prop_assert_eq!(dst, reference(&src, base, &strides, &shape, item));
        }
    }
}
