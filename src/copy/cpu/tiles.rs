//! Cache-blocked tiles for transposing copies: loop `a` walks the source densely, loop `b` the
//! destination, and each side strides far along the other's.
//!
//! A tile is [`RUN_BYTES`] of each source row (along `a`, and on along an outer loop that
//! continues it where `a` is shorter), walked one band of rows at a time: a block side of
//! them, a cache line of the destination's rows. Each source row is then read as one long run,
//! which the hardware prefetchers follow, and each destination line is written whole, once, by
//! one block transpose ([`super::blocks`]). Items copied unchanged with unit strides on both
//! sides take this path; anything else (byte swaps, gaps between items) goes element by
//! element, in squares that stay in cache.

use super::blocks::{Block, LINE, Portable, block_side};
use super::elem::{Elem, Plain};
#[cfg(target_arch = "x86_64")]
use super::simd::{Avx512, Avx512U32, Avx512U64, Sse2U8, Sse2U16, Sse2U32, Sse2U64};
use crate::copy::plan::Dim;

#[cfg(test)]
mod tests;

/// Bytes of each source row one tile reads: a page, the longest run the prefetchers follow.
const RUN_BYTES: usize = 4096;

/// Square side, in items, of the element-by-element tiles.
const SQUARE: usize = 32;

/// Runs of `a` shorter than this many bytes (rows of a short dense loop, as in a permute) start
/// their blocks where they start, not at line boundaries: their heads and tails, copied item by
/// item, would cost more than loads that straddle lines.
const SRC_ALIGN_MIN_BYTES: usize = 2 << 10;

/// Loops of at most this many bytes start their blocks at their first items, not at line
/// boundaries, unless writing with streaming stores (which need them): their data stays in
/// the nearest caches, where straddled lines cost less than copying the heads element by
/// element (all of a 16 x 16 block of `f32` 16 bytes off a line).
const ALIGN_MIN_BYTES: usize = 64 << 10;

/// The granule, in items, in which threads split a tiled loop: a block side, so that pieces
/// keep the blocks' line alignment.
pub const fn tile_granule(size: usize) -> usize {
    block_side(size)
}

/// How the tiles may write: what the copy as a whole decides.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// The copy is large enough to write the destination with streaming (non-temporal) stores,
    /// where the block kernels can.
    pub streaming: bool,
    pub isa: Isa,
}

/// The instruction sets the block transposes may use.
#[derive(Clone, Copy, Debug)]
pub struct Isa {
    #[cfg(target_arch = "x86_64")]
    avx512: Option<Avx512>,
}

impl Isa {
    /// What this CPU has.
    pub fn detect() -> Self {
        Isa {
            #[cfg(target_arch = "x86_64")]
            avx512: Avx512::detect(),
        }
    }

    /// The baseline of the architecture.
    #[cfg(test)]
    pub fn baseline() -> Self {
        Isa {
            #[cfg(target_arch = "x86_64")]
            avx512: None,
        }
    }
}

/// The loops tiles walk: `a` (the source's dense one), `b` (the destination's), and `m`, an
/// outer loop walked inside the tiles (`n == 1` for none): where `a` is short and `m` carries
/// on along the source rows, whole steps of `m` make up a tile's source runs.
#[derive(Clone, Copy, Debug)]
pub struct Loops {
    pub m: Dim,
    pub a: Dim,
    pub b: Dim,
}

impl Loops {
    /// The pointers of step `i` of `m`.
    fn at(&self, i: usize, dst: *mut u8, src: *const u8) -> (*mut u8, *const u8) {
        let i = i as isize;
        (
            dst.wrapping_offset(i * self.m.dst),
            src.wrapping_offset(i * self.m.src),
        )
    }
}

/// Copy the loops in tiles.
///
/// # Safety
/// Every element address of the three loops is valid (source readable, destination writable).
#[inline(always)]
pub unsafe fn tiles<E: Elem>(e: E, dst: *mut u8, src: *const u8, l: Loops, options: Options) {
    let (z, Loops { m, a, b }) = (e.size(), l);
    if e.plain() && a.src == z as isize && b.dst == z as isize {
        let bytes = [m.n, a.n, b.n, z]
            .into_iter()
            .fold(1, usize::saturating_mul);
        let h = Heads::new(dst, src, l, z, options.streaming || bytes > ALIGN_MIN_BYTES);
        // SAFETY: forwarded contract; the unit strides the block kernels need.
        if unsafe { block_tiles_for(z, dst, src, l, h, options) } {
            return;
        }
    }
    for i in 0..m.n {
        let (dst, src) = l.at(i, dst, src);
        for a0 in (0..a.n).step_by(SQUARE) {
            let a1 = (a0 + SQUARE).min(a.n);
            for b0 in (0..b.n).step_by(SQUARE) {
                let b1 = (b0 + SQUARE).min(b.n);
                // SAFETY: a sub-rectangle of the `a` x `b` loops at step `i` of `m`.
                unsafe { elementwise(e, dst, src, a, b, a0..a1, b0..b1) };
            }
        }
    }
}

/// Where the blocks start: items `ha` of `a` and `hb` of `b` (the items before go element by
/// element), and the alignment of every block's destination rows from there, at every step of
/// `m`.
#[derive(Clone, Copy, Debug)]
struct Heads {
    ha: usize,
    hb: usize,
    dst_align: usize,
}

impl Heads {
    /// `align`: at line boundaries on both sides, where the strides allow; else at once.
    fn new(dst: *mut u8, src: *const u8, l: Loops, z: usize, align: bool) -> Self {
        let Loops { m, a, b } = l;
        let head = |addr: usize, row: isize, n: usize| match align {
            true => line_head(addr, row, z, n),
            false => 0,
        };
        let hb = head(dst as usize, a.dst, b.n);
        // The lowest set bit of the first block's address and of the strides to the others.
        let m_dst = if m.n > 1 { m.dst.unsigned_abs() } else { 0 };
        let bits = (dst as usize).wrapping_add(hb * z) | a.dst.unsigned_abs() | m_dst | LINE;
        Heads {
            ha: match a.n.saturating_mul(z) >= SRC_ALIGN_MIN_BYTES {
                true => head(src as usize, b.src, a.n),
                false => 0,
            },
            hb,
            dst_align: 1 << bits.trailing_zeros(),
        }
    }
}

/// Items of `z` bytes to skip from `addr` to reach a line boundary (at most `n`), or 0 when
/// that can't align every row (`row` bytes apart) or falls between items.
fn line_head(addr: usize, row: isize, z: usize, n: usize) -> usize {
    let need = addr.wrapping_neg() % LINE;
    if !row.unsigned_abs().is_multiple_of(LINE) || !need.is_multiple_of(z) {
        return 0;
    }
    (need / z).min(n)
}

/// Run the block tiles for `z`-byte items where there is a block kernel for them; `false`
/// (nothing copied) where there is none.
///
/// # Safety
/// As for [`tiles`], with `a.src == b.dst == z`, and `h` made for these loops.
unsafe fn block_tiles_for(
    z: usize,
    dst: *mut u8,
    src: *const u8,
    l: Loops,
    h: Heads,
    options: Options,
) -> bool {
    let Options { streaming, isa } = options;
    // Each kernel's items are `z` bytes; a streaming kernel declines destination rows that
    // aren't aligned for it, and the one with ordinary stores takes them.
    macro_rules! go {
        ($k:expr) => {
            // SAFETY: the forwarded contract, for items of the kernel's size.
            unsafe { block_tiles($k, dst, src, l, h) }
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (streaming, isa); // only x86-64 has streaming block kernels
    #[cfg(target_arch = "x86_64")]
    match (z, isa.avx512) {
        (4, Some(t)) => {
            return (streaming && go!(Avx512U32::<true>(t))) || go!(Avx512U32::<false>(t));
        }
        (8, Some(t)) => {
            return (streaming && go!(Avx512U64::<true>(t))) || go!(Avx512U64::<false>(t));
        }
        (4, None) => return (streaming && go!(Sse2U32::<true>)) || go!(Sse2U32::<false>),
        (8, None) => return (streaming && go!(Sse2U64::<true>)) || go!(Sse2U64::<false>),
        (2, _) => return (streaming && go!(Sse2U16::<true>)) || go!(Sse2U16::<false>),
        (1, _) => return (streaming && go!(Sse2U8::<true>)) || go!(Sse2U8::<false>),
        _ => {}
    }
    match z {
        1 => go!(Portable::<u8, 64>::new()),
        2 => go!(Portable::<u16, 32>::new()),
        4 => go!(Portable::<u32, 16>::new()),
        8 => go!(Portable::<u64, 8>::new()),
        16 => go!(Portable::<u128, 4>::new()),
        _ => false,
    }
}

/// Tiles of `K` blocks. A tile is `a` items `i0..a1` ([`RUN_BYTES`] of each source row, or
/// as many whole steps of `m` as make up that much) by the whole of `b`, walked one band of
/// `K::B` source rows at a time; each band's row pieces before `i0` (the first tile's heads)
/// and from `fa` (the last one's tail) go element by element, as do the items of `b` before
/// `hb` and after the last whole band. `false` (nothing copied) where `h` shows destination rows
/// not aligned for `K`.
///
/// # Safety
/// As for [`tiles`], with `a.src == b.dst == size_of::<K::Item>()` and `h` made for these
/// loops.
#[inline(always)]
unsafe fn block_tiles<K: Block>(k: K, dst: *mut u8, src: *const u8, l: Loops, h: Heads) -> bool {
    if h.dst_align < K::DST_ALIGN {
        return false;
    }
    let (e, z, side) = (Plain::<K::Item>::new(), size_of::<K::Item>(), K::B);
    let Loops { m, a, b } = l;
    let run = (RUN_BYTES / z / side).max(1) * side;
    let steps = (run / a.n.max(1)).clamp(1, m.n.max(1));
    let bands_end = h.hb + (b.n - h.hb) / side * side;
    for m0 in (0..m.n).step_by(steps) {
        let ms = m0..(m0 + steps).min(m.n);
        let mut a0 = 0;
        while a0 < a.n {
            let i0 = a0.max(h.ha);
            let a1 = i0.saturating_add(run).min(a.n);
            let fa = i0 + (a1 - i0) / side * side;
            for (dst, src) in ms.clone().map(|i| l.at(i, dst, src)) {
                // SAFETY: items a0..a1 x 0..hb of the loops.
                unsafe { elementwise(e, dst, src, a, b, a0..a1, 0..h.hb) };
            }
            for j in (h.hb..bands_end).step_by(side) {
                for (dst, src) in ms.clone().map(|i| l.at(i, dst, src)) {
                    // SAFETY: items a0..i0 x j..j + side of the loops.
                    unsafe { elementwise(e, dst, src, a, b, a0..i0, j..j + side) };
                    let s = src.wrapping_offset(j as isize * b.src);
                    let d = dst.wrapping_add(j * z);
                    for i in (i0..fa).step_by(side) {
                        let (d, s) = (d.wrapping_offset(i as isize * a.dst), s.wrapping_add(i * z));
                        // SAFETY: the block i..i + side x j..j + side lies inside the loops, its
                        // rows on both sides `side` unit-stride items; `h` aligns its
                        // destination rows.
                        unsafe { k.block(d, a.dst, s, b.src) };
                    }
                    // SAFETY: items fa..a1 x j..j + side of the loops.
                    unsafe { elementwise(e, dst, src, a, b, fa..a1, j..j + side) };
                }
            }
            for (dst, src) in ms.clone().map(|i| l.at(i, dst, src)) {
                // SAFETY: items a0..a1 x bands_end..b.n of the loops.
                unsafe { elementwise(e, dst, src, a, b, a0..a1, bands_end..b.n) };
            }
            a0 = a1;
        }
    }
    true
}

/// Element by element over `ia` x `ib`, `b` innermost (the destination's dense loop).
///
/// # Safety
/// The rectangle lies inside the two loops, whose element addresses are valid.
#[inline(always)]
unsafe fn elementwise<E: Elem>(
    e: E,
    dst: *mut u8,
    src: *const u8,
    a: Dim,
    b: Dim,
    ia: std::ops::Range<usize>,
    ib: std::ops::Range<usize>,
) {
    for i in ia {
        let i = i as isize;
        let (d, s) = (
            dst.wrapping_offset(i * a.dst),
            src.wrapping_offset(i * a.src),
        );
        for j in ib.clone() {
            let j = j as isize;
            let (d, s) = (d.wrapping_offset(j * b.dst), s.wrapping_offset(j * b.src));
            // SAFETY: element (i, j) of the loops is valid.
            unsafe { e.copy(s, d) };
        }
    }
}
