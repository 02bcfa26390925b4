//! Cache-blocked tiles for transposing copies: loop `a` walks the source densely, loop `b` the
//! destination, and each side strides far along the other's.
//!
//! A tile is a run of [`RUN_BYTES`] along `a` of one band of source rows (a block side of
//! them, each row a cache line wide in the destination). Each source row is then read as one
//! long run, which the hardware prefetchers follow, and each destination line is written whole,
//! once, by one block transpose ([`super::blocks`]). Items copied unchanged with unit strides
//! on both sides take this path; anything else (byte swaps, gaps between items) goes element
//! by element, in squares that stay in cache.

use super::blocks::{Block, LINE, Portable, block_side};
use super::elem::{Elem, Plain};
#[cfg(target_arch = "x86_64")]
use super::simd::{Avx512, Avx512U32, Avx512U64, Sse2U32, Sse2U64};
use crate::copy::plan::Dim;

#[cfg(test)]
mod tests {
    // The tile kernels against an element-by-element reference, on buffers placed at every
    // offset from a cache line, so that line heads, block edges, tile ends and the streaming
    // kernels' alignment are all reached.

    use proptest::prelude::*;

    use super::*;
    use crate::copy::cpu::elem::{Dyn, Swapped};

    /// A buffer with a 64-byte aligned point inside it, and room before and after it.
    struct Buf {
        bytes: Vec<u8>,
        aligned: usize,
    }

    impl Buf {
        fn new(len: usize, seed: u8) -> Self {
            let bytes: Vec<u8> = (0..len + 3 * LINE)
                .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
                .collect();
            let aligned = (bytes.as_ptr() as usize).wrapping_neg() % LINE + LINE;
            Buf { bytes, aligned }
        }
    }

    /// Items `i` (along `a`) x `j` (along `b`): `a.n` x `b.n`, byte strides on both sides.
    #[derive(Clone, Debug)]
    struct Layout {
        z: usize,
        /// Byte-swap unit; 0 for none.
        unit: usize,
        a: Dim,
        b: Dim,
        /// Offsets of element (0, 0) from a line boundary.
        dst_off: usize,
        src_off: usize,
        streaming: bool,
        avx512: bool,
    }

    impl Layout {
        /// Bytes each side spans, and element (0, 0)'s offset from the lowest address.
        fn span(n: (usize, usize), strides: (isize, isize), z: usize) -> (usize, usize) {
            let reach = |n: usize, s: isize| (n as isize - 1) * s;
            let (ra, rb) = (reach(n.0, strides.0), reach(n.1, strides.1));
            let low = ra.min(0) + rb.min(0);
            let high = ra.max(0) + rb.max(0);
            ((high - low) as usize + z, (-low) as usize)
        }
    }

    /// The reference: element by element, each unit's bytes reversed when swapping.
    fn reference(l: &Layout, dst: &mut [u8], d0: usize, src: &[u8], s0: usize) {
        for i in 0..l.a.n as isize {
            for j in 0..l.b.n as isize {
                let d = (d0 as isize + i * l.a.dst + j * l.b.dst) as usize;
                let s = (s0 as isize + i * l.a.src + j * l.b.src) as usize;
                for k in 0..l.z {
                    let from = if l.unit > 1 {
                        k / l.unit * l.unit + l.unit - 1 - k % l.unit
                    } else {
                        k
                    };
                    dst[d + k] = src[s + from];
                }
            }
        }
    }

    fn check(l: &Layout) -> Result<(), TestCaseError> {
        let (dst_len, dst_base) = Layout::span((l.a.n, l.b.n), (l.a.dst, l.b.dst), l.z);
        let (src_len, src_base) = Layout::span((l.a.n, l.b.n), (l.a.src, l.b.src), l.z);
        let src = Buf::new(src_len + LINE, 3);
        let mut actual = Buf::new(dst_len + LINE, 101);
        let s0 = src.aligned + l.src_off + src_base;
        let d0 = actual.aligned + l.dst_off + dst_base;
        let mut expected = actual.bytes.clone();
        reference(l, &mut expected, d0, &src.bytes, s0);
        let isa = Isa {
            #[cfg(target_arch = "x86_64")]
            avx512: if l.avx512 { Avx512::detect() } else { None },
        };
        let options = Options {
            streaming: l.streaming,
            isa,
        };
        let (d, s) = (
            actual.bytes.as_mut_ptr().wrapping_add(d0),
            src.bytes.as_ptr().wrapping_add(s0),
        );
        macro_rules! go {
            ($e:expr) => {
                // SAFETY: both layouts lie inside their buffers by construction.
                unsafe { tiles($e, d, s, l.a, l.b, options) }
            };
        }
        match (l.z, l.unit) {
            (1, _) => go!(Plain::<u8>::new()),
            (2, 0) => go!(Plain::<u16>::new()),
            (4, 0) => go!(Plain::<u32>::new()),
            (8, 0) => go!(Plain::<u64>::new()),
            (16, 0) => go!(Plain::<u128>::new()),
            (4, 4) => go!(Swapped::<u32, u32>::new()),
            (8, 4) => go!(Swapped::<u64, u32>::new()),
            (z, unit) => go!(Dyn { size: z, unit }),
        }
        prop_assert!(actual.bytes == expected, "{:?}", l);
        Ok(())
    }

    /// A stride of `n` items of `z` bytes plus a gap: none, a few bytes, or up to the next line.
    fn padded(n: usize, z: usize) -> impl Strategy<Value = isize> {
        let dense = (n * z) as isize;
        prop_oneof![
            3 => Just(dense),
            1 => (1isize..(3 * z as isize + 5)).prop_map(move |g| dense + g),
            2 => Just(((n * z).div_ceil(LINE) * LINE) as isize),
        ]
    }

    /// Layouts the tiles get from the planner: `a` walks the source densely (mostly unit stride)
    /// and `b` the destination (mostly unit stride), each striding far along the other's loop.
    fn layout() -> impl Strategy<Value = Layout> {
        let z = proptest::sample::select(vec![1usize, 2, 4, 8, 16, 3, 6, 12]);
        (z, any::<bool>()).prop_flat_map(|(z, swap)| {
            let side = block_side(z);
            let run = RUN_BYTES / z;
            // Up to a few blocks, or around the end of the first tile.
            let a_n = prop_oneof![
                1..4 * side + 3,
                run.saturating_sub(2 * side).max(1)..run + 2 * side
            ];
            let b_n = 1..4 * side + 3;
            let unit = match (z, swap) {
                (_, false) | (1, true) => Just(0).boxed(),
                (8, true) => prop_oneof![Just(8), Just(4)].boxed(),
                (_, true) => Just(z).boxed(),
            };
            let unit_a = prop_oneof![6 => Just(1isize), 1 => Just(2isize)];
            let unit_b = prop_oneof![6 => Just(1isize), 1 => Just(2isize)];
            (a_n, b_n, unit, unit_a, unit_b).prop_flat_map(move |(a_n, b_n, unit, ua, ub)| {
                let z = z as isize;
                (
                    padded(b_n * ub as usize, z as usize),
                    padded(a_n * ua as usize, z as usize),
                    proptest::bool::weighted(0.2),
                    0usize..LINE,
                    0usize..LINE,
                    prop_oneof![Just(0usize), Just(16), 0usize..LINE],
                    any::<bool>(),
                    any::<bool>(),
                )
                    .prop_map(
                        move |(
                            a_dst,
                            b_src,
                            flip,
                            dst_off,
                            src_off,
                            dst_off2,
                            streaming,
                            avx512,
                        )| {
                            Layout {
                                z: z as usize,
                                unit,
                                a: Dim {
                                    n: a_n,
                                    dst: a_dst,
                                    src: ua * z,
                                },
                                b: Dim {
                                    n: b_n,
                                    dst: ub * z,
                                    // Source rows walked backwards too.
                                    src: if flip { -b_src } else { b_src },
                                },
                                // Mostly the alignments arrays have: a line, or 16 bytes past one.
                                dst_off: if dst_off < 48 { dst_off2 } else { dst_off },
                                src_off,
                                streaming,
                                avx512,
                            }
                        },
                    )
            })
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(600))]
        #[test]
        fn tiles_match_reference(l in layout()) {
            check(&l)?;
        }
    }

    #[test]
    fn heads_align_every_block_row() {
        let a = |dst| Dim {
            n: 100,
            dst,
            src: 4,
        };
        let b = |src| Dim {
            n: 100,
            dst: 4,
            src,
        };
        let at = |addr: usize| addr as *mut u8;
        // Rows a multiple of a line apart: the heads reach the next line on both sides.
        let h = Heads::new(at(4096 + 16), at(8192 + 20), a(1024), b(2048), 4);
        assert_eq!((h.ha, h.hb, h.dst_align), (11, 12, 64));
        // Rows 16 bytes off a line: no head, and streaming stores of 16 bytes at most.
        let h = Heads::new(at(4096), at(8192), a(1040), b(2048), 4);
        assert_eq!((h.ha, h.hb, h.dst_align), (0, 0, 16));
        // A head longer than the loop stops at its end.
        let h = Heads::new(
            at(4096 + 16),
            at(8192),
            Dim { n: 5, ..a(1024) },
            Dim { n: 3, ..b(64) },
            4,
        );
        assert_eq!((h.ha, h.hb), (0, 3));
        assert_eq!(tile_granule(4), 16);
        assert_eq!(tile_granule(3), 21);
        assert_eq!(tile_granule(64), 1);
    }
}

/// Bytes of each source row one tile reads: a page, the longest run the prefetchers follow.
const RUN_BYTES: usize = 4096;

/// Square side, in items, of the element-by-element tiles.
const SQUARE: usize = 32;

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

/// Copy the `a` x `b` loops in tiles.
///
/// # Safety
/// Every element address of the two loops is valid (source readable, destination writable).
#[inline(always)]
pub unsafe fn tiles<E: Elem>(e: E, dst: *mut u8, src: *const u8, a: Dim, b: Dim, options: Options) {
    let z = e.size();
    if e.plain() && a.src == z as isize && b.dst == z as isize {
        let h = Heads::new(dst, src, a, b, z);
        // SAFETY: forwarded contract; the unit strides the block kernels need.
        if unsafe { block_tiles_for(z, dst, src, a, b, h, options) } {
            return;
        }
    }
    for a0 in (0..a.n).step_by(SQUARE) {
        let a1 = (a0 + SQUARE).min(a.n);
        for b0 in (0..b.n).step_by(SQUARE) {
            let b1 = (b0 + SQUARE).min(b.n);
            // SAFETY: a sub-rectangle of the two loops.
            unsafe { elementwise(e, dst, src, a, b, a0..a1, b0..b1) };
        }
    }
}

/// Where the line-aligned blocks start: items `ha` of `a` and `hb` of `b` (the items before go
/// element by element), and the alignment of every block's destination rows from there.
#[derive(Clone, Copy, Debug)]
struct Heads {
    ha: usize,
    hb: usize,
    dst_align: usize,
}

impl Heads {
    fn new(dst: *mut u8, src: *const u8, a: Dim, b: Dim, z: usize) -> Self {
        let hb = line_head(dst as usize, a.dst, z, b.n);
        // The lowest set bit of the first block's address and of the row stride.
        let bits = (dst as usize).wrapping_add(hb * z) | a.dst.unsigned_abs() | LINE;
        Heads {
            ha: line_head(src as usize, b.src, z, a.n),
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
    a: Dim,
    b: Dim,
    h: Heads,
    options: Options,
) -> bool {
    let Options { streaming, isa } = options;
    // Each kernel's items are `z` bytes; a streaming kernel declines destination rows that
    // aren't aligned for it, and the one with ordinary stores takes them.
    macro_rules! go {
        ($k:expr) => {
            // SAFETY: the forwarded contract, for items of the kernel's size.
            unsafe { block_tiles($k, dst, src, a, b, h) }
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

/// Tiles of `K` blocks. A tile is `a` items `i0..a1` ([`RUN_BYTES`] of each source row) by the
/// whole of `b`, walked one band of `K::B` source rows at a time; each band's row pieces before
/// `i0` (the first tile's heads) and from `fa` (the last one's tail) go element by element, as
/// do the items of `b` before `hb` and after the last whole band.
///
/// `false` (nothing copied) where `h` shows destination rows not aligned for `K`.
///
/// # Safety
/// As for [`tiles`], with `a.src == b.dst == size_of::<K::Item>()` and `h` made for these
/// loops.
#[inline(always)]
unsafe fn block_tiles<K: Block>(
    k: K,
    dst: *mut u8,
    src: *const u8,
    a: Dim,
    b: Dim,
    h: Heads,
) -> bool {
    if h.dst_align < K::DST_ALIGN {
        return false;
    }
    let e = Plain::<K::Item>::new();
    let side = K::B;
    let run = (RUN_BYTES / size_of::<K::Item>() / side).max(1) * side;
    let bands_end = h.hb + (b.n - h.hb) / side * side;
    let mut a0 = 0;
    while a0 < a.n {
        let i0 = a0.max(h.ha);
        let a1 = i0.saturating_add(run).min(a.n);
        let fa = i0 + (a1 - i0) / side * side;
        // SAFETY: items a0..a1 x 0..hb of the loops.
        unsafe { elementwise(e, dst, src, a, b, a0..a1, 0..h.hb) };
        for j in (h.hb..bands_end).step_by(side) {
            // SAFETY: items a0..i0 x j..j + side of the loops.
            unsafe { elementwise(e, dst, src, a, b, a0..i0, j..j + side) };
            let s = src.wrapping_offset(j as isize * b.src);
            let d = dst.wrapping_add(j * size_of::<K::Item>());
            for i in (i0..fa).step_by(side) {
                let (d, s) = (
                    d.wrapping_offset(i as isize * a.dst),
                    s.wrapping_add(i * size_of::<K::Item>()),
                );
                // SAFETY: the block i..i + side x j..j + side lies inside the loops, its rows
                // on both sides `side` unit-stride items; `heads` aligns its destination rows.
                unsafe { k.block(d, a.dst, s, b.src) };
            }
            // SAFETY: items fa..a1 x j..j + side of the loops.
            unsafe { elementwise(e, dst, src, a, b, fa..a1, j..j + side) };
        }
        // SAFETY: items a0..a1 x bands_end..b.n of the loops.
        unsafe { elementwise(e, dst, src, a, b, a0..a1, bands_end..b.n) };
        a0 = a1;
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
