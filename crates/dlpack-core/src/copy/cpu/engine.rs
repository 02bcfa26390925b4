//! The engine itself: thread and kernel choice for one strided copy, and the overlap checks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Instant;

use super::elem::{Dyn, Plain, Swapped};
use super::kernels;
use super::tiles::{self, Isa, Options};
use super::tune::{self, Band, Choice, Class, Key, Limits, Lookup, Memory, ONE_THREAD, Tuner};
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
/// bytes up the work may be split between threads and written with streaming stores, as
/// measured on this machine for that kind of copy ([`super::tune`]). Never touches Python and
/// never panics.
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

/// Pieces a copy is cut into per thread (see [`Job::run`]).
const PIECES_PER_THREAD: usize = 4;

/// How a copy's pieces were shared between threads (see [`Job::run`]).
#[derive(Clone, Copy, Debug)]
struct Shared {
    pieces: usize,
    by_others: usize,
}

/// A copy's pieces, which the threads running it take one at a time (see [`Job::run`]).
struct Pieces {
    pieces: Vec<Plan>,
    dst: SendPtr,
    src: SendPtr,
    kernel: Kernel,
    itemsize: usize,
    unit: usize,
    options: Options,
    /// The next piece to take.
    next: AtomicUsize,
    /// Pieces copied, and the signal that all are.
    done: Mutex<usize>,
    all_done: Condvar,
    /// Pieces copied by threads other than the caller's.
    by_others: AtomicUsize,
}

// SAFETY: the pointers address memory the copy's caller keeps valid until every piece taken is
// copied (`Pieces::take`'s contract); a piece is taken by one thread only, and pieces are
// disjoint parts of the destination.
unsafe impl Sync for Pieces {}

impl Pieces {
    /// Copy pieces not yet taken until none is left; how many this thread copied.
    ///
    /// # Safety
    /// The pieces address disjoint parts of the copy's elements, which stay valid until every
    /// piece is counted in `done`.
    unsafe fn take(&self) -> usize {
        let mut ran = 0;
        while let Some(piece) = self.pieces.get(self.next.fetch_add(1, Ordering::Relaxed)) {
            // SAFETY: a piece taken here is this thread's alone, and its memory valid until it is
            // counted below (this function's contract).
            unsafe {
                run_piece(
                    self.dst.get(),
                    self.src.get(),
                    piece,
                    self.kernel,
                    self.itemsize,
                    self.unit,
                    self.options,
                )
            };
            ran += 1;
            let mut done = self.done.lock().unwrap_or_else(PoisonError::into_inner);
            *done += 1;
            if *done == self.pieces.len() {
                self.all_done.notify_all();
            }
        }
        ran
    }
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
        unsafe { job.run(&job.plan, choice.threads, choice) };
        return;
    }
    let tuner = config.tuner;
    let limits = &tuner.limits;
    let band = Band::of(bytes, limits).filter(|_| threads_ok);
    let key = band.map(|band| Key {
        class,
        band,
        memory: job.memory_at(job.dst, job.plan.dst_offset),
    });
    let choice = match key.map(|key| tuner.lookup(key)) {
        None => ONE_THREAD,
        Some(Lookup::Known(choice)) => choice,
        // SAFETY: the plan addresses exactly the caller's elements (this function's contract).
        Some(Lookup::Measure(cal)) => return unsafe { job.calibrate(cal, limits, bytes) },
    };
    // SAFETY: the plan addresses exactly the caller's elements (this function's contract).
    unsafe { job.run(&job.plan, limits.threads_for(bytes, choice), choice) };
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
    /// says; returns how many pieces it was cut into and how many of them threads other than
    /// the caller's ran.
    ///
    /// The plan is cut into [`PIECES_PER_THREAD`] pieces per thread, which every thread, the
    /// caller's too, takes one at a time until none is left, and the call returns once every
    /// piece is copied: a thread that waits for a core (on a machine busy with other work)
    /// leaves its pieces to those that run and holds nothing up, so the copy takes about as
    /// long as the caller's thread alone would, never as long as the wait. A helper that
    /// starts after that finds no piece left and ends without touching the memory.
    ///
    /// # Safety
    /// `plan` addresses a part of the caller's elements, valid for the whole call.
    unsafe fn run(&self, plan: &Plan, threads: usize, choice: Choice) -> Shared {
        let threads = if self.threads_ok { threads } else { 1 };
        let options = Options {
            streaming: choice.streaming,
            isa: self.isa,
        };
        let split = (threads > 1)
            .then(|| {
                plan::split_dim(
                    plan,
                    self.kernel,
                    threads,
                    tiles::tile_granule(self.itemsize),
                )
            })
            .flatten();
        let Some((dim, granule)) = split else {
            // SAFETY: the caller's elements, valid for the call (this function's contract).
            unsafe {
                run_piece(
                    self.dst.get(),
                    self.src.get(),
                    plan,
                    self.kernel,
                    self.itemsize,
                    self.unit,
                    options,
                )
            };
            return Shared {
                pieces: 1,
                by_others: 0,
            };
        };
        let pieces = plan::split(
            plan,
            dim,
            granule,
            threads.saturating_mul(PIECES_PER_THREAD),
        );
        let count = pieces.len();
        let work = std::sync::Arc::new(Pieces {
            pieces,
            dst: self.dst,
            src: self.src,
            kernel: self.kernel,
            itemsize: self.itemsize,
            unit: self.unit,
            options,
            next: AtomicUsize::new(0),
            done: Mutex::new(0),
            all_done: Condvar::new(),
            by_others: AtomicUsize::new(0),
        });
        for _ in 1..threads.min(count) {
            let work = std::sync::Arc::clone(&work);
            let helper = move || {
                // SAFETY: `Pieces::take`'s contract holds: the caller waits below until every
                // piece taken is copied.
                let ran = unsafe { work.take() };
                work.by_others.fetch_add(ran, Ordering::Relaxed);
            };
            // No thread to be had: the caller's takes its pieces.
            let _ = std::thread::Builder::new()
                .name("dlpack-copy".into())
                .spawn(helper);
        }
        // SAFETY: the pieces address disjoint parts of the caller's elements (this function's
        // contract), and this call returns only once every piece is copied.
        unsafe { work.take() };
        let mut done = work.done.lock().unwrap_or_else(PoisonError::into_inner);
        while *done < count {
            done = (work.all_done.wait(done)).unwrap_or_else(PoisonError::into_inner);
        }
        drop(done);
        Shared {
            pieces: count,
            by_others: work.by_others.load(Ordering::Relaxed),
        }
    }

    /// Measure the candidates on chunks of this copy (`bytes` bytes), keep the choice, and copy
    /// the rest with it. Each round runs every candidate on a chunk of its own, in an order
    /// that turns from round to round so that none always follows another. The chunks'
    /// destination must be all in memory or all not (as the key says) and their source all in
    /// memory, or some chunks would time the kernel mapping pages and others not: a copy where
    /// that isn't so, or that can't be cut into enough chunks of the size the calibration
    /// wants, runs as the first (cheapest) candidate and leaves the measuring to a later one.
    ///
    /// # Safety
    /// As for [`Job::run`], with the whole plan.
    unsafe fn calibrate(&self, cal: tune::Calibration<'_>, limits: &Limits, bytes: usize) {
        let k = cal.candidates.len();
        let most = cal.candidates.iter().map(|c| c.threads).max().unwrap_or(1);
        // The chunks start where the destination reaches a line boundary, as the copy's own
        // tiles and streaming rows do after their first items: otherwise each chunk would begin
        // with items copied one by one that the whole copy copies once (a numpy array starts
        // 16 bytes past a page: in chunks of a transpose 6% of the items, making streaming stores
        // look slower than ordinary ones). A chunk more where the copy has room for it, and the
        // items up to that boundary, go first, untimed, as the first candidate: the caches and
        // memory are then busy with this copy's work, not with what came before (numpy's own
        // transposing copy leaves a cache full of lines to write back, which slowed the first
        // chunks). Their bytes count as the first candidate's in the measuring's cost.
        let cut = limits
            .calibration_chunks(bytes, k, most)
            .and_then(|(rounds, chunk)| {
                let (dim, steps, warm) = match self.chunks(bytes, chunk, k * rounds + 1) {
                    Some((dim, steps)) => (dim, steps, steps),
                    None => self
                        .chunks(bytes, chunk, k * rounds)
                        .map(|(dim, steps)| (dim, steps, 0))?,
                };
                let lead = self.line_lead(dim, warm, steps * k * rounds);
                let region = plan::slice(&self.plan, dim, 0..lead + steps * k * rounds);
                (self.memory_of(&region) == Some(cal.key.memory))
                    .then_some((rounds, dim, steps, lead))
            });
        let first = cal.candidates.first().copied().unwrap_or(ONE_THREAD);
        let Some((rounds, dim, steps, lead)) = cut else {
            drop(cal);
            // SAFETY: the whole plan (the contract).
            unsafe { self.run(&self.plan, limits.threads_for(bytes, first), first) };
            return;
        };
        let mut trials = vec![Vec::with_capacity(rounds); k];
        let mut measured = vec![0usize; k];
        let started = Instant::now();
        if lead > 0 {
            let warm = plan::slice(&self.plan, dim, 0..lead);
            measured[0] = warm.numel().saturating_mul(self.itemsize);
            let threads = limits.threads_for(measured[0], first);
            // SAFETY: steps `0..lead` of one loop of the plan: a part of the caller's elements.
            unsafe { self.run(&warm, threads, first) };
        }
        let mut at = lead;
        tune::measure(
            &mut trials,
            &mut measured,
            rounds,
            limits.cost_budget,
            |c| {
                let piece = plan::slice(&self.plan, dim, at..at + steps);
                let piece_bytes = piece.numel().saturating_mul(self.itemsize);
                let choice = cal.candidates[c];
                let (t, cpu) = (Instant::now(), thread_cpu_seconds());
                // SAFETY: steps `at..at + steps` of one loop of the plan: a part of the caller's
                // elements (`measure` asks for at most `rounds` chunks of each of the `k`
                // candidates, as many as the cut holds).
                let shared = unsafe { self.run(&piece, choice.threads, choice) };
                let wall = t.elapsed().as_secs_f64();
                let cpu = cpu.zip(thread_cpu_seconds()).map(|(a, b)| b - a);
                at += steps;
                let (seconds, waited) = tune::judge(tune::Chunk {
                    threads: choice.threads,
                    wall,
                    cpu,
                    pieces: shared.pieces,
                    by_others: shared.by_others,
                });
                (seconds / piece_bytes.max(1) as f64, piece_bytes, waited)
            },
        );
        let seconds = started.elapsed().as_secs_f64();
        let choice = cal.keep(&trials, &measured, bytes, seconds);
        let rest = plan::slice(&self.plan, dim, at..self.plan.dims[dim].n);
        let rest_bytes = rest.numel().saturating_mul(self.itemsize);
        if rest_bytes > 0 {
            // SAFETY: the steps of that loop from `at` on: the rest of the caller's elements.
            unsafe { self.run(&rest, limits.threads_for(rest_bytes, choice), choice) };
        }
    }

    /// The first step of loop `dim` from `from` on whose destination starts at a line boundary
    /// (among the 64 from there, so that `span` more steps still fit in the loop); `from` where
    /// there is none.
    fn line_lead(&self, dim: usize, from: usize, span: usize) -> usize {
        let d = self.plan.dims[dim];
        let first = self.dst.get().wrapping_offset(self.plan.dst_offset);
        let end = d.n.saturating_sub(span).saturating_add(1);
        (from..end.min(from.saturating_add(64)))
            .find(|&o| (first.wrapping_offset(o as isize * d.dst) as usize).is_multiple_of(64))
            .unwrap_or(from)
    }

    /// The bytes `piece` addresses on one side (`base`, its offset, the dims' strides on that
    /// side), `[lo, hi)`.
    fn span(&self, piece: &Plan, base: SendPtr, offset: isize, dst: bool) -> (usize, usize) {
        let first = base.get().wrapping_offset(offset) as usize;
        let (mut lo, mut hi) = (first, first.wrapping_add(self.itemsize));
        for d in &piece.dims {
            let stride = if dst { d.dst } else { d.src };
            let reach = (d.n as isize).saturating_sub(1).wrapping_mul(stride);
            if reach < 0 {
                lo = lo.wrapping_sub(reach.unsigned_abs());
            } else {
                hi = hi.wrapping_add(reach.unsigned_abs());
            }
        }
        (lo, hi)
    }

    /// Whether the page of the element at `offset` from `base` is in memory (mapped where that
    /// can't be told): a copy's destination is fresh, or not, as a whole, nearly always.
    fn memory_at(&self, base: SendPtr, offset: isize) -> Memory {
        let at = base.get().wrapping_offset(offset) as usize;
        match residency((at, at.wrapping_add(1))) {
            Some((0, _)) => Memory::Fresh,
            _ => Memory::Mapped,
        }
    }

    /// Whether `piece`'s destination is all in memory or all not, with its source all in
    /// memory (`None`: neither, or a source not all in memory); what can't be told counts as
    /// in memory.
    fn memory_of(&self, piece: &Plan) -> Option<Memory> {
        let all = |r: Option<(usize, usize)>| r.is_none_or(|(yes, all)| yes == all);
        if !all(residency(self.span(
            piece,
            self.src,
            piece.src_offset,
            false,
        ))) {
            return None;
        }
        match residency(self.span(piece, self.dst, piece.dst_offset, true)) {
            None => Some(Memory::Mapped),
            Some((0, _)) => Some(Memory::Fresh),
            Some((yes, all)) if yes == all => Some(Memory::Mapped),
            Some(_) => None,
        }
    }

    /// The loop to cut calibration chunks from and the steps of it in one: chunks of about
    /// `chunk` bytes (at most twice that), `count` of them inside the copy; `None` when no loop
    /// allows that. The loops outside the kernel's come first, so that a chunk is whole rows or
    /// tiles, as the copy runs them; then, for tiles, the destination's dense loop, whose chunks
    /// still read whole source rows (cut along the source's dense loop instead, a chunk's tiles
    /// would read a few lines of each).
    fn chunks(&self, bytes: usize, chunk: usize, count: usize) -> Option<(usize, usize)> {
        let last = self.plan.dims.len().checked_sub(1)?;
        let tile = tiles::tile_granule(self.itemsize);
        let kernel_dims: Vec<(usize, usize)> = match self.kernel {
            Kernel::Tile { a } => vec![(last, tile), (a, tile)],
            // Whole pages of a long innermost row, as the threads' pieces are cut.
            Kernel::Rows => [(last.wrapping_sub(1), 1), (last, 1024)]
                .into_iter()
                .filter(|&(j, _)| j <= last)
                .collect(),
        };
        let outer = (0..=last)
            .filter(|j| kernel_dims.iter().all(|&(k, _)| k != *j))
            .map(|j| (j, 1));
        outer
            .chain(kernel_dims.iter().copied())
            .find_map(|(dim, granule)| {
                let n = self.plan.dims[dim].n;
                let step_bytes = bytes / n.max(1);
                let unit_bytes = step_bytes.saturating_mul(granule).max(1);
                let units = (chunk / unit_bytes).max(1);
                let steps = units.saturating_mul(granule);
                let fits = steps.saturating_mul(count) <= n;
                let fine = unit_bytes.saturating_mul(units) <= chunk.saturating_mul(2);
                (fits && fine).then_some((dim, steps))
            })
    }
}

/// The CPU seconds the calling thread has run (`None` where that can't be told).
fn thread_cpu_seconds() -> Option<f64> {
    #[cfg(target_os = "linux")]
    {
        use rustix::time::{ClockId, clock_gettime};
        let t = clock_gettime(ClockId::ThreadCPUTime);
        Some(t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// The most bytes [`residency`] asks the kernel about.
const RESIDENCY_MAX_BYTES: usize = 1 << 30;

/// How many of the pages holding the bytes `[lo, hi)` are in memory, of how many (`mincore`);
/// `None` where that can't be told (not Linux, a span beyond [`RESIDENCY_MAX_BYTES`], the call
/// failing).
pub(super) fn residency((lo, hi): (usize, usize)) -> Option<(usize, usize)> {
    #[cfg(target_os = "linux")]
    {
        let page = rustix::param::page_size();
        let start = lo / page * page;
        let len = hi.saturating_sub(start);
        if hi <= lo || len > RESIDENCY_MAX_BYTES {
            return None;
        }
        let mut pages = vec![0u8; len.div_ceil(page)];
        // SAFETY: mincore only reads the page tables for the range (an address not mapped is
        // an error, not a fault) and writes one byte per page into `pages`, which has as many.
        let rc = unsafe { libc::mincore(start as *mut libc::c_void, len, pages.as_mut_ptr()) };
        (rc == 0).then(|| (pages.iter().filter(|p| *p & 1 == 1).count(), pages.len()))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (lo, hi, RESIDENCY_MAX_BYTES);
        None
    }
}

/// Fresh memory for [`calibrate_now`]: an anonymous mapping no page of which is in memory yet,
/// advised for huge pages as the arrays it stands for are (numpy's, and ours).
#[cfg(target_os = "linux")]
struct Fresh {
    ptr: *mut u8,
    len: usize,
}

/// None elsewhere: [`residency`] can't tell fresh memory there.
#[cfg(not(target_os = "linux"))]
enum Fresh {}

#[cfg(not(target_os = "linux"))]
impl Fresh {
    fn new(_: usize) -> crate::error::Result<Option<Fresh>> {
        Ok(None)
    }

    fn ptr(&self) -> *mut u8 {
        match *self {}
    }
}

#[cfg(target_os = "linux")]
impl Fresh {
    fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    fn new(len: usize) -> crate::error::Result<Option<Fresh>> {
        use rustix::mm::{Advice, MapFlags, ProtFlags, madvise, mmap_anonymous};
        crate::available::check(len as u64, "memory")?;
        let rw = ProtFlags::READ | ProtFlags::WRITE;
        // SAFETY: a new private anonymous mapping at an address of the kernel's choosing.
        let ptr = unsafe { mmap_anonymous(std::ptr::null_mut(), len, rw, MapFlags::PRIVATE) }
            .map_err(|e| crate::error::Error::Memory(format!("can't map {len} bytes: {e}")))?;
        // SAFETY: the mapping just made; the advice only changes how the kernel backs it.
        let _ = unsafe { madvise(ptr, len, Advice::LinuxHugepage) };
        Ok(Some(Fresh {
            ptr: ptr.cast(),
            len,
        }))
    }
}

#[cfg(target_os = "linux")]
impl Drop for Fresh {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, unmapped once; nothing points into it any more.
        let _ = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) };
    }
}

/// Measure now, on copies of the engine's own, every key the process's tuner has no choice for
/// yet (`python -m dlpack` reports what the engine picks; a program's own copies otherwise
/// measure the first time they can): into memory written before and, on Linux, into fresh
/// mappings. Memory for the copies that can't be had is an error, and nothing more is measured.
pub fn calibrate_now() -> crate::error::Result<()> {
    let tuner = Tuner::process();
    let large = 2 * tuner.limits.large;
    let mid = tuner.limits.large / 2;
    // The source holds a stride-2 gather's items. Both are written first, so that copies into
    // and from them map no pages: the destination, then the source, whose last half then holds
    // the caches, which the large copies (from the first half) find as cold as a large array
    // is; the small ones come after.
    let src = crate::memory::AlignedBuffer::new(2 * large)?;
    let dst = crate::memory::AlignedBuffer::new(large)?;
    // SAFETY: the buffer is ours alone, of this size.
    unsafe { std::ptr::write_bytes(dst.as_ptr(), 0, large) };
    // SAFETY: the buffer is ours alone, of this size.
    unsafe { std::ptr::write_bytes(src.as_ptr(), 0x5a, 2 * large) };
    for bytes in [large, mid] {
        let Some(band) = Band::of(bytes, &tuner.limits) else {
            continue;
        };
        let n = bytes / 4;
        let side = 1 << (n.ilog2() / 2);
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
        // (class, destination, source, swap) into the destination at `d`.
        let case = |class, d: *mut u8| {
            let s = src.as_ptr();
            match class {
                Class::Contiguous => (flat(d, 4), flat(s, 4), None),
                Class::Tiles => (
                    grid(d, vec![(n / side * 4) as isize, 4]),
                    grid(s, vec![4, (side * 4) as isize]),
                    None,
                ),
                Class::Gather => (flat(d, 4), flat(s, 8), None),
                Class::Swap => (flat(d, 4), flat(s, 4), Some(4)),
            }
        };
        for class in Class::ALL {
            for memory in Memory::ALL {
                if tuner
                    .record(Key {
                        class,
                        band,
                        memory,
                    })
                    .is_some()
                {
                    continue;
                }
                let fresh = match memory {
                    Memory::Mapped => None,
                    Memory::Fresh => match Fresh::new(bytes)? {
                        Some(fresh) => Some(fresh),
                        None => continue, // no fresh memory to be had (or told) here
                    },
                };
                let d = fresh.as_ref().map_or(dst.as_ptr(), Fresh::ptr);
                let (to, from, swap) = case(class, d);
                // SAFETY: every layout addresses inside its destination (`n` items of 4 bytes:
                // `bytes`, no more than `dst`'s `large` or than the fresh mapping of `bytes`)
                // and `src` (twice `large`: `n` items 8 bytes apart), all of them ours and alive
                // through the copy.
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
