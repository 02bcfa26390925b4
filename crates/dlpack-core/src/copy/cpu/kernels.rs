//! The inner loops of the CPU copy engine and [`run`], which runs a plan with them: rows (a
//! `memcpy` of contiguous runs, specialised gathers and reversals) and, for transposes, the
//! cache-blocked tiles of [`super::tiles`].

use super::elem::Elem;
use super::tiles::{Loops, Options, tiles};
use crate::copy::plan::{Dim, Kernel, Plan};

/// One row: `n` elements, `d` and `s` bytes apart in the destination and the source;
/// `streaming`: a row contiguous on both sides is written with streaming stores.
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
                #[cfg(not(target_arch = "x86_64"))]
                let _ = streaming; // no streaming copy elsewhere
                // SAFETY: the whole row, contiguous on both sides, which the caller keeps
                // apart.
                return unsafe { std::ptr::copy_nonoverlapping(src, dst, n * size) };
            }
            for i in 0..n {
                // SAFETY: source and destination element i (in place when `src == dst`,
                // which a non-plain copy allows).
                unsafe { e.copy(s_at(i, z), d_at(i, z)) };
            }
        } else if s == 0 {
            for i in 0..n {
                // SAFETY: the (broadcast) source element and destination element i.
                unsafe { e.copy(src, d_at(i, z)) };
            }
        } else if s == -z {
            // Walk the source forwards from its lowest address, the destination backwards.
            let last = s_at(n - 1, s);
            for i in 0..n {
                let from = last.wrapping_add(i * size);
                // SAFETY: source element n - 1 - i and destination element n - 1 - i.
                unsafe { e.copy(from, d_at(n - 1 - i, z)) };
            }
        } else if s == 2 * z {
            // SAFETY: the row's elements, every other one of the source.
            unsafe { e.gather2(src, dst, n) };
        } else {
            for i in 0..n {
                // SAFETY: source and destination element i.
                unsafe { e.copy(s_at(i, s), d_at(i, z)) };
            }
        }
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
