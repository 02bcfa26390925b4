//! The engine itself: thread and kernel choice for one strided copy, and the overlap checks.

use std::time::Instant;

use super::elem::{Dyn, Plain, Swapped};
use super::kernels;
use super::tiles::{self, Isa, Options};
use super::tune::{self, Band, Choice, Class, Limits, Lookup, ONE_THREAD, Tuner};
use crate::copy::plan::{self, Kernel, Plan};
use crate::layout::strides_nest;

/// A strided array in bytes: element `i` is at `ptr + sum(i_k * strides[k])`.
#[derive(Clone, Debug)]
pub struct Strided {
    pub ptr: *mut u8,
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
}

/// How a copy chooses its threads and stores, and which block kernels it may use.
#[derive(Clone, Copy)]
pub(super) struct Config {
    /// The choices measured per class and band (the process's, but in tests).
    pub(super) tuner: &'static Tuner,
    /// This choice whatever the size instead (tests and benchmarks): exactly its threads,
    /// where the copy can be cut into that many pieces.
    pub(super) forced: Option<Choice>,
    pub(super) isa: Isa,
}

impl Config {
    /// The process's: measured choices, the CPU's instructions.
    pub(super) fn new() -> Self {
        Config {
            tuner: Tuner::process(),
            forced: None,
            isa: Isa::detect(),
        }
    }

    /// `threads` and `streaming` for every copy.
    #[cfg(test)]
    pub(super) fn fixed(threads: usize, streaming: bool) -> Self {
        Config {
            forced: Some(Choice { threads, streaming }),
            ..Config::new()
        }
    }
}

/// A pointer handed to a worker thread.
#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: the engine's callers guarantee the memory stays valid for the whole (scoped) copy and
// the threads write disjoint elements.
unsafe impl Send for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut u8 {
        self.0
    }
}

/// Copy `src` into `dst` (same shape; `itemsize`-byte elements).
///
/// `swap_unit`: reverse the bytes of every `swap_unit`-byte unit of each element while copying
/// (a non-native byte order source: `Some(itemsize)` for scalars, the component size for complex
/// types; `None` or `Some(1)`: plain copy; a unit that doesn't divide `itemsize` swaps whole
/// elements). Strides may be anything: negative, zero (broadcast) on the source, not multiples
/// of `itemsize`. The destination doesn't overlap the source (the caller stages through a
/// temporary otherwise), except that `src` may be exactly `dst` (same pointer and strides): an
/// in-place byte swap. A destination whose elements may overlap one another is written by one
/// thread, in plan order (callers refuse the ones known to overlap). Shapes or stride lists
/// that don't match copy nothing. From [`PARALLEL_THRESHOLD`](super::PARALLEL_THRESHOLD)
/// bytes up the work may be split between threads, and from
/// [`STREAMING_THRESHOLD`](super::STREAMING_THRESHOLD) up written with streaming stores, as
/// measured on this machine ([`super::tune`]). Never touches Python and never panics.
///
/// # Safety
/// Every byte of every element the two layouts address is readable (`src`) or writable (`dst`)
/// for the whole call.
pub unsafe fn copy_strided(
    dst: &Strided,
    src: &Strided,
    itemsize: usize,
    swap_unit: Option<usize>,
) {
    // SAFETY: every byte the layouts address is readable (`src`) or writable (`dst`) for the
    // call (this function's contract), all that `copy_strided_with` needs.
    unsafe { copy_strided_with(dst, src, itemsize, swap_unit, Config::new()) }
}

/// One copy's plan and how to run its pieces.
struct Job {
    dst: SendPtr,
    src: SendPtr,
    plan: Plan,
    kernel: Kernel,
    itemsize: usize,
    unit: usize,
    isa: Isa,
    /// The destination's elements are disjoint, so pieces may go to different threads.
    threads_ok: bool,
}

/// [`copy_strided`] with an explicit configuration.
pub(super) unsafe fn copy_strided_with(
    dst: &Strided,
    src: &Strided,
    itemsize: usize,
    swap_unit: Option<usize>,
    config: Config,
) {
    let ndim = dst.shape.len();
    if itemsize == 0
        || src.shape != dst.shape
        || dst.strides.len() != ndim
        || src.strides.len() != ndim
    {
        return;
    }
    let unit = swap_unit_for(itemsize, swap_unit);
    if unit == 0 && dst.ptr == src.ptr && dst.strides == src.strides {
        return; // copying onto itself
    }
    let Some(plan) = plan::plan(&dst.shape, &dst.strides, &src.strides) else {
        return;
    };
    let kernel = plan::choose_kernel(&plan, itemsize);
    let bytes = plan.numel().saturating_mul(itemsize);
    // Threads write disjoint parts of the plan, which are disjoint bytes only when the
    // destination's elements are: otherwise (a layout the caller couldn't settle) one thread
    // writes them all, in plan order.
    let mut dst_dims: Vec<(u64, u64)> = (plan.dims.iter())
        .map(|d| (d.n as u64, d.dst.unsigned_abs() as u64))
        .collect();
    let threads_ok = strides_nest(&mut dst_dims, itemsize as u64);
    let class = class_of(&plan, kernel, itemsize, unit);
    let job = Job {
        dst: SendPtr(dst.ptr),
        src: SendPtr(src.ptr),
        plan,
        kernel,
        itemsize,
        unit,
        isa: config.isa,
        threads_ok,
    };
    if let Some(choice) = config.forced {
        // SAFETY: the plan addresses exactly the caller's elements (this function's contract).
        return unsafe { job.run(&job.plan, choice.threads, choice) };
    }
    let tuner = config.tuner;
    let limits = &tuner.limits;
    let band = Band::of(bytes, limits).filter(|_| threads_ok);
    let choice = match band.map(|band| tuner.lookup(class, band)) {
        None => ONE_THREAD,
        Some(Lookup::Known(choice)) => choice,
        // SAFETY: as above.
        Some(Lookup::Measure(cal)) => return unsafe { job.calibrate(cal, limits, bytes) },
    };
    // SAFETY: as above.
    unsafe { job.run(&job.plan, limits.threads_for(bytes, choice), choice) }
}

/// The kind of copy a plan and kernel make, for choosing threads and stores.
pub(super) fn class_of(plan: &Plan, kernel: Kernel, itemsize: usize, unit: usize) -> Class {
    let z = itemsize as isize;
    match (unit, kernel, plan.dims.last()) {
        (1.., _, _) => Class::Swap,
        (0, Kernel::Tile { .. }, _) => Class::Tiles,
        (0, Kernel::Rows, Some(d)) if d.dst != z || d.src != z => Class::Gather,
        (0, Kernel::Rows, _) => Class::Contiguous,
    }
}

impl Job {
    /// Run `plan` (this copy's, or a piece of it) with `threads` threads, writing as `choice`
    /// says.
    ///
    /// # Safety
    /// `plan` addresses a part of the caller's elements, valid for the whole call.
    unsafe fn run(&self, plan: &Plan, threads: usize, choice: Choice) {
        let threads = if self.threads_ok { threads } else { 1 };
        let options = Options {
            streaming: choice.streaming,
            isa: self.isa,
        };
        let (kernel, itemsize, unit) = (self.kernel, self.itemsize, self.unit);
        let (dst_ptr, src_ptr) = (self.dst, self.src);
        let run = move |piece: &Plan| {
            // SAFETY: each piece addresses a disjoint part of the caller's elements, valid for
            // the whole call (this function's contract); a piece on another thread is joined by
            // the scope below before the call returns.
            unsafe {
                run_piece(
                    dst_ptr.get(),
                    src_ptr.get(),
                    piece,
                    kernel,
                    itemsize,
                    unit,
                    options,
                )
            }
        };
        let split = (threads > 1)
            .then(|| plan::split_dim(plan, kernel, threads, tiles::tile_granule(itemsize)))
            .flatten();
        let Some((dim, granule)) = split else {
            return run(plan);
        };
        let pieces = plan::split(plan, dim, granule, threads);
        let Some((first, rest)) = pieces.split_first() else {
            return;
        };
        std::thread::scope(|scope| {
            let mut inline = Vec::new();
            for piece in rest {
                let work = move || run(piece);
                if std::thread::Builder::new()
                    .name("dlpack-copy".into())
                    .spawn_scoped(scope, work)
                    .is_err()
                {
                    inline.push(piece); // no thread to be had: do it here
                }
            }
            for piece in std::iter::once(first).chain(inline) {
                run(piece);
            }
        });
    }

    /// Measure the candidates on chunks of this copy (`bytes` bytes), keep the choice, and copy
    /// the rest with it. Each round runs every candidate on a chunk of its own, in an order
    /// that turns from round to round so that none always follows another. Where the chunks'
    /// memory isn't all mapped yet (memory never written before, as a fresh destination's is),
    /// they would time the kernel mapping pages, not the copy: such a copy, and one that can't
    /// be cut into enough chunks of the size the calibration wants, runs as the first (cheapest)
    /// candidate and leaves the measuring to a later one.
    ///
    /// # Safety
    /// As for [`Job::run`], with the whole plan.
    unsafe fn calibrate(&self, cal: tune::Calibration<'_>, limits: &Limits, bytes: usize) {
        let k = cal.candidates.len();
        let most = cal.candidates.iter().map(|c| c.threads).max().unwrap_or(1);
        let cut = limits
            .calibration_chunks(bytes, k, most)
            .and_then(|(rounds, chunk)| {
                let (dim, steps) = self.chunks(bytes, chunk, k * rounds)?;
                let region = plan::slice(&self.plan, dim, 0..steps * k * rounds);
                self.mapped(&region).then_some((rounds, dim, steps))
            });
        let first = cal.candidates.first().copied().unwrap_or(ONE_THREAD);
        let Some((rounds, dim, steps)) = cut else {
            drop(cal);
            // SAFETY: the whole plan (the contract).
            return unsafe { self.run(&self.plan, limits.threads_for(bytes, first), first) };
        };
        let mut trials = vec![Vec::with_capacity(rounds); k];
        let (mut at, mut calibrated) = (0, 0);
        let started = Instant::now();
        for round in 0..rounds {
            for turn in 0..k {
                let c = (turn + round) % k;
                let piece = plan::slice(&self.plan, dim, at..at + steps);
                let piece_bytes = piece.numel().saturating_mul(self.itemsize);
                let choice = cal.candidates[c];
                let t = Instant::now();
                // SAFETY: steps `at..at + steps` of one loop of the plan: a part of the caller's
                // elements.
                unsafe { self.run(&piece, choice.threads, choice) };
                trials[c].push(t.elapsed().as_secs_f64() / piece_bytes.max(1) as f64);
                (at, calibrated) = (at + steps, calibrated + piece_bytes);
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        let choice = cal.keep(&trials, bytes, calibrated, seconds);
        let rest = plan::slice(&self.plan, dim, at..self.plan.dims[dim].n);
        let rest_bytes = rest.numel().saturating_mul(self.itemsize);
        if rest_bytes > 0 {
            // SAFETY: the steps of that loop from `at` on: the rest of the caller's elements.
            unsafe { self.run(&rest, limits.threads_for(rest_bytes, choice), choice) };
        }
    }

    /// Whether the pages `piece` reads and writes are all mapped, so that copying it takes no
    /// page faults (true where that can't be told).
    fn mapped(&self, piece: &Plan) -> bool {
        let span = |base: SendPtr, offset: isize, stride: fn(&plan::Dim) -> isize| {
            let first = base.get().wrapping_offset(offset) as usize;
            let (mut lo, mut hi) = (first, first.wrapping_add(self.itemsize));
            for d in &piece.dims {
                let reach = (d.n as isize).saturating_sub(1).wrapping_mul(stride(d));
                if reach < 0 {
                    lo = lo.wrapping_sub(reach.unsigned_abs());
                } else {
                    hi = hi.wrapping_add(reach.unsigned_abs());
                }
            }
            (lo, hi)
        };
        let dst = span(self.dst, piece.dst_offset, |d| d.dst);
        let src = span(self.src, piece.src_offset, |d| d.src);
        resident(dst) && resident(src)
    }

    /// The loop to cut calibration chunks from and the steps of it in one: chunks of about
    /// `chunk` bytes (at most twice that), `count` of them inside the copy; `None` when no loop
    /// allows that.
    fn chunks(&self, bytes: usize, chunk: usize, count: usize) -> Option<(usize, usize)> {
        let pieces = (bytes / chunk.max(1)).max(1);
        let granule = tiles::tile_granule(self.itemsize);
        let (dim, granule) = plan::split_dim(&self.plan, self.kernel, pieces, granule)?;
        let n = self.plan.dims[dim].n;
        let step_bytes = bytes / n.max(1);
        let unit_bytes = step_bytes.saturating_mul(granule).max(1);
        let units = (chunk / unit_bytes).max(1);
        let steps = units.saturating_mul(granule);
        let fits = steps.saturating_mul(count) <= n;
        let fine = unit_bytes.saturating_mul(units) <= chunk.saturating_mul(2);
        (fits && fine).then_some((dim, steps))
    }
}

/// The most bytes [`resident`] asks the kernel about: beyond, it assumes they are.
const RESIDENT_MAX_BYTES: usize = 1 << 30;

/// Whether every page of the bytes `[lo, hi)` is in memory (`mincore`); true where that can't
/// be told (not Linux, a span beyond [`RESIDENT_MAX_BYTES`], the call failing).
fn resident((lo, hi): (usize, usize)) -> bool {
    #[cfg(target_os = "linux")]
    {
        let page = rustix::param::page_size();
        let start = lo / page * page;
        let len = hi.saturating_sub(start);
        if hi <= lo || len > RESIDENT_MAX_BYTES {
            return true;
        }
        let mut pages = vec![0u8; len.div_ceil(page)];
        // SAFETY: mincore only reads the page tables for the range (an address not mapped is
        // an error, not a fault) and writes one byte per page into `pages`, which has as many.
        let rc = unsafe { libc::mincore(start as *mut libc::c_void, len, pages.as_mut_ptr()) };
        rc != 0 || pages.iter().all(|p| p & 1 == 1)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (lo, hi, RESIDENT_MAX_BYTES);
        true
    }
}

/// Measure now, on copies of the engine's own, every class and band the process's tuner has no
/// choice for yet (`python -m dlpack` reports what the engine picks; a program's own copies
/// otherwise measure the first time they can). Memory for the copies that can't be had is an
/// error, and nothing is measured.
pub fn calibrate_now() -> crate::error::Result<()> {
    let tuner = Tuner::process();
    let large = 2 * tuner.limits.streaming;
    let mid = tuner.limits.streaming / 2;
    // The source holds a stride-2 gather's items; the destination is touched first, so that
    // no copy pays for mapping its pages.
    let src = crate::memory::AlignedBuffer::new(2 * large)?;
    let dst = crate::memory::AlignedBuffer::new(large)?;
    // SAFETY: the buffer is ours alone, of this size.
    unsafe { std::ptr::write_bytes(src.as_ptr(), 0x5a, 2 * large) };
    // SAFETY: as above.
    unsafe { std::ptr::write_bytes(dst.as_ptr(), 0, large) };
    for bytes in [mid, large] {
        let Some(band) = Band::of(bytes, &tuner.limits) else {
            continue;
        };
        let n = bytes / 4;
        let side = 1 << (n.ilog2() / 2);
        let (d, s) = (dst.as_ptr(), src.as_ptr());
        let flat = |p, stride| Strided {
            ptr: p,
            shape: vec![n],
            strides: vec![stride],
        };
        let grid = |p, strides| Strided {
            ptr: p,
            shape: vec![side, n / side],
            strides,
        };
        let cases = [
            (Class::Contiguous, flat(d, 4), flat(s, 4), None),
            (
                Class::Tiles,
                grid(d, vec![(n / side * 4) as isize, 4]),
                grid(s, vec![4, (side * 4) as isize]),
                None,
            ),
            (Class::Gather, flat(d, 4), flat(s, 8), None),
            (Class::Swap, flat(d, 4), flat(s, 4), Some(4)),
        ];
        for (class, to, from, swap) in cases {
            if tuner.record(class, band).is_none() {
                // SAFETY: every layout addresses inside `dst` (`large` bytes: `n` items of
                // 4 bytes, `bytes <= large`) and `src` (twice that: `n` items 8 bytes apart),
                // two buffers of ours that live through the loop.
                unsafe { copy_strided(&to, &from, 4, swap) };
            }
        }
    }
    Ok(())
}

/// The byte-swap unit for the kernels: 0 for none.
pub(super) fn swap_unit_for(itemsize: usize, swap_unit: Option<usize>) -> usize {
    match swap_unit {
        None | Some(0 | 1) => 0,
        Some(u) if u <= itemsize && itemsize.is_multiple_of(u) => u,
        Some(_) if itemsize > 1 => itemsize,
        Some(_) => 0,
    }
}

/// Run one plan with the element type for `itemsize` and `unit`.
///
/// # Safety
/// Every element address the plan describes from `dst` / `src` is valid.
unsafe fn run_piece(
    dst: *mut u8,
    src: *const u8,
    piece: &Plan,
    kernel: Kernel,
    itemsize: usize,
    unit: usize,
    options: Options,
) {
    let d = dst.wrapping_offset(piece.dst_offset);
    let s = src.wrapping_offset(piece.src_offset);
    // One monomorphised engine per element type.
    macro_rules! with {
        ($e:expr) => {
            // SAFETY: the forwarded contract; the element type has `itemsize` bytes.
            unsafe { kernels::run($e, d, s, piece, kernel, options) }
        };
    }
    match (itemsize, unit) {
        (1, _) => with!(Plain::<u8>::new()),
        (2, 0) => with!(Plain::<u16>::new()),
        (4, 0) => with!(Plain::<u32>::new()),
        (8, 0) => with!(Plain::<u64>::new()),
        (16, 0) => with!(Plain::<u128>::new()),
        (2, 2) => with!(Swapped::<u16, u16>::new()),
        (4, 4) => with!(Swapped::<u32, u32>::new()),
        (8, 8) => with!(Swapped::<u64, u64>::new()),
        (16, 16) => with!(Swapped::<u128, u128>::new()),
        (4, 2) => with!(Swapped::<u32, u16>::new()),
        (8, 4) => with!(Swapped::<u64, u32>::new()),
        (16, 8) => with!(Swapped::<u128, u64>::new()),
        _ => with!(Dyn {
            size: itemsize,
            unit
        }),
    }
}

/// The lowest and one-past-highest byte address `a` touches; `None` when it has no elements.
pub fn byte_span(a: &Strided, itemsize: usize) -> Option<(i128, i128)> {
    if a.shape.contains(&0) {
        return None;
    }
    let (mut lo, mut hi) = (
        a.ptr as usize as i128,
        a.ptr as usize as i128 + itemsize as i128,
    );
    for (&n, &s) in a.shape.iter().zip(&a.strides) {
        let reach = (n as i128 - 1) * s as i128;
        if reach < 0 {
            lo += reach;
        } else {
            hi += reach;
        }
    }
    Some((lo, hi))
}

/// Whether the bytes `a` and `b` touch may overlap (conservative: their bounding intervals do).
pub fn may_overlap(a: &Strided, b: &Strided, itemsize: usize) -> bool {
    if itemsize == 0 {
        return false;
    }
    match (byte_span(a, itemsize), byte_span(b, itemsize)) {
        (Some((alo, ahi)), Some((blo, bhi))) => alo < bhi && blo < ahi,
        _ => false,
    }
}
