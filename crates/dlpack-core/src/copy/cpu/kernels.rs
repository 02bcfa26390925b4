//! Inner loops of the CPU copy engine, generic over the element ([`Elem`]) so that each
//! item size (and byte swap) gets its own compiled loops with constant element strides.

use std::marker::PhantomData;
use std::mem::size_of;
use std::ptr::{copy_nonoverlapping, read_unaligned, write_unaligned};

use crate::copy::plan::{Dim, Kernel, Plan};

/// How to copy one element.
pub trait Elem: Copy {
    /// Bytes per element.
    fn size(self) -> usize;
    /// Whether elements are copied unchanged (so runs of them can be `memcpy`d).
    fn plain(self) -> bool;
    /// Copy one element. Non-plain elements are read before they are written, so `src` may
    /// equal `dst` for them (an in-place byte swap).
    ///
    /// # Safety
    /// `size()` bytes at `src` readable, at `dst` writable (any alignment).
    unsafe fn copy(self, src: *const u8, dst: *mut u8);

    /// Copy `n` elements from every other element of the source to a dense destination run.
    ///
    /// # Safety
    /// Source elements `0, 2, .., 2 (n - 1)` readable, destination elements `0..n` writable.
    #[inline(always)]
    unsafe fn gather2(self, src: *const u8, dst: *mut u8, n: usize) {
        let size = self.size();
        for i in 0..n {
            // SAFETY: per the contract.
            unsafe { self.copy(src.add(2 * i * size), dst.add(i * size)) };
        }
    }
}

/// An element copied unchanged, `size_of::<T>()` bytes.
pub struct Plain<T>(PhantomData<T>);

impl<T> Plain<T> {
    pub const fn new() -> Self {
        Plain(PhantomData)
    }
}

impl<T> Clone for Plain<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Plain<T> {}

impl<T: Copy> Elem for Plain<T> {
    #[inline(always)]
    fn size(self) -> usize {
        size_of::<T>()
    }
    #[inline(always)]
    fn plain(self) -> bool {
        true
    }
    #[inline(always)]
    unsafe fn copy(self, src: *const u8, dst: *mut u8) {
        // SAFETY: per the trait contract; unaligned accesses.
        unsafe { write_unaligned(dst.cast::<T>(), read_unaligned(src.cast::<T>())) }
    }

    /// Eight at a time: read 16 items, keep the even ones (vector shuffles).
    #[inline(always)]
    unsafe fn gather2(self, src: *const u8, dst: *mut u8, n: usize) {
        const K: usize = 8;
        let z = size_of::<T>();
        // A chunk reads one item past its last even one: leave the last element to the tail
        // so that nothing beyond source element 2 (n - 1) is read.
        let chunks = n.saturating_sub(1) / K;
        for c in 0..chunks {
            // SAFETY: source items 2 K c .. 2 K (c + 1) - 1 <= 2 (n - 1), destination items
            // K c .. K (c + 1) <= n.
            unsafe {
                let v = read_unaligned(src.add(2 * K * c * z).cast::<[T; 2 * K]>());
                let out: [T; K] = std::array::from_fn(|i| v[2 * i]);
                write_unaligned(dst.add(K * c * z).cast::<[T; K]>(), out);
            }
        }
        for i in chunks * K..n {
            // SAFETY: per the contract.
            unsafe { self.copy(src.add(2 * i * z), dst.add(i * z)) };
        }
    }
}

/// An integer whose bytes can be reversed: one byte-swap unit.
pub trait Unit: Copy {
    fn swapped(self) -> Self;
}

macro_rules! unit {
    ($($t:ty),*) => {$(
        impl Unit for $t {
            #[inline(always)]
            fn swapped(self) -> Self {
                self.swap_bytes()
            }
        }
    )*};
}
unit!(u16, u32, u64, u128);

/// An element of `size_of::<T>()` bytes made of `U` units, each byte-reversed while copying
/// (a non-native byte order source; complex numbers swap per component).
pub struct Swapped<T, U>(PhantomData<(T, U)>);

impl<T, U> Swapped<T, U> {
    pub const fn new() -> Self {
        Swapped(PhantomData)
    }
}

impl<T, U> Clone for Swapped<T, U> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T, U> Copy for Swapped<T, U> {}

impl<T: Copy, U: Unit> Elem for Swapped<T, U> {
    #[inline(always)]
    fn size(self) -> usize {
        size_of::<T>()
    }
    #[inline(always)]
    fn plain(self) -> bool {
        false
    }
    #[inline(always)]
    unsafe fn copy(self, src: *const u8, dst: *mut u8) {
        let unit = size_of::<U>();
        for k in 0..size_of::<T>() / unit {
            // SAFETY: unit k lies inside the element, valid per the trait contract.
            unsafe {
                let v = read_unaligned(src.add(k * unit).cast::<U>());
                write_unaligned(dst.add(k * unit).cast::<U>(), v.swapped());
            }
        }
    }
}

/// Any other element: `size` bytes, byte-reversed per `unit` bytes when `unit > 1`.
#[derive(Clone, Copy)]
pub struct Dyn {
    pub size: usize,
    pub unit: usize,
}

impl Elem for Dyn {
    #[inline(always)]
    fn size(self) -> usize {
        self.size
    }
    #[inline(always)]
    fn plain(self) -> bool {
        self.unit <= 1
    }
    #[inline(always)]
    unsafe fn copy(self, src: *const u8, dst: *mut u8) {
        if self.unit <= 1 {
            // SAFETY: per the trait contract.
            unsafe { copy_nonoverlapping(src, dst, self.size) };
            return;
        }
        // The caller makes `unit` divide `size`. Bytes are exchanged pairwise, each pair read
        // before it is written, so `src == dst` (an in-place swap) works.
        let unit = self.unit;
        let mut k = 0;
        while k + unit <= self.size {
            for b in 0..unit.div_ceil(2) {
                let (lo, hi) = (k + b, k + unit - 1 - b);
                // SAFETY: bytes lo and hi of the element.
                unsafe {
                    let (x, y) = (*src.add(lo), *src.add(hi));
                    *dst.add(lo) = y;
                    *dst.add(hi) = x;
                }
            }
            k += unit;
        }
    }
}

/// One row: `n` elements, `d` and `s` bytes apart in the destination and the source.
///
/// # Safety
/// Every element address of the row is valid (source readable, destination writable).
#[inline(always)]
unsafe fn row<E: Elem>(e: E, dst: *mut u8, src: *const u8, n: usize, d: isize, s: isize) {
    let size = e.size();
    let z = size as isize;
    // SAFETY: in every loop, element i of the row, valid per the contract.
    unsafe {
        if d == z {
            if s == z {
                if e.plain() {
                    copy_nonoverlapping(src, dst, n * size);
                } else {
                    for i in 0..n {
                        e.copy(src.add(i * size), dst.add(i * size));
                    }
                }
            } else if s == 0 {
                for i in 0..n {
                    e.copy(src, dst.add(i * size));
                }
            } else if s == -z {
                let last = src.offset((n as isize - 1) * s);
                // Walk the source forwards from its lowest address, the destination backwards.
                for i in 0..n {
                    e.copy(last.add(i * size), dst.add((n - 1 - i) * size));
                }
            } else if s == 2 * z {
                e.gather2(src, dst, n);
            } else {
                for i in 0..n {
                    e.copy(src.offset(i as isize * s), dst.add(i * size));
                }
            }
        } else if s == z {
            for i in 0..n {
                e.copy(src.add(i * size), dst.offset(i as isize * d));
            }
        } else {
            for i in 0..n {
                e.copy(src.offset(i as isize * s), dst.offset(i as isize * d));
            }
        }
    }
}

/// Rows: `outer.n` rows of `inner`.
///
/// # Safety
/// Every element address of the two loops is valid.
#[inline(always)]
unsafe fn rows<E: Elem>(e: E, dst: *mut u8, src: *const u8, outer: Dim, inner: Dim) {
    if inner.n == 1 {
        // SAFETY: as documented; a column.
        return unsafe { row(e, dst, src, outer.n, outer.dst, outer.src) };
    }
    for i in 0..outer.n as isize {
        // SAFETY: row i, valid per the contract.
        unsafe {
            row(
                e,
                dst.offset(i * outer.dst),
                src.offset(i * outer.src),
                inner.n,
                inner.dst,
                inner.src,
            )
        };
    }
}

/// Tile edge, in elements, of the generic tiled transpose.
const TILE: usize = 32;

/// Tile sides (elements along `a`, elements along `b`) of the fast transpose for `size`-byte
/// items.
pub const fn fast_tile(size: usize) -> (usize, usize) {
    match size {
        4 => (64, 64),
        _ => (32, 32),
    }
}

/// The tile granule for splitting a tiled loop between threads.
pub const fn tile_granule(size: usize) -> usize {
    let (a, b) = fast_tile(size);
    if a > b { a } else { b }
}

/// Transpose-like copy over loops `a` (the source walks it densely) and `b` (the destination
/// walks it densely), in tiles so that both sides stay in cache while a tile is done.
///
/// # Safety
/// Every element address of the two loops is valid.
#[inline(always)]
unsafe fn tiles<E: Elem>(e: E, dst: *mut u8, src: *const u8, a: Dim, b: Dim, streaming: bool) {
    let z = e.size() as isize;
    if e.plain() && a.src == z && b.dst == z {
        // Streaming stores need 16-byte aligned destination rows.
        let nt = streaming
            && cfg!(target_arch = "x86_64")
            && (dst as usize | a.dst as usize).is_multiple_of(16);
        // SAFETY: as documented; the fast kernels need exactly these unit strides.
        unsafe {
            match (e.size(), nt) {
                (4, false) => return fast_tiles::<u32, 16, false>(dst, src, a, b),
                (4, true) => return fast_tiles::<u32, 16, true>(dst, src, a, b),
                (8, false) => return fast_tiles::<u64, 8, false>(dst, src, a, b),
                (8, true) => return fast_tiles::<u64, 8, true>(dst, src, a, b),
                _ => {}
            }
        }
    }
    for a0 in (0..a.n).step_by(TILE) {
        let a1 = (a0 + TILE).min(a.n);
        for b0 in (0..b.n).step_by(TILE) {
            let b1 = (b0 + TILE).min(b.n);
            // SAFETY: a sub-rectangle of the two loops.
            unsafe { scalar_block(e, dst, src, a, b, a0..a1, b0..b1) };
        }
    }
}

/// Element by element over `ia` x `ib`, `b` innermost (the destination's dense loop).
#[inline(always)]
unsafe fn scalar_block<E: Elem>(
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
        // SAFETY: element (i, b0) of the loops is valid.
        let (d, s) = unsafe { (dst.offset(i * a.dst), src.offset(i * a.src)) };
        for j in ib.clone() {
            let j = j as isize;
            // SAFETY: element (i, j) of the loops is valid.
            unsafe { e.copy(s.offset(j * b.src), d.offset(j * b.dst)) };
        }
    }
}

/// Tiled transpose of `T` items where `a.src == b.dst == size_of::<T>()`: each `B` x `B` block
/// is read as `B` source runs of `B` items (a cache line) into a local buffer, transposed there
/// and written as `B` destination runs, so every line of either side is touched once.
///
/// # Safety
/// Every element address of the two loops is valid.
#[inline(always)]
unsafe fn fast_tiles<T: Copy + Default, const B: usize, const NT: bool>(
    dst: *mut u8,
    src: *const u8,
    a: Dim,
    b: Dim,
) {
    let (ta, tb) = fast_tile(size_of::<T>());
    let z = size_of::<T>();
    // Start the blocks where source runs (along `a`) and destination runs (along `b`) begin
    // on cache lines, when the row strides keep that alignment; the heads go item by item.
    let ha = line_head(src as usize, b.src, z, a.n);
    let hb = line_head(dst as usize, a.dst, z, b.n);
    // SAFETY: the head strips lie inside the loops.
    unsafe {
        let e = Plain::<T>::new();
        scalar_block(e, dst, src, a, b, 0..ha, 0..b.n);
        scalar_block(e, dst, src, a, b, ha..a.n, 0..hb);
    }
    for a0 in (ha..a.n).step_by(ta) {
        let a1 = (a0 + ta).min(a.n);
        let fa = a0 + (a1 - a0) / B * B;
        for b0 in (hb..b.n).step_by(tb) {
            let b1 = (b0 + tb).min(b.n);
            let fb = b0 + (b1 - b0) / B * B;
            for i in (a0..fa).step_by(B) {
                for j in (b0..fb).step_by(B) {
                    // SAFETY: block (i..i + B, j..j + B) lies inside the loops.
                    unsafe {
                        block::<T, B, NT>(
                            dst.offset(i as isize * a.dst).add(j * z),
                            a.dst,
                            src.add(i * z).offset(j as isize * b.src),
                            b.src,
                        )
                    };
                }
            }
            // SAFETY: the edges of the tile, inside the loops.
            unsafe {
                let e = Plain::<T>::new();
                scalar_block(e, dst, src, a, b, fa..a1, b0..b1);
                scalar_block(e, dst, src, a, b, a0..fa, fb..b1);
            }
        }
    }
}

/// Items of `z` bytes to skip from `addr` to reach a 64-byte boundary (at most `n`), or 0 when
/// that can't align every row (`row` bytes apart) or falls between items.
fn line_head(addr: usize, row: isize, z: usize, n: usize) -> usize {
    let need = addr.wrapping_neg() % 64;
    if !row.unsigned_abs().is_multiple_of(64) || !need.is_multiple_of(z) {
        return 0;
    }
    (need / z).min(n)
}

/// One `B` x `B` block: destination row `i` (stride `d_row`) gets source column `i` of the
/// `B` source rows (stride `s_row`).
///
/// # Safety
/// `B` runs of `B` items at `src + j * s_row` readable, at `dst + i * d_row` writable.
#[inline(always)]
#[allow(clippy::needless_range_loop, reason = "index arithmetic reads clearer")]
unsafe fn block<T: Copy + Default, const B: usize, const NT: bool>(
    dst: *mut u8,
    d_row: isize,
    src: *const u8,
    s_row: isize,
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded contract; the sizes match the SIMD kernels' element types.
    unsafe {
        match (size_of::<T>(), B) {
            (4, 16) => return simd::block_u32::<NT>(dst, d_row, src, s_row),
            (8, 8) => return simd::block_u64::<NT>(dst, d_row, src, s_row),
            _ => {}
        }
    }
    let mut buf = [[T::default(); B]; B];
    for (j, line) in buf.iter_mut().enumerate() {
        // SAFETY: source run j.
        *line = unsafe { read_unaligned(src.offset(j as isize * s_row).cast::<[T; B]>()) };
    }
    for i in 0..B {
        let out: [T; B] = std::array::from_fn(|j| buf[j][i]);
        // SAFETY: destination run i.
        unsafe { write_unaligned(dst.offset(i as isize * d_row).cast::<[T; B]>(), out) };
    }
}

/// SSE2 (always there on x86_64) block transposes: a block of source lines is first copied to
/// an aligned local buffer (each source line read whole, once), then transposed 4x4 (u32) or
/// 2x2 (u64) in registers and written one whole destination line after the other.
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    #[repr(C, align(64))]
    struct Lines([[__m128i; 4]; 16]);

    /// Copy `rows` source lines of 64 bytes into a buffer.
    ///
    /// # Safety
    /// `rows` runs of 64 bytes at `src + j * s_row` readable.
    #[inline(always)]
    unsafe fn load_lines(rows: usize, src: *const u8, s_row: isize) -> Lines {
        // SAFETY: SSE2 is part of x86_64; memory per the contract.
        unsafe {
            let mut buf = Lines([[_mm_setzero_si128(); 4]; 16]);
            for (j, line) in buf.0.iter_mut().take(rows).enumerate() {
                let p = src.wrapping_offset(j as isize * s_row).cast::<__m128i>();
                for (k, v) in line.iter_mut().enumerate() {
                    *v = _mm_loadu_si128(p.add(k));
                }
            }
            buf
        }
    }

    /// Write one 64-byte destination line.
    ///
    /// # Safety
    /// 64 bytes at `p` writable (and 16-byte aligned when `NT`).
    #[inline(always)]
    unsafe fn store_line<const NT: bool>(p: *mut u8, line: [__m128i; 4]) {
        // SAFETY: SSE2 is part of x86_64; memory per the contract.
        unsafe {
            for (k, v) in line.into_iter().enumerate() {
                let q = p.add(16 * k).cast::<__m128i>();
                if NT {
                    _mm_stream_si128(q, v)
                } else {
                    _mm_storeu_si128(q, v)
                }
            }
        }
    }

    /// 16 x 16 four-byte items.
    ///
    /// # Safety
    /// 16 runs of 64 bytes at `src + j * s_row` readable, at `dst + i * d_row` writable (and
    /// 16-byte aligned when `NT`).
    #[inline(always)]
    #[allow(clippy::needless_range_loop, reason = "index arithmetic reads clearer")]
    pub unsafe fn block_u32<const NT: bool>(
        dst: *mut u8,
        d_row: isize,
        src: *const u8,
        s_row: isize,
    ) {
        // SAFETY: SSE2 is part of x86_64; memory per the contract.
        unsafe {
            let buf = load_lines(16, src, s_row);
            for ib in 0..4 {
                // Destination rows 4 ib.. 4 ib + 4: four 4 x 4 squares side by side.
                let mut rows = [[_mm_setzero_si128(); 4]; 4];
                for jb in 0..4 {
                    let r = |k: usize| _mm_castsi128_ps(buf.0[4 * jb + k][ib]);
                    let (r0, r1, r2, r3) = (r(0), r(1), r(2), r(3));
                    let t0 = _mm_unpacklo_ps(r0, r1);
                    let t1 = _mm_unpacklo_ps(r2, r3);
                    let t2 = _mm_unpackhi_ps(r0, r1);
                    let t3 = _mm_unpackhi_ps(r2, r3);
                    rows[0][jb] = _mm_castps_si128(_mm_movelh_ps(t0, t1));
                    rows[1][jb] = _mm_castps_si128(_mm_movehl_ps(t1, t0));
                    rows[2][jb] = _mm_castps_si128(_mm_movelh_ps(t2, t3));
                    rows[3][jb] = _mm_castps_si128(_mm_movehl_ps(t3, t2));
                }
                for (k, line) in rows.into_iter().enumerate() {
                    store_line::<NT>(dst.wrapping_offset((4 * ib + k) as isize * d_row), line);
                }
            }
        }
    }

    /// 8 x 8 eight-byte items.
    ///
    /// # Safety
    /// As for [`block_u32`], with 8 runs.
    #[inline(always)]
    #[allow(clippy::needless_range_loop, reason = "index arithmetic reads clearer")]
    pub unsafe fn block_u64<const NT: bool>(
        dst: *mut u8,
        d_row: isize,
        src: *const u8,
        s_row: isize,
    ) {
        // SAFETY: SSE2 is part of x86_64; memory per the contract.
        unsafe {
            let buf = load_lines(8, src, s_row);
            for ib in 0..4 {
                // Destination rows 2 ib and 2 ib + 1.
                let mut rows = [[_mm_setzero_si128(); 4]; 2];
                for jb in 0..4 {
                    let (r0, r1) = (buf.0[2 * jb][ib], buf.0[2 * jb + 1][ib]);
                    rows[0][jb] = _mm_unpacklo_epi64(r0, r1);
                    rows[1][jb] = _mm_unpackhi_epi64(r0, r1);
                }
                for (k, line) in rows.into_iter().enumerate() {
                    store_line::<NT>(dst.wrapping_offset((2 * ib + k) as isize * d_row), line);
                }
            }
        }
    }
}

/// The inner kernel at one position of the outer loops.
type Body<'a> = Box<dyn Fn(*mut u8, *const u8) + 'a>;

/// Run `kernel` over `plan` from `dst` / `src` (the plan's offsets already applied).
///
/// # Safety
/// Every element address the plan describes is valid (source readable, destination writable).
pub unsafe fn run<E: Elem>(
    e: E,
    dst: *mut u8,
    src: *const u8,
    plan: &Plan,
    kernel: Kernel,
    streaming: bool,
) {
    let dims = &plan.dims;
    let Some(&last) = dims.last() else {
        // SAFETY: one element.
        return unsafe { e.copy(src, dst) };
    };
    let one = Dim {
        n: 1,
        dst: 0,
        src: 0,
    };
    let (outer, body): (Vec<Dim>, Body<'_>) = match kernel {
        Kernel::Tile { a } if a + 1 < dims.len() => {
            let pa = dims[a];
            let outer = dims[..dims.len() - 1]
                .iter()
                .enumerate()
                .filter(|&(k, _)| k != a)
                .map(|(_, d)| *d)
                .collect();
            // SAFETY: each call is one position of the outer loops: valid per the contract.
            (
                outer,
                Box::new(move |d, s| unsafe { tiles(e, d, s, pa, last, streaming) }),
            )
        }
        _ => {
            let (outer, mid) = match dims.len() {
                1 => (&[][..], one),
                k => (&dims[..k - 2], dims[k - 2]),
            };
            // SAFETY: as above.
            (
                outer.to_vec(),
                Box::new(move |d, s| unsafe { rows(e, d, s, mid, last) }),
            )
        }
    };
    // SAFETY: the odometer only calls `body` at element positions of the outer loops.
    unsafe { odometer(&outer, dst, src, &*body) };
    #[cfg(target_arch = "x86_64")]
    if streaming {
        // Order the streaming stores before whatever the caller does next.
        // SAFETY: SSE2 is part of x86_64.
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
}

/// Call `body` at every position of the `outer` loops (outermost first).
///
/// # Safety
/// Every position is valid for `body`.
unsafe fn odometer(outer: &[Dim], dst: *mut u8, src: *const u8, body: &dyn Fn(*mut u8, *const u8)) {
    let mut idx = vec![0usize; outer.len()];
    let (mut d, mut s) = (dst, src);
    loop {
        body(d, s);
        let mut k = outer.len();
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            idx[k] += 1;
            d = d.wrapping_offset(outer[k].dst);
            s = s.wrapping_offset(outer[k].src);
            if idx[k] < outer[k].n {
                break;
            }
            idx[k] = 0;
            let n = outer[k].n as isize;
            d = d.wrapping_offset(n.wrapping_mul(outer[k].dst).wrapping_neg());
            s = s.wrapping_offset(n.wrapping_mul(outer[k].src).wrapping_neg());
        }
    }
}
