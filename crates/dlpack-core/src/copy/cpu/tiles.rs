//! Cache-blocked tiles for transposing copies: loop `a` walks the source densely, loop `b` the
//! destination, and each side strides far along the other's.
//!
//! A tile is [`RUN_BYTES`] ([`STREAMING_RUN_BYTES`] with streaming stores) of each source row
//! (along `a`, and on along an outer loop that continues it where `a` is shorter), walked one
//! band of rows at a time: a block side of them, a cache line of the destination's rows. Each
//! source row is then read as one long run, which the hardware prefetchers follow, and each
//! destination line is written whole, once, by one block transpose ([`super::blocks`]). Items copied unchanged with unit strides on both
//! sides take this path; anything else (byte swaps, gaps between items) goes element by
//! element, in squares that stay in cache.

use super::blocks::{Block, LINE, Portable, block_side};
use super::elem::{Elem, Plain};
#[cfg(target_arch = "x86_64")]
use super::simd::{Avx512, Avx512U32, Avx512U64, Sse2U8, Sse2U16, Sse2U32, Sse2U64};
use crate::copy::plan::Dim;

/// Bytes of each source row one tile reads with ordinary stores: a page. Longer runs keep the
/// prefetchers on each row longer, but a tile then writes into more destination lines than the
/// caches hold (a 4096x4096 `f32` transpose on one thread, on an AMD EPYC VM: 22 GB/s with
/// 4 KiB runs, 12 with 16 KiB).
const RUN_BYTES: usize = 4096;
/// The same with streaming stores, which don't keep destination lines in the caches: there
/// longer runs win (on the same transpose 23.3 GB/s with 4 KiB runs, 24.3 with 16 KiB; a
/// 64^4 permute 20.2 and 20.9).
const STREAMING_RUN_BYTES: usize = 16 << 10;

/// Bands of source rows a tile of a two-loop transpose walks at once with streaming stores, so
/// that each destination row gets that many lines in a row: the destination is written in runs
/// of 256 bytes instead of lines scattered one by one (a 4096x4096 `f32` transpose on one
/// thread, AMD EPYC VM: 23.3 GB/s one band at a time, 27.6 four; 2048x4096 `f64` 22.3, 25.1).
/// Where tiles walk an outer loop too (a permute) the bands multiply by its steps, and the
/// source lines one pass reads no longer stay apart in the caches (a 64^4 permute: 20.9 GB/s
/// one band at a time, 5.2 four): those keep one.
const STREAMING_BANDS: usize = 4;

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

/// Tiles of `K` blocks. A tile is `a` items `i0..a1` ([`RUN_BYTES`] of each source row,
/// [`STREAMING_RUN_BYTES`] for a streaming `K`, or as many whole steps of `m` as make up that
/// much) by the whole of `b`, walked one band of `K::B` source rows at a time
/// ([`STREAMING_BANDS`] at a time for a streaming `K` without an outer loop `m`); each band's
/// row pieces before `i0` (the first tile's heads) and from `fa` (the last one's tail) go
/// element by element, as do the items of `b` before `hb` and after the last whole band. `false` (nothing copied) where `h` shows destination rows
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
    let run_bytes = if K::STREAMING {
        STREAMING_RUN_BYTES
    } else {
        RUN_BYTES
    };
    let run = (run_bytes / z / side).max(1) * side;
    let steps = (run / a.n.max(1)).clamp(1, m.n.max(1));
    let bands_end = h.hb + (b.n - h.hb) / side * side;
    let group = if K::STREAMING && m.n <= 1 {
        STREAMING_BANDS
    } else {
        1
    };
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
            // `group` bands at a time: items j..j_end of `b`.
            for j in (h.hb..bands_end).step_by(side * group) {
                let j_end = (j + side * group).min(bands_end);
                for (dst, src) in ms.clone().map(|i| l.at(i, dst, src)) {
                    // SAFETY: items a0..i0 x j..j_end of the loops.
                    unsafe { elementwise(e, dst, src, a, b, a0..i0, j..j_end) };
                    for i in (i0..fa).step_by(side) {
                        for jb in (j..j_end).step_by(side) {
                            let s = src.wrapping_offset(jb as isize * b.src).wrapping_add(i * z);
                            let d = dst.wrapping_offset(i as isize * a.dst).wrapping_add(jb * z);
                            // SAFETY: the block i..i + side x jb..jb + side lies inside the
                            // loops, its rows on both sides `side` unit-stride items; `h` aligns
                            // its destination rows.
                            unsafe { k.block(d, a.dst, s, b.src) };
                        }
                    }
                    // SAFETY: items fa..a1 x j..j_end of the loops.
                    unsafe { elementwise(e, dst, src, a, b, fa..a1, j..j_end) };
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

    /// Items `i` (along `a`) x `j` (along `b`) at each step of `m`, byte strides on both sides.
    #[derive(Clone, Debug)]
    struct Layout {
        z: usize,
        /// Byte-swap unit; 0 for none.
        unit: usize,
        m: Dim,
        a: Dim,
        b: Dim,
        /// Offsets of element (0, 0) from a line boundary.
        dst_off: usize,
        src_off: usize,
        streaming: bool,
        avx512: bool,
    }

    impl Layout {
        /// Bytes one side spans, and element (0, 0, 0)'s offset from the lowest address.
        fn span(&self, stride: impl Fn(&Dim) -> isize) -> (usize, usize) {
            let reach = [self.m, self.a, self.b].map(|d| (d.n as isize - 1) * stride(&d));
            let low: isize = reach.iter().map(|r| r.min(&0)).sum();
            let high: isize = reach.iter().map(|r| r.max(&0)).sum();
            ((high - low) as usize + self.z, (-low) as usize)
        }
    }

    /// The reference: element by element, each unit's bytes reversed when swapping.
    fn reference(l: &Layout, dst: &mut [u8], d0: usize, src: &[u8], s0: usize) {
        let steps = |d: Dim| (0..d.n as isize).map(move |i| (i * d.dst, i * d.src));
        for (dm, sm) in steps(l.m) {
            for (da, sa) in steps(l.a) {
                for (db, sb) in steps(l.b) {
                    let d = (d0 as isize + dm + da + db) as usize;
                    let s = (s0 as isize + sm + sa + sb) as usize;
                    for byte in 0..l.z {
                        let from = if l.unit > 1 {
                            byte / l.unit * l.unit + l.unit - 1 - byte % l.unit
                        } else {
                            byte
                        };
                        dst[d + byte] = src[s + from];
                    }
                }
            }
        }
    }

    fn check(l: &Layout) -> Result<(), TestCaseError> {
        let (dst_len, dst_base) = l.span(|d| d.dst);
        let (src_len, src_base) = l.span(|d| d.src);
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
        #[cfg(not(target_arch = "x86_64"))]
        let _ = l.avx512; // one set of block kernels elsewhere
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
                unsafe {
                    tiles(
                        $e,
                        d,
                        s,
                        Loops {
                            m: l.m,
                            a: l.a,
                            b: l.b,
                        },
                        options,
                    )
                }
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

    /// A stride past `bytes`: no gap, a few bytes (possibly between items), or up to the next line.
    fn padded(bytes: usize, z: usize) -> impl Strategy<Value = isize> {
        prop_oneof![
            3 => Just(bytes as isize),
            1 => (1..3 * z + 5).prop_map(move |g| (bytes + g) as isize),
            2 => Just((bytes.div_ceil(LINE) * LINE) as isize),
        ]
    }

    /// Layouts the tiles get from the planner: `a` walks the source densely (mostly unit stride)
    /// and `b` the destination (mostly unit stride), each striding far along the other's loop;
    /// `m`, where there is one, mostly carries on along the source from where `a` ends, and in the
    /// destination lies outside `a` or between `a` and `b` (as in a permute).
    fn layout() -> impl Strategy<Value = Layout> {
        let z = proptest::sample::select(vec![1usize, 2, 4, 8, 16, 3, 6, 12]);
        let m_n = prop_oneof![3 => Just(1usize), 1 => 2usize..5];
        (z, any::<bool>(), m_n).prop_flat_map(|(z, swap, m_n)| {
            let side = block_side(z);
            let run = RUN_BYTES / z;
            let long = STREAMING_RUN_BYTES / z;
            // Up to a few blocks, or (for one step of `m`) around the end of the first tile,
            // with ordinary or streaming stores.
            let few = 1..4 * side + 3;
            let a_n = if m_n > 1 {
                few.boxed()
            } else {
                prop_oneof![
                    2 => few,
                    1 => run.saturating_sub(2 * side).max(1)..run + 2 * side,
                    1 => long.saturating_sub(2 * side).max(1)..long + 2 * side,
                ]
                .boxed()
            };
            let b_n = 1..4 * side + 3;
            let unit = match (z, swap) {
                (_, false) | (1, true) => Just(0).boxed(),
                (8, true) => prop_oneof![Just(8), Just(4)].boxed(),
                (_, true) => Just(z).boxed(),
            };
            let step = || prop_oneof![6 => Just(1usize), 1 => Just(2usize)];
            (a_n, b_n, unit, step(), step()).prop_flat_map(move |(a_n, b_n, unit, ua, ub)| {
                let (a_src, b_dst) = ((ua * z) as isize, (ub * z) as isize);
                let row = || padded(b_n * ub * z, z); // the destination's rows along `b`
                (
                    (row(), any::<bool>(), row()).prop_flat_map(move |(row, m_inside, row2)| {
                        // (m.dst, a.dst): `m` between `a` and `b`, or outside `a`.
                        if m_inside {
                            padded(m_n * row as usize, z)
                                .prop_map(move |a| (row, a))
                                .boxed()
                        } else {
                            padded(a_n * row2 as usize, z)
                                .prop_map(move |m| (m, row2))
                                .boxed()
                        }
                    }),
                    // m.src: on from the end of `a`, or anywhere past it.
                    prop_oneof![3 => Just(a_n as isize * a_src), 1 => padded(a_n * ua * z, z)],
                    proptest::bool::weighted(0.2),
                    (0usize..LINE, 0usize..LINE),
                    prop_oneof![Just(0usize), Just(16), 0usize..LINE],
                    (any::<bool>(), any::<bool>()),
                )
                    .prop_flat_map(
                        move |((m_dst, a_dst), m_src, flip, offs, off2, flags)| {
                            padded(m_n * m_src as usize, z).prop_map(move |b_src| Layout {
                                z,
                                unit,
                                m: Dim {
                                    n: m_n,
                                    dst: m_dst,
                                    src: m_src,
                                },
                                a: Dim {
                                    n: a_n,
                                    dst: a_dst,
                                    src: a_src,
                                },
                                b: Dim {
                                    n: b_n,
                                    dst: b_dst,
                                    // Source rows walked backwards too.
                                    src: if flip { -b_src } else { b_src },
                                },
                                // Mostly the alignments arrays have: a line, or 16 bytes past one.
                                dst_off: if offs.0 < 48 { off2 } else { offs.0 },
                                src_off: offs.1,
                                streaming: flags.0,
                                avx512: flags.1,
                            })
                        },
                    )
            })
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn tiles_match_reference(l in layout()) {
            check(&l)?;
        }
    }

    /// Steps of `m` that move the destination rows off the streaming stores' alignment: the blocks
    /// must fall back to ordinary stores (a misaligned streaming store faults).
    #[test]
    fn steps_of_m_off_the_line() {
        // One band of `b` (a line) per step of `m`, the steps inside the rows of `a`.
        for (z, m_dst) in [(4, 80), (4, 96), (4, 68), (8, 80), (8, 96), (8, 72)] {
            let side = block_side(z);
            let (zi, n) = (z as isize, 2 * side);
            let m = Dim {
                n: 3,
                dst: m_dst,
                src: n as isize * zi,
            };
            let a = Dim {
                n,
                dst: 5 * LINE as isize,
                src: zi,
            };
            let b = Dim {
                n: side,
                dst: zi,
                src: 3 * n as isize * zi,
            };
            for avx512 in [false, true] {
                let l = Layout {
                    z,
                    unit: 0,
                    m,
                    a,
                    b,
                    dst_off: 0,
                    src_off: 0,
                    streaming: true,
                    avx512,
                };
                check(&l).unwrap();
            }
        }
    }

    #[test]
    fn heads_align_every_block_row() {
        let a = |dst| Dim {
            n: 1000,
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
        let one = Dim {
            n: 1,
            dst: 0,
            src: 0,
        };
        let loops = |a, b| Loops { m: one, a, b };
        let h = Heads::new(
            at(4096 + 16),
            at(8192 + 20),
            loops(a(1024), b(2048)),
            4,
            true,
        );
        assert_eq!((h.ha, h.hb, h.dst_align), (11, 12, 64));
        // Rows 16 bytes off a line: no head, and streaming stores of 16 bytes at most.
        let h = Heads::new(at(4096), at(8192), loops(a(1040), b(2048)), 4, true);
        assert_eq!((h.ha, h.hb, h.dst_align), (0, 0, 16));
        // The steps of `m` count too, where there are several.
        let m = Dim {
            n: 2,
            dst: 32,
            src: 400,
        };
        let with_m = Loops {
            m,
            ..loops(a(1024), b(2048))
        };
        let h = Heads::new(at(4096), at(8192), with_m, 4, true);
        assert_eq!((h.ha, h.hb, h.dst_align), (0, 0, 32));
        let with_m = Loops {
            m,
            ..loops(a(1040), b(2048))
        };
        let h = Heads::new(at(4096), at(8192), with_m, 4, true);
        assert_eq!((h.ha, h.hb, h.dst_align), (0, 0, 16));
        // A head longer than the loop stops at its end.
        let short = loops(Dim { n: 5, ..a(1024) }, Dim { n: 3, ..b(64) });
        let h = Heads::new(at(4096 + 16), at(8192), short, 4, true);
        assert_eq!((h.ha, h.hb), (0, 3));
        // Source rows (along `a`) shorter than SRC_ALIGN_MIN_BYTES start where they start.
        let short_a = loops(Dim { n: 100, ..a(1024) }, b(2048));
        let h = Heads::new(at(4096 + 16), at(8192 + 20), short_a, 4, true);
        assert_eq!((h.ha, h.hb, h.dst_align), (0, 12, 64));
        // Unaligned: the blocks start at once, and their rows keep the alignment they have.
        let h = Heads::new(
            at(4096 + 16),
            at(8192 + 20),
            loops(a(1024), b(2048)),
            4,
            false,
        );
        assert_eq!((h.ha, h.hb, h.dst_align), (0, 0, 16));
        assert_eq!(tile_granule(4), 16);
        assert_eq!(tile_granule(3), 21);
        assert_eq!(tile_granule(64), 1);
    }
}
