//! Square block transposes, the innermost step of the tiled kernels ([`super::tiles`]): a block
//! is `B` x `B` items whose rows are one cache line on each side, so that every line of either
//! side is read or written whole, once. [`Portable`] works everywhere; `super::simd` has the
//! x86-64 ones.

use std::marker::PhantomData;
use std::ptr::{read_unaligned, write_unaligned};

/// Bytes of a cache line: the length of a block's rows.
pub const LINE: usize = 64;

/// Items per block side for `size`-byte items: a line of them (1 for items of a line or more).
pub const fn block_side(size: usize) -> usize {
    if size == 0 || size >= LINE {
        1
    } else {
        LINE / size
    }
}

/// One block transpose.
pub trait Block: Copy {
    /// The item: what the tiles' edges copy one by one.
    type Item: Copy;
    /// Items per side.
    const B: usize;
    /// The alignment, in bytes, that every destination row of a block needs.
    const DST_ALIGN: usize;
    /// Whether it writes with streaming stores.
    const STREAMING: bool = false;
    /// Destination row `i` (at `dst + i * d_row`) gets item `i` of each of the `B` source rows
    /// (at `src + j * s_row`), in order.
    ///
    /// # Safety
    /// The `B` runs of `B` items at `src + j * s_row` are readable, those at `dst + i * d_row`
    /// writable and [`Block::DST_ALIGN`]-aligned.
    unsafe fn block(self, dst: *mut u8, d_row: isize, src: *const u8, s_row: isize);
}

/// Any item, through a local buffer: the compiler's own code for the transpose in between.
pub struct Portable<T, const B: usize>(PhantomData<T>);

impl<T, const B: usize> Portable<T, B> {
    pub const fn new() -> Self {
        Portable(PhantomData)
    }
}

impl<T, const B: usize> Clone for Portable<T, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T, const B: usize> Copy for Portable<T, B> {}

impl<T: Copy + Default, const B: usize> Block for Portable<T, B> {
    type Item = T;
    const B: usize = B;
    const DST_ALIGN: usize = 1;

    #[inline(always)]
    #[allow(clippy::needless_range_loop, reason = "index arithmetic reads clearer")]
    unsafe fn block(self, dst: *mut u8, d_row: isize, src: *const u8, s_row: isize) {
        let mut buf = [[T::default(); B]; B];
        for (j, line) in buf.iter_mut().enumerate() {
            let s = src.wrapping_offset(j as isize * s_row).cast::<[T; B]>();
            // SAFETY: source run j is readable (the contract); unaligned.
            *line = unsafe { read_unaligned(s) };
        }
        for i in 0..B {
            let out: [T; B] = std::array::from_fn(|j| buf[j][i]);
            let d = dst.wrapping_offset(i as isize * d_row).cast::<[T; B]>();
            // SAFETY: destination run i is writable.
            unsafe { write_unaligned(d, out) };
        }
    }
}
