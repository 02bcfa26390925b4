//! The inner loops of the CPU copy engine and [`run`], which runs a plan with them: rows (a
//! `memcpy` of contiguous runs, specialised gathers and reversals) and, for transposes, the
//! cache-blocked tiles of [`super::tiles`].

use super::elem::Elem;
use super::tiles::{Loops, Options, tiles};
use crate::copy::plan::{Dim, Kernel, Plan};

/// One row: `n` elements, `d` and `s` bytes apart in the destination and the source;
/// `streaming`: a row contiguous in the destination is written with streaming stores (x86-64).
///
/// # Safety
/// Every element address of the row is valid (source readable, destination writable).
#[inline(always)]
unsafe fn row<E: Elem>(
    e: E,
    dst: *mut u8,
    src: *const u8,
    n: usize,
    (d, s): (isize, isize),
    streaming: bool,
) {
    let size = e.size();
    let z = size as isize;
    // Element `i` of a side that steps `step` bytes; each branch passes its constant step.
    let s_at = |i: usize, step: isize| src.wrapping_offset(i as isize * step);
    let d_at = |i: usize, step: isize| dst.wrapping_offset(i as isize * step);
    if d == z {
        if s == z {
            if e.plain() {
                #[cfg(target_arch = "x86_64")]
                if streaming {
                    // SAFETY: the whole row, contiguous on both sides, which the caller keeps
                    // apart.
                    return unsafe { super::simd::copy_streaming(dst, src, n * size) };
                }
                // SAFETY: the whole row, contiguous on both sides, which the caller keeps
                // apart.
                return unsafe { std::ptr::copy_nonoverlapping(src, dst, n * size) };
            }
            for i in 0..n {
                // SAFETY: source and destination element i (in place when `src == dst`,
                // which a non-plain copy allows).
                unsafe { e.copy(s_at(i, z), d_at(i, z)) };
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the row's elements (this function's contract).
        if streaming && unsafe { streamed(e, dst, src, n, s) } {
            return;
        }
        // SAFETY: the row's elements (this function's contract).
        unsafe { gather(e, src, s, 0..n, dst) };
    } else if s == z {
        for i in 0..n {
            // SAFETY: source and destination element i.
            unsafe { e.copy(s_at(i, z), d_at(i, d)) };
        }
    } else {
        for i in 0..n {
            // SAFETY: source and destination element i.
            unsafe { e.copy(s_at(i, s), d_at(i, d)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = streaming; // no streaming stores elsewhere
}

/// Items `items` of a row whose source steps `s` bytes (not the item size), written one after
/// another at `out` (item `items.start` first): specialised loops for a broadcast, a reversal
/// and every other item.
///
/// # Safety
/// Source items `items` of the row are readable, `items.len()` items at `out` writable.
#[inline(always)]
unsafe fn gather<E: Elem>(
    e: E,
    src: *const u8,
    s: isize,
    items: std::ops::Range<usize>,
    out: *mut u8,
) {
    let (z, n) = (e.size(), items.len());
    let from = src.wrapping_offset(items.start as isize * s);
    let out_at = |i: usize| out.wrapping_add(i * z);
    if s == 0 {
        for i in 0..n {
            // SAFETY: the (broadcast) source item and output item i.
            unsafe { e.copy(src, out_at(i)) };
        }
    } else if s == -(z as isize) && n > 0 {
        // Walk the source forwards from its lowest address, the output backwards.
        let last = from.wrapping_offset((n as isize - 1) * s);
        for i in 0..n {
            // SAFETY: source item n - 1 - i (from `items.start`) and output item n - 1 - i.
            unsafe { e.copy(last.wrapping_add(i * z), out_at(n - 1 - i)) };
        }
    } else if s == 2 * z as isize {
        // SAFETY: the items, every other one of the source.
        unsafe { e.gather2(from, out, n) };
    } else {
        for i in 0..n {
            // SAFETY: source and output item i.
            unsafe { e.copy(from.wrapping_offset(i as isize * s), out_at(i)) };
        }
    }
}

/// A row contiguous in the destination but not in the source, its whole destination lines
/// gathered into a buffer a page at a time (in the caches, where the gather's loops run as fast
/// as they do straight into the destination) and written from there with streaming stores; the
/// items before the first line boundary and after the last go straight to the destination.
/// `false` (nothing written) where items don't tile a line.
///
/// # Safety
/// As for [`row`], with `d` the item size.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn streamed<E: Elem>(e: E, dst: *mut u8, src: *const u8, n: usize, s: isize) -> bool {
    use super::blocks::LINE;
    use super::simd::{Bounce, stream_lines};
    let z = e.size();
    let need = (dst as usize).wrapping_neg() % LINE;
    if z == 0 || !LINE.is_multiple_of(z) || !need.is_multiple_of(z) {
        return false;
    }
    let head = (need / z).min(n);
    let lines = (n - head) * z / LINE;
    // SAFETY: items 0..head of the row, to the destination's first items.
    unsafe { gather(e, src, s, 0..head, dst) };
    let mut buf = Bounce::default();
    // Pages of lines; last first where the source runs backwards, so that it is read forwards.
    let pages = lines.div_ceil(Bounce::LINES);
    for k in 0..pages {
        let page = if s < 0 { pages - 1 - k } else { k };
        let line = page * Bounce::LINES;
        let count = (lines - line).min(Bounce::LINES);
        let (i0, i1) = (head + line * LINE / z, head + (line + count) * LINE / z);
        // One item more where the row has one: every other item then goes in whole vectors.
        let take = if i1 < n { i1 + 1 } else { i1 };
        // SAFETY: items `i0..take` (inside the row) into the buffer, which holds its lines and
        // one item (`z <= LINE`) more.
        unsafe { gather(e, src, s, i0..take, buf.as_mut_ptr()) };
        // SAFETY: destination items `i0..i1`: `count` whole lines, 64-byte aligned (the head
        // reached a line boundary), writable per the contract.
        unsafe { stream_lines(dst.wrapping_add(i0 * z), &buf, count) };
    }
    let done = head + lines * LINE / z;
    // SAFETY: the items after the last whole line, to their places.
    unsafe { gather(e, src, s, done..n, dst.wrapping_add(done * z)) };
    true
}

/// Rows: `outer.n` rows of `inner`.
///
/// # Safety
/// Every element address of the two loops is valid.
#[inline(always)]
unsafe fn rows<E: Elem>(
    e: E,
    dst: *mut u8,
    src: *const u8,
    outer: Dim,
    inner: Dim,
    streaming: bool,
) {
    if inner.n == 1 {
        // SAFETY: a column: the outer loop's elements, each one valid (this function's `# Safety`:
        // every element address of the loops is).
        return unsafe { row(e, dst, src, outer.n, (outer.dst, outer.src), streaming) };
    }
    for i in 0..outer.n as isize {
        let (d, s) = (
            dst.wrapping_offset(i * outer.dst),
            src.wrapping_offset(i * outer.src),
        );
        // SAFETY: row i, valid per the contract.
        unsafe { row(e, d, s, inner.n, (inner.dst, inner.src), streaming) };
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
    options: Options,
) {
    let dims = &plan.dims;
    let Some(&last) = dims.last() else {
        // SAFETY: a plan without loops is the one element at `src` / `dst`, readable / writable
        // (this function's contract).
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
            let mut outer: Vec<Dim> = (dims[..dims.len() - 1].iter().enumerate())
                .filter(|&(k, _)| k != a)
                .map(|(_, d)| *d)
                .collect();
            // An outer loop that carries on along the source rows from where `a` ends goes
            // inside the tiles, so that their source runs are long even where `a` is short.
            let ends = pa.src.checked_mul(pa.n as isize);
            let m = match outer.iter().rposition(|d| Some(d.src) == ends) {
                Some(k) => outer.remove(k),
                None => one,
            };
            let loops = Loops { m, a: pa, b: last };
            // SAFETY: each call is one position of the outer loops: valid per the contract.
            (
                outer,
                Box::new(move |d, s| unsafe { tiles(e, d, s, loops, options) }),
            )
        }
        _ => {
            let (outer, mid) = match dims.len() {
                1 => (&[][..], one),
                k => (&dims[..k - 2], dims[k - 2]),
            };
            // SAFETY: each call is one position of the outer loops, from which the `mid` x
            // `last` rows are element addresses of the plan, valid per this function's contract.
            (
                outer.to_vec(),
                Box::new(move |d, s| unsafe { rows(e, d, s, mid, last, options.streaming) }),
            )
        }
    };
    // SAFETY: the odometer only calls `body` at element positions of the outer loops.
    unsafe { odometer(&outer, dst, src, &*body) };
    #[cfg(target_arch = "x86_64")]
    if options.streaming {
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
