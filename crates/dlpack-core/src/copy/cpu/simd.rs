//! x86-64 block transposes ([`Block`]s) of one-, two-, four- and eight-byte items. SSE2 is part
//! of x86-64: a block's source lines are first copied to an aligned local buffer (each read
//! whole, once), then transposed in squares of 16-byte registers (16x16 u8, 8x8 u16, 4x4 u32,
//! 2x2 u64). With AVX-512F (checked at run time, [`Avx512`]) each line of four- and eight-byte
//! items is one register, and the block is transposed in registers alone.
//! `NT`: write with streaming (non-temporal) stores, which need aligned destination rows.

use std::arch::x86_64::*;

use super::blocks::Block;

/// Proof that the CPU has AVX-512F: only [`Avx512::detect`] makes one.
#[derive(Clone, Copy, Debug)]
pub struct Avx512(());

impl Avx512 {
    pub fn detect() -> Option<Self> {
        std::arch::is_x86_feature_detected!("avx512f").then_some(Avx512(()))
    }
}

/// 64 x 64 one-byte items with SSE2.
#[derive(Clone, Copy)]
pub struct Sse2U8<const NT: bool>;
/// 32 x 32 two-byte items with SSE2.
#[derive(Clone, Copy)]
pub struct Sse2U16<const NT: bool>;
/// 16 x 16 four-byte items with SSE2.
#[derive(Clone, Copy)]
pub struct Sse2U32<const NT: bool>;
/// 8 x 8 eight-byte items with SSE2.
#[derive(Clone, Copy)]
pub struct Sse2U64<const NT: bool>;
/// 16 x 16 four-byte items with AVX-512F.
#[derive(Clone, Copy)]
pub struct Avx512U32<const NT: bool>(pub Avx512);
/// 8 x 8 eight-byte items with AVX-512F.
#[derive(Clone, Copy)]
pub struct Avx512U64<const NT: bool>(pub Avx512);

/// The destination alignment streaming stores of `bytes` need.
const fn nt_align(nt: bool, bytes: usize) -> usize {
    if nt { bytes } else { 1 }
}

impl<const NT: bool> Block for Sse2U8<NT> {
    type Item = u8;
    const B: usize = 64;
    const DST_ALIGN: usize = nt_align(NT, 16);
    const STREAMING: bool = NT;

    #[inline(always)]
    unsafe fn block(self, dst: *mut u8, d_row: isize, src: *const u8, s_row: isize) {
        // SAFETY: SSE2 is part of x86-64; memory per the contract.
        unsafe { sse2_squares::<64, 16, NT>(dst, d_row, src, s_row) }
    }
}

impl<const NT: bool> Block for Sse2U16<NT> {
    type Item = u16;
    const B: usize = 32;
    const DST_ALIGN: usize = nt_align(NT, 16);
    const STREAMING: bool = NT;

    #[inline(always)]
    unsafe fn block(self, dst: *mut u8, d_row: isize, src: *const u8, s_row: isize) {
        // SAFETY: SSE2 is part of x86-64; memory per the contract.
        unsafe { sse2_squares::<32, 8, NT>(dst, d_row, src, s_row) }
    }
}

impl<const NT: bool> Block for Sse2U32<NT> {
    type Item = u32;
    const B: usize = 16;
    const DST_ALIGN: usize = nt_align(NT, 16);
    const STREAMING: bool = NT;

    #[inline(always)]
    unsafe fn block(self, dst: *mut u8, d_row: isize, src: *const u8, s_row: isize) {
        // SAFETY: SSE2 is part of x86-64; memory per the contract.
        unsafe { sse2_u32::<NT>(dst, d_row, src, s_row) }
    }
}

impl<const NT: bool> Block for Sse2U64<NT> {
    type Item = u64;
    const B: usize = 8;
    const DST_ALIGN: usize = nt_align(NT, 16);
    const STREAMING: bool = NT;

    #[inline(always)]
    unsafe fn block(self, dst: *mut u8, d_row: isize, src: *const u8, s_row: isize) {
        // SAFETY: SSE2 is part of x86-64; memory per the contract.
        unsafe { sse2_u64::<NT>(dst, d_row, src, s_row) }
    }
}

/// `B` x `B` items of `16 / S` bytes (`B` lines), as `(B / S)^2` squares of `S` registers.
///
/// # Safety
/// As for [`Block::block`], with a 16-byte [`Block::DST_ALIGN`] when `NT`.
#[inline]
#[target_feature(enable = "sse2")]
unsafe fn sse2_squares<const B: usize, const S: usize, const NT: bool>(
    dst: *mut u8,
    d_row: isize,
    src: *const u8,
    s_row: isize,
) {
    // SAFETY: `B` source lines, per the contract.
    let buf = unsafe { load_lines::<B>(src, s_row) };
    // Each line is 4 registers, so B = 4 S: the squares are 4 x 4.
    for ib in 0..4 {
        // Destination rows S ib.. S ib + S: four squares side by side.
        let mut rows = [[_mm_setzero_si128(); 4]; S];
        for (jb, lines) in buf.0.chunks_exact(S).enumerate() {
            let mut r = [_mm_setzero_si128(); S];
            for (v, line) in r.iter_mut().zip(lines) {
                *v = line[ib];
            }
            let columns = if S == 16 {
                round::<S, 8, 8>(round::<S, 4, 4>(round::<S, 2, 2>(round::<S, 1, 1>(r))))
            } else {
                round::<S, 4, 8>(round::<S, 2, 4>(round::<S, 1, 2>(r)))
            };
            for (row, column) in rows.iter_mut().zip(columns) {
                row[jb % 4] = column;
            }
        }
        for (k, &line) in rows.iter().enumerate() {
            let d = dst.wrapping_offset((S * ib + k) as isize * d_row);
            // SAFETY: destination row S ib + k, writable and aligned per the contract.
            unsafe { store_line::<NT>(d, line) };
        }
    }
}

/// One round of a square transpose: interleave items of `W` bytes of the registers `H` apart
/// in each group of `2 H`, low halves to the even slot. Rounds of `H = 1, 2, 4..` with `W`
/// from the item size up to 8 leave column `k` in register `k`.
#[inline]
#[target_feature(enable = "sse2")]
fn round<const S: usize, const H: usize, const W: usize>(r: [__m128i; S]) -> [__m128i; S] {
    let mut t = r;
    for (out, group) in t.chunks_exact_mut(2 * H).zip(r.chunks_exact(2 * H)) {
        let Some((xs, ys)) = group.split_at_checked(H) else {
            continue;
        };
        for ((pair, &x), &y) in out.chunks_exact_mut(2).zip(xs).zip(ys) {
            if let [lo, hi] = pair {
                (*lo, *hi) = match W {
                    1 => (_mm_unpacklo_epi8(x, y), _mm_unpackhi_epi8(x, y)),
                    2 => (_mm_unpacklo_epi16(x, y), _mm_unpackhi_epi16(x, y)),
                    4 => (_mm_unpacklo_epi32(x, y), _mm_unpackhi_epi32(x, y)),
                    _ => (_mm_unpacklo_epi64(x, y), _mm_unpackhi_epi64(x, y)),
                };
            }
        }
    }
    t
}

/// 16 x 16 four-byte items, as sixteen 4 x 4 squares.
///
/// # Safety
/// As for [`Block::block`], with a 16-byte [`Block::DST_ALIGN`] when `NT`.
#[inline]
#[target_feature(enable = "sse2")]
#[allow(clippy::needless_range_loop, reason = "index arithmetic reads clearer")]
unsafe fn sse2_u32<const NT: bool>(dst: *mut u8, d_row: isize, src: *const u8, s_row: isize) {
    // SAFETY: 16 source lines, per the contract.
    let buf = unsafe { load_lines::<16>(src, s_row) };
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
        for (k, &line) in rows.iter().enumerate() {
            let d = dst.wrapping_offset((4 * ib + k) as isize * d_row);
            // SAFETY: destination row 4 ib + k, writable and aligned per the contract.
            unsafe { store_line::<NT>(d, line) };
        }
    }
}

/// 8 x 8 eight-byte items, as sixteen 2 x 2 squares.
///
/// # Safety
/// As for [`Block::block`], with a 16-byte [`Block::DST_ALIGN`] when `NT`.
#[inline]
#[target_feature(enable = "sse2")]
#[allow(clippy::needless_range_loop, reason = "index arithmetic reads clearer")]
unsafe fn sse2_u64<const NT: bool>(dst: *mut u8, d_row: isize, src: *const u8, s_row: isize) {
    // SAFETY: 8 source lines, per the contract.
    let buf = unsafe { load_lines::<8>(src, s_row) };
    for ib in 0..4 {
        // Destination rows 2 ib and 2 ib + 1.
        let mut rows = [[_mm_setzero_si128(); 4]; 2];
        for jb in 0..4 {
            let (r0, r1) = (buf.0[2 * jb][ib], buf.0[2 * jb + 1][ib]);
            rows[0][jb] = _mm_unpacklo_epi64(r0, r1);
            rows[1][jb] = _mm_unpackhi_epi64(r0, r1);
        }
        for (k, &line) in rows.iter().enumerate() {
            let d = dst.wrapping_offset((2 * ib + k) as isize * d_row);
            // SAFETY: destination row 2 ib + k, writable and aligned per the contract.
            unsafe { store_line::<NT>(d, line) };
        }
    }
}

#[repr(C, align(64))]
struct Lines<const N: usize>([[__m128i; 4]; N]);

/// Copy `N` source lines of 64 bytes into a buffer.
///
/// # Safety
/// `N` runs of 64 bytes at `src + j * s_row` readable.
#[inline]
#[target_feature(enable = "sse2")]
unsafe fn load_lines<const N: usize>(src: *const u8, s_row: isize) -> Lines<N> {
    let mut buf = Lines([[_mm_setzero_si128(); 4]; N]);
    for (j, line) in buf.0.iter_mut().enumerate() {
        let p = src.wrapping_offset(j as isize * s_row).cast::<__m128i>();
        for (k, v) in line.iter_mut().enumerate() {
            // SAFETY: bytes 16 k.. 16 k + 16 of source line j (the contract); unaligned.
            *v = unsafe { _mm_loadu_si128(p.wrapping_add(k)) };
        }
    }
    buf
}

/// Write one 64-byte destination line.
///
/// # Safety
/// 64 bytes at `p` writable (and 16-byte aligned when `NT`).
#[inline]
#[target_feature(enable = "sse2")]
unsafe fn store_line<const NT: bool>(p: *mut u8, line: [__m128i; 4]) {
    for (k, &v) in line.iter().enumerate() {
        let q = p.wrapping_add(16 * k).cast::<__m128i>();
        if NT {
            // SAFETY: bytes 16 k.. 16 k + 16 of the line, writable and 16-byte aligned.
            unsafe { _mm_stream_si128(q, v) };
        } else {
            // SAFETY: bytes 16 k.. 16 k + 16 of the line, writable (this function's contract);
            // an unaligned store.
            unsafe { _mm_storeu_si128(q, v) };
        }
    }
}

impl<const NT: bool> Block for Avx512U32<NT> {
    type Item = u32;
    const B: usize = 16;
    const DST_ALIGN: usize = nt_align(NT, 64);
    const STREAMING: bool = NT;

    #[inline(always)]
    unsafe fn block(self, dst: *mut u8, d_row: isize, src: *const u8, s_row: isize) {
        // SAFETY: the token shows the CPU has AVX-512F; memory per the contract.
        unsafe { avx512_u32::<NT>(dst, d_row, src, s_row) }
    }
}

impl<const NT: bool> Block for Avx512U64<NT> {
    type Item = u64;
    const B: usize = 8;
    const DST_ALIGN: usize = nt_align(NT, 64);
    const STREAMING: bool = NT;

    #[inline(always)]
    unsafe fn block(self, dst: *mut u8, d_row: isize, src: *const u8, s_row: isize) {
        // SAFETY: the token shows the CPU has AVX-512F; memory per the contract.
        unsafe { avx512_u64::<NT>(dst, d_row, src, s_row) }
    }
}

/// Load `N` lines of 64 bytes.
///
/// # Safety
/// `N` runs of 64 bytes at `src + j * s_row` readable.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_zmm<const N: usize>(src: *const u8, s_row: isize) -> [__m512i; N] {
    let mut r = [_mm512_setzero_si512(); N];
    for (j, v) in r.iter_mut().enumerate() {
        let p = src.wrapping_offset(j as isize * s_row).cast::<__m512i>();
        // SAFETY: source line j (the contract); unaligned.
        *v = unsafe { _mm512_loadu_si512(p) };
    }
    r
}

/// Store one 64-byte line.
///
/// # Safety
/// 64 bytes at `p` writable (and 64-byte aligned when `NT`).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store_zmm<const NT: bool>(p: *mut u8, v: __m512i) {
    if NT {
        // SAFETY: the line is writable and 64-byte aligned (the contract).
        unsafe { _mm512_stream_si512(p.cast(), v) };
    } else {
        // SAFETY: the line is writable; unaligned.
        unsafe { _mm512_storeu_si512(p.cast(), v) };
    }
}

/// 16 x 16 four-byte items: 32-bit, 64-bit and two 128-bit lane interleaves.
///
/// # Safety
/// As for [`Block::block`], with a 64-byte [`Block::DST_ALIGN`] when `NT`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn avx512_u32<const NT: bool>(dst: *mut u8, d_row: isize, src: *const u8, s_row: isize) {
    // SAFETY: 16 source lines, per the contract.
    let r = unsafe { load_zmm::<16>(src, s_row) };
    // Within each 128-bit lane L (columns 4 L..4 L + 4): t[2 k] holds columns 4 L and 4 L + 1
    // of rows 2 k and 2 k + 1 interleaved, t[2 k + 1] columns 4 L + 2 and 4 L + 3.
    let mut t = [_mm512_setzero_si512(); 16];
    for k in 0..8 {
        t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    // u[4 k + m]: lane L holds column 4 L + [0, 2, 1, 3][m] of rows 4 k..4 k + 4.
    let mut u = [_mm512_setzero_si512(); 16];
    for k in 0..4 {
        for h in 0..2 {
            u[4 * k + h] = _mm512_unpacklo_epi64(t[4 * k + h], t[4 * k + 2 + h]);
            u[4 * k + 2 + h] = _mm512_unpackhi_epi64(t[4 * k + h], t[4 * k + 2 + h]);
        }
    }
    // Gather the lanes: v[8 k + m] holds two columns of rows 8 k..8 k + 8, w one whole column.
    let mut v = [_mm512_setzero_si512(); 16];
    for k in 0..2 {
        for m in 0..4 {
            v[8 * k + m] = _mm512_shuffle_i32x4::<0x88>(u[8 * k + m], u[8 * k + 4 + m]);
            v[8 * k + 4 + m] = _mm512_shuffle_i32x4::<0xDD>(u[8 * k + m], u[8 * k + 4 + m]);
        }
    }
    // w[m] is column COLUMN[m].
    const COLUMN: [isize; 16] = [0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15];
    for m in 0..8 {
        let lo = _mm512_shuffle_i32x4::<0x88>(v[m], v[8 + m]);
        let hi = _mm512_shuffle_i32x4::<0xDD>(v[m], v[8 + m]);
        for (w, column) in [(lo, COLUMN[m]), (hi, COLUMN[8 + m])] {
            // SAFETY: destination row `column`, writable and aligned per the contract.
            unsafe { store_zmm::<NT>(dst.wrapping_offset(column * d_row), w) };
        }
    }
}

/// 8 x 8 eight-byte items: a 64-bit and two 128-bit lane interleaves.
///
/// # Safety
/// As for [`Block::block`], with a 64-byte [`Block::DST_ALIGN`] when `NT`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn avx512_u64<const NT: bool>(dst: *mut u8, d_row: isize, src: *const u8, s_row: isize) {
    // SAFETY: 8 source lines, per the contract.
    let r = unsafe { load_zmm::<8>(src, s_row) };
    // t[2 k + h]: lane L holds column 2 L + h of rows 2 k and 2 k + 1.
    let mut t = [_mm512_setzero_si512(); 8];
    for k in 0..4 {
        t[2 * k] = _mm512_unpacklo_epi64(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi64(r[2 * k], r[2 * k + 1]);
    }
    for h in 0..2 {
        // Rows 0..4 and 4..8 of columns h + 2 s and h + 2 s + 4 (s = 0: 0x88, s = 1: 0xDD).
        let x = [
            _mm512_shuffle_i64x2::<0x88>(t[h], t[2 + h]),
            _mm512_shuffle_i64x2::<0xDD>(t[h], t[2 + h]),
        ];
        let y = [
            _mm512_shuffle_i64x2::<0x88>(t[4 + h], t[6 + h]),
            _mm512_shuffle_i64x2::<0xDD>(t[4 + h], t[6 + h]),
        ];
        for s in 0..2 {
            let lo = _mm512_shuffle_i64x2::<0x88>(x[s], y[s]);
            let hi = _mm512_shuffle_i64x2::<0xDD>(x[s], y[s]);
            let column = (h + 2 * s) as isize;
            for (w, column) in [(lo, column), (hi, column + 4)] {
                // SAFETY: destination row `column`, writable and aligned per the contract.
                unsafe { store_zmm::<NT>(dst.wrapping_offset(column * d_row), w) };
            }
        }
    }
}

/// Copy `n` bytes from `src` to `dst` (apart), writing the destination's whole lines with
/// streaming stores: glibc's `memcpy` keeps ordinary stores up to its non-temporal threshold
/// (three quarters of what the CPU reports as its shared cache, hundreds of MiB on some VMs),
/// and those read every destination line from memory before overwriting it. The partial
/// lines at either end get ordinary stores. The caller orders the stores (`sfence`) after
/// the copy.
///
/// # Safety
/// `n` bytes at `src` are readable, `n` at `dst` writable, and the two don't overlap.
#[inline]
#[target_feature(enable = "sse2")]
pub unsafe fn copy_streaming(dst: *mut u8, src: *const u8, n: usize) {
    const L: usize = super::blocks::LINE;
    let head = ((dst as usize).wrapping_neg() % L).min(n);
    let lines = (n - head) / L;
    // SAFETY: the first `head` bytes of both runs (the contract).
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let (mut d, mut s) = (dst.wrapping_add(head), src.wrapping_add(head));
    for _ in 0..lines {
        let (q, p) = (s.cast::<__m128i>(), d.cast::<__m128i>());
        // SAFETY: a whole line of the source run, readable (the contract), in four unaligned
        // loads.
        let v = [0, 1, 2, 3].map(|k| unsafe { _mm_loadu_si128(q.wrapping_add(k)) });
        for (k, v) in v.into_iter().enumerate() {
            // SAFETY: quarter `k` of a whole destination line, writable (the
            // contract) and 16-byte aligned (the head took `d` to a line boundary).
            unsafe { _mm_stream_si128(p.wrapping_add(k), v) };
        }
        (d, s) = (d.wrapping_add(L), s.wrapping_add(L));
    }
    // SAFETY: the rest of both runs, `n - head - lines * L` bytes.
    unsafe { std::ptr::copy_nonoverlapping(s, d, n - head - lines * L) };
}

/// Lines gathered for [`stream_lines`], and a line more (for the item a gather may take past
/// its last line), 64-byte aligned: a page, which stays in the nearest cache.
#[repr(C, align(64))]
pub struct Bounce([u8; Bounce::BYTES + 64]);

impl Bounce {
    const BYTES: usize = 4096;
    /// Lines it holds for streaming.
    pub const LINES: usize = Bounce::BYTES / 64;

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
}

impl Default for Bounce {
    fn default() -> Self {
        Bounce([0; Bounce::BYTES + 64])
    }
}

/// Write the first `lines` lines of `buf` to `dst` with streaming stores. The caller orders
/// them (`sfence`) after its copy.
///
/// # Safety
/// `lines <= Bounce::LINES`; `lines` whole lines at `dst` writable and 64-byte aligned.
#[inline]
#[target_feature(enable = "sse2")]
pub unsafe fn stream_lines(dst: *mut u8, buf: &Bounce, lines: usize) {
    let (q, p) = (buf.0.as_ptr().cast::<__m128i>(), dst.cast::<__m128i>());
    for k in 0..4 * lines.min(Bounce::LINES) {
        // SAFETY: quarter `k % 4` of buffer line `k / 4`, 16-byte aligned (the buffer is
        // 64-byte aligned).
        let v = unsafe { _mm_load_si128(q.wrapping_add(k)) };
        // SAFETY: the same quarter of destination line `k / 4`, writable and 16-byte aligned
        // (the contract).
        unsafe { _mm_stream_si128(p.wrapping_add(k), v) };
    }
}
