//! The engine itself: thread and kernel choice for one strided copy, and the overlap checks.

use std::sync::OnceLock;

use super::elem::{Dyn, Plain, Swapped};
use super::kernels;
use super::tiles::{self, Isa, Options};
use crate::copy::plan::{self, Kernel, Plan};
use crate::layout::strides_nest;

/// A strided array in bytes: element `i` is at `ptr + sum(i_k * strides[k])`.
#[derive(Clone, Debug)]
pub struct Strided {
    pub ptr: *mut u8,
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
}

/// Copies of at least this many bytes use several threads.
pub const PARALLEL_THRESHOLD: usize = 4 << 20;
/// Each thread gets at least this many bytes.
const MIN_BYTES_PER_THREAD: usize = 2 << 20;
/// Copies of at least this many bytes write transposed tiles with streaming (non-temporal)
/// stores: the destination would not stay in cache anyway, and this saves reading it first.
pub const STREAMING_THRESHOLD: usize = 16 << 20;
/// The most threads one copy uses.
const MAX_THREADS: usize = 8;

/// How a copy may use threads.
#[derive(Clone, Copy, Debug)]
pub(super) struct Config {
    pub(super) threads: usize,
    pub(super) threshold: usize,
    pub(super) min_bytes_per_thread: usize,
    pub(super) streaming_threshold: usize,
    pub(super) isa: Isa,
}

impl Config {
    pub(super) fn new() -> Self {
        static THREADS: OnceLock<usize> = OnceLock::new();
        let threads = *THREADS.get_or_init(|| {
            std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(MAX_THREADS)
        });
        Config {
            threads,
            threshold: PARALLEL_THRESHOLD,
            min_bytes_per_thread: MIN_BYTES_PER_THREAD,
            streaming_threshold: STREAMING_THRESHOLD,
            isa: Isa::detect(),
        }
    }

    pub(super) fn threads_for(&self, bytes: usize) -> usize {
        if bytes < self.threshold {
            return 1;
        }
        (bytes / self.min_bytes_per_thread.max(1)).clamp(1, self.threads.max(1))
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
/// that don't match copy nothing. Above [`PARALLEL_THRESHOLD`] bytes the work is split between
/// threads. Never touches Python and never panics.
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

/// [`copy_strided`] with an explicit threading configuration.
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
    let mut threads = config.threads_for(bytes);
    if threads > 1 {
        let mut dst_dims: Vec<(u64, u64)> = (plan.dims.iter())
            .map(|d| (d.n as u64, d.dst.unsigned_abs() as u64))
            .collect();
        if !strides_nest(&mut dst_dims, itemsize as u64) {
            threads = 1;
        }
    }
    let options = Options {
        streaming: bytes >= config.streaming_threshold,
        isa: config.isa,
    };
    let split = (threads > 1)
        .then(|| plan::split_dim(&plan, kernel, threads, tiles::tile_granule(itemsize)))
        .flatten();
    let (dst_ptr, src_ptr) = (SendPtr(dst.ptr), SendPtr(src.ptr));
    let Some((dim, granule)) = split else {
        // SAFETY: the plan addresses exactly the caller's elements.
        return unsafe {
            run_piece(
                dst_ptr.get(),
                src_ptr.get(),
                &plan,
                kernel,
                itemsize,
                unit,
                options,
            )
        };
    };
    let pieces = plan::split(&plan, dim, granule, threads);
    let Some((first, rest)) = pieces.split_first() else {
        return;
    };
    let run = move |piece| {
        // SAFETY: each piece addresses a disjoint part of the caller's elements, valid for the
        // whole call (this function's contract), and the scope below joins every thread running
        // one before the call returns.
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
