//! The CPU copy engine: N-dimensional strided copies between any two strided byte layouts, and
//! fresh C-ordered copies of host tensors (`copy=True`).
//!
//! [`copy_strided`] plans the loops ([`crate::copy::plan`]), picks an inner kernel (a `memcpy`
//! of contiguous runs, specialised gather/scatter loops, or cache-blocked tiles for transposes;
//! see [`kernels`]) and, above a size threshold, cuts the work between threads. It never touches
//! Python: callers release the GIL around it.

mod kernels;

use std::sync::OnceLock;

use crate::copy::plan::{self, Kernel, Plan};
use crate::layout::strides_nest;
use kernels::{Dyn, Plain, Swapped};

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
struct Config {
    threads: usize,
    threshold: usize,
    min_bytes_per_thread: usize,
    streaming_threshold: usize,
}

impl Config {
    fn new() -> Self {
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
        }
    }

    fn threads_for(&self, bytes: usize) -> usize {
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
    // SAFETY: forwarded contract.
    unsafe { copy_strided_with(dst, src, itemsize, swap_unit, Config::new()) }
}

/// [`copy_strided`] with an explicit threading configuration.
unsafe fn copy_strided_with(
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
    let streaming = bytes >= config.streaming_threshold;
    let split = (threads > 1)
        .then(|| plan::split_dim(&plan, kernel, threads, kernels::tile_granule(itemsize)))
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
                streaming,
            )
        };
    };
    let pieces = plan::split(&plan, dim, granule, threads);
    let Some((first, rest)) = pieces.split_first() else {
        return;
    };
    std::thread::scope(|scope| {
        let mut inline = Vec::new();
        for piece in rest {
            let work = move || {
                // SAFETY: each piece addresses a disjoint part of the caller's elements, valid
                // until the scope ends.
                unsafe {
                    run_piece(
                        dst_ptr.get(),
                        src_ptr.get(),
                        piece,
                        kernel,
                        itemsize,
                        unit,
                        streaming,
                    )
                }
            };
            if std::thread::Builder::new()
                .name("dlpack-copy".into())
                .spawn_scoped(scope, work)
                .is_err()
            {
                inline.push(piece); // no thread to be had: do it here
            }
        }
        for piece in std::iter::once(first).chain(inline) {
            // SAFETY: as above.
            unsafe {
                run_piece(
                    dst_ptr.get(),
                    src_ptr.get(),
                    piece,
                    kernel,
                    itemsize,
                    unit,
                    streaming,
                )
            };
        }
    });
}

/// The byte-swap unit for the kernels: 0 for none.
fn swap_unit_for(itemsize: usize, swap_unit: Option<usize>) -> usize {
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
    streaming: bool,
) {
    let d = dst.wrapping_offset(piece.dst_offset);
    let s = src.wrapping_offset(piece.src_offset);
    use kernels::run;
    // SAFETY: in every arm, the forwarded contract; each element type has `itemsize` bytes.
    unsafe {
        match (itemsize, unit) {
            (1, _) => run(Plain::<u8>::new(), d, s, piece, kernel, streaming),
            (2, 0) => run(Plain::<u16>::new(), d, s, piece, kernel, streaming),
            (4, 0) => run(Plain::<u32>::new(), d, s, piece, kernel, streaming),
            (8, 0) => run(Plain::<u64>::new(), d, s, piece, kernel, streaming),
            (16, 0) => run(Plain::<u128>::new(), d, s, piece, kernel, streaming),
            (2, 2) => run(Swapped::<u16, u16>::new(), d, s, piece, kernel, streaming),
            (4, 4) => run(Swapped::<u32, u32>::new(), d, s, piece, kernel, streaming),
            (8, 8) => run(Swapped::<u64, u64>::new(), d, s, piece, kernel, streaming),
            (16, 16) => run(Swapped::<u128, u128>::new(), d, s, piece, kernel, streaming),
            (4, 2) => run(Swapped::<u32, u16>::new(), d, s, piece, kernel, streaming),
            (8, 4) => run(Swapped::<u64, u32>::new(), d, s, piece, kernel, streaming),
            (16, 8) => run(Swapped::<u128, u64>::new(), d, s, piece, kernel, streaming),
            _ => run(
                Dyn {
                    size: itemsize,
                    unit,
                },
                d,
                s,
                piece,
                kernel,
                streaming,
            ),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Several threads for any size.
    const FORCE_THREADS: Config = Config {
        threads: 3,
        threshold: 0,
        min_bytes_per_thread: 0,
        streaming_threshold: 0,
    };

    /// A byte buffer and the layout of an array inside it (strides and base offset in bytes).
    struct Array {
        bytes: Vec<u8>,
        base: usize,
        shape: Vec<usize>,
        strides: Vec<isize>,
    }

    impl Array {
        /// Place `strides` in a fresh buffer: the base at `pad` bytes past the lowest address.
        fn new(shape: &[usize], strides: &[isize], itemsize: usize, pad: usize, seed: u8) -> Self {
            let low: isize = shape
                .iter()
                .zip(strides)
                .map(|(&n, &s)| (n.max(1) as isize - 1) * s.min(0))
                .sum();
            let high: isize = shape
                .iter()
                .zip(strides)
                .map(|(&n, &s)| (n.max(1) as isize - 1) * s.max(0))
                .sum();
            let size = (high - low) as usize + itemsize + 2 * pad;
            let bytes = (0..size)
                .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
                .collect();
            Array {
                bytes,
                base: (pad as isize - low) as usize,
                shape: shape.to_vec(),
                strides: strides.to_vec(),
            }
        }

        fn strided(&mut self) -> Strided {
            Strided {
                ptr: self.bytes.as_mut_ptr().wrapping_add(self.base),
                shape: self.shape.clone(),
                strides: self.strides.clone(),
            }
        }
    }

    /// Reference: element by element via the multi-index, swapping per unit.
    fn reference(dst: &mut Array, src: &Array, itemsize: usize, unit: usize) {
        let numel: usize = src.shape.iter().product();
        for flat in 0..numel {
            let (mut rest, mut d, mut s) = (flat, dst.base as isize, src.base as isize);
            for k in (0..src.shape.len()).rev() {
                let i = (rest % src.shape[k]) as isize;
                rest /= src.shape[k];
                d += i * dst.strides[k];
                s += i * src.strides[k];
            }
            let (d, s) = (d as usize, s as usize);
            for b in 0..itemsize {
                let from = if unit > 1 {
                    b / unit * unit + unit - 1 - b % unit
                } else {
                    b
                };
                dst.bytes[d + b] = src.bytes[s + from];
            }
        }
    }

    /// Destination strides: a permutation of a packed layout with gaps (possibly odd), and
    /// random signs, so no two elements overlap.
    fn dst_strides(
        shape: &[usize],
        itemsize: usize,
        order: &[usize],
        gaps: &[usize],
        signs: &[bool],
    ) -> Vec<isize> {
        let mut strides = vec![0isize; shape.len()];
        let mut next = itemsize as isize;
        for (k, &dim) in order.iter().enumerate() {
            let stride = next + gaps[k] as isize;
            strides[dim] = if signs[k] { -stride } else { stride };
            next = stride * shape[dim].max(1) as isize;
        }
        strides
    }

    fn check(
        shape: &[usize],
        src_strides: &[isize],
        dst_strides: &[isize],
        itemsize: usize,
        swap: Option<usize>,
        pads: (usize, usize),
        config: Config,
    ) -> std::result::Result<(), TestCaseError> {
        let src = Array::new(shape, src_strides, itemsize, pads.0, 7);
        let mut src_copy = Array::new(shape, src_strides, itemsize, pads.0, 7);
        let mut expected = Array::new(shape, dst_strides, itemsize, pads.1, 101);
        let mut actual = Array::new(shape, dst_strides, itemsize, pads.1, 101);
        reference(&mut expected, &src, itemsize, swap_unit_for(itemsize, swap));
        // SAFETY: both layouts lie inside their buffers by construction and don't overlap.
        unsafe {
            copy_strided_with(
                &actual.strided(),
                &src_copy.strided(),
                itemsize,
                swap,
                config,
            );
        }
        prop_assert!(src_copy.bytes == src.bytes, "the source changed");
        prop_assert!(
            actual.bytes == expected.bytes,
            "shape {:?} src {:?} dst {:?} item {} swap {:?}",
            shape,
            src_strides,
            dst_strides,
            itemsize,
            swap
        );
        Ok(())
    }

    /// Shape, source strides, destination strides, item size, swap unit, base paddings.
    type Case = (
        Vec<usize>,
        Vec<isize>,
        Vec<isize>,
        usize,
        Option<usize>,
        (usize, usize),
    );

    fn case() -> impl Strategy<Value = Case> {
        let item = proptest::sample::select(vec![1usize, 2, 4, 8, 16, 3, 6, 12]);
        (item, 0usize..=5).prop_flat_map(|(item, ndim)| {
            let shape = proptest::collection::vec(0usize..6, ndim);
            let span = 3 * item as isize + 3;
            // Source strides: any byte value, multiples of the item size more often.
            let stride = prop_oneof![
                (-3isize..=3).prop_map(move |k| k * item as isize),
                -span..=span,
            ];
            let src = proptest::collection::vec(stride, ndim);
            let order = Just((0..ndim).collect::<Vec<_>>()).prop_shuffle();
            let gaps =
                proptest::collection::vec(prop_oneof![3 => Just(0usize), 1 => 1usize..5], ndim);
            let signs = proptest::collection::vec(proptest::bool::weighted(0.25), ndim);
            let swap = prop_oneof![
                Just(None),
                Just(Some(item)),
                Just(Some((item / 2).max(1))),
                Just(Some(5)),
            ];
            (shape, src, order, gaps, signs, swap, (0usize..4, 0usize..4)).prop_map(
                move |(shape, src, order, gaps, signs, swap, pads)| {
                    let dst = dst_strides(&shape, item, &order, &gaps, &signs);
                    (shape, src, dst, item, swap, pads)
                },
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]
        #[test]
        fn matches_reference((shape, src, dst, item, swap, pads) in case()) {
            check(&shape, &src, &dst, item, swap, pads, Config::new())?;
            check(&shape, &src, &dst, item, swap, pads, FORCE_THREADS)?;
        }
    }

    /// One thread, whatever the size.
    const ONE_THREAD: Config = Config {
        threads: 1,
        threshold: usize::MAX,
        min_bytes_per_thread: usize::MAX,
        streaming_threshold: usize::MAX,
    };

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        /// Destinations whose elements overlap one another (strides of any byte value, zero
        /// included): forced threading must not split them between threads, so the bytes are
        /// exactly what one thread writes in plan order.
        #[test]
        fn overlapping_destinations_are_written_by_one_thread(
            dims in proptest::collection::vec((1usize..40, -20isize..21), 1..4),
            item in proptest::sample::select(vec![1usize, 2, 4, 8]),
        ) {
            let shape: Vec<usize> = dims.iter().map(|d| d.0).collect();
            let dst: Vec<isize> = dims.iter().map(|d| d.1).collect();
            let src = dst_strides(&shape, item, &(0..shape.len()).rev().collect::<Vec<_>>(),
                                  &vec![0; shape.len()], &vec![false; shape.len()]);
            let source = Array::new(&shape, &src, item, 0, 7);
            let mut results = Vec::new();
            for config in [ONE_THREAD, FORCE_THREADS] {
                let mut source = Array::new(&shape, &src, item, 0, 7);
                let mut target = Array::new(&shape, &dst, item, 3, 101);
                // SAFETY: both layouts lie inside their own buffers.
                unsafe {
                    copy_strided_with(&target.strided(), &source.strided(), item, None, config)
                };
                prop_assert!(source.bytes == Array::new(&shape, &src, item, 0, 7).bytes);
                results.push(target.bytes);
            }
            prop_assert!(results[0] == results[1], "threads changed the result");
            // Where the elements are disjoint, that is the element-by-element reference.
            let layout = shape.iter().zip(&dst).map(|(&n, &s)| (n as u64, s as i64));
            if crate::layout::self_overlap(layout, item as u64)
                == crate::layout::SelfOverlap::Disjoint
            {
                let mut expected = Array::new(&shape, &dst, item, 3, 101);
                reference(&mut expected, &source, item, 0);
                prop_assert!(results[0] == expected.bytes);
            }
        }
    }

    /// Larger transposed layouts: the tiled kernels and their edges.
    fn transposed_case() -> impl Strategy<Value = Case> {
        let item = proptest::sample::select(vec![1usize, 2, 4, 8, 16, 3]);
        (item, 2usize..=4).prop_flat_map(|(item, ndim)| {
            let top = [70, 70, 70, 24, 12][ndim]; // at most ~20k elements
            let shape = proptest::collection::vec(1usize..top, ndim);
            let order = Just((0..ndim).collect::<Vec<_>>()).prop_shuffle();
            let src_gaps =
                proptest::collection::vec(prop_oneof![4 => Just(0usize), 1 => 1usize..9], ndim);
            let dst_gaps =
                proptest::collection::vec(prop_oneof![4 => Just(0usize), 1 => 1usize..9], ndim);
            let signs = proptest::collection::vec(proptest::bool::weighted(0.2), ndim);
            let swap = prop_oneof![4 => Just(None), 1 => Just(Some(item))];
            (
                shape,
                order,
                src_gaps,
                dst_gaps,
                signs,
                swap,
                (0usize..4, 0usize..4),
            )
                .prop_map(
                    move |(shape, order, src_gaps, dst_gaps, signs, swap, pads)| {
                        let src = dst_strides(&shape, item, &order, &src_gaps, &signs);
                        let c_order: Vec<usize> = (0..shape.len()).rev().collect();
                        let dst = dst_strides(
                            &shape,
                            item,
                            &c_order,
                            &dst_gaps,
                            &vec![false; shape.len()],
                        );
                        (shape, src, dst, item, swap, pads)
                    },
                )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn transposes_match_reference((shape, src, dst, item, swap, pads) in transposed_case()) {
            check(&shape, &src, &dst, item, swap, pads, Config::new())?;
            check(&shape, &src, &dst, item, swap, pads, FORCE_THREADS)?;
        }
    }

    #[test]
    fn tiled_transposes() {
        for (item, pads) in [
            (4, (0, 0)),
            (8, (0, 0)),
            (4, (1, 3)),
            (8, (2, 5)),
            (2, (0, 0)),
            (16, (0, 0)),
        ] {
            for (rows, cols) in [(67, 45), (128, 64), (16, 16), (200, 9)] {
                let i = item as isize;
                let src = [i, rows as isize * i]; // a.T of a C-ordered (cols, rows) array
                let dst = [cols as isize * i, i];
                let p = plan::plan(&[rows, cols], &dst, &src).unwrap();
                if rows * item >= plan::TILE_MIN_SRC_STRIDE && cols >= plan::TILE_MIN_EXTENT {
                    assert_eq!(
                        plan::choose_kernel(&p, item),
                        Kernel::Tile { a: 0 },
                        "{rows}x{cols}"
                    );
                }
                for config in [Config::new(), FORCE_THREADS] {
                    check(&[rows, cols], &src, &dst, item, None, pads, config).unwrap();
                    check(&[rows, cols], &src, &dst, item, Some(item), pads, config).unwrap();
                }
            }
        }
    }

    #[test]
    fn threaded_copies() {
        // Several threads by the default configuration: 16 MiB.
        let n = 4 << 20;
        let src: Vec<u32> = (0..n as u32).collect();
        let mut dst = vec![0u32; n];
        let s = Strided {
            ptr: src.as_ptr().cast_mut().cast(),
            shape: vec![2048, 2048],
            strides: vec![4, 2048 * 4],
        };
        let d = Strided {
            ptr: dst.as_mut_ptr().cast(),
            shape: vec![2048, 2048],
            strides: vec![2048 * 4, 4],
        };
        assert!(Config::new().threads_for(n * 4) >= Config::new().threads.min(8));
        // SAFETY: both layouts address their vectors exactly.
        unsafe { copy_strided(&d, &s, 4, None) };
        for (k, &v) in dst.iter().enumerate() {
            let (r, c) = (k / 2048, k % 2048);
            assert_eq!(v as usize, c * 2048 + r);
        }
        // A contiguous copy and a gather, forced onto threads.
        let mut dst2 = vec![0u32; n / 2];
        let d2 = Strided {
            ptr: dst2.as_mut_ptr().cast(),
            shape: vec![n / 2],
            strides: vec![4],
        };
        let s2 = Strided {
            ptr: src.as_ptr().cast_mut().cast(),
            shape: vec![n / 2],
            strides: vec![8],
        };
        // SAFETY: as above.
        unsafe { copy_strided_with(&d2, &s2, 4, None, FORCE_THREADS) };
        assert!(dst2.iter().enumerate().all(|(k, &v)| v as usize == 2 * k));
        let s3 = Strided {
            strides: vec![4],
            ..s2
        };
        // SAFETY: as above.
        unsafe { copy_strided_with(&d2, &s3, 4, None, FORCE_THREADS) };
        assert!(dst2.iter().enumerate().all(|(k, &v)| v as usize == k));
    }

    #[test]
    fn in_place_swap() {
        // `src` == `dst` (same pointer and strides): each element is read before it's written.
        for (item, unit) in [
            (2, 2),
            (4, 4),
            (8, 8),
            (16, 16),
            (8, 4),
            (16, 8),
            (3, 3),
            (6, 3),
            (12, 12),
        ] {
            for config in [Config::new(), FORCE_THREADS] {
                let shape = [7usize, 5];
                let strides = [-(5 * item as isize + 3), item as isize];
                let mut a = Array::new(&shape, &strides, item, 2, 9);
                let original = Array::new(&shape, &strides, item, 2, 9);
                let mut expected = Array::new(&shape, &strides, item, 2, 9);
                reference(&mut expected, &original, item, unit);
                let view = a.strided();
                // SAFETY: the layout lies inside the buffer; an exact in-place swap.
                unsafe { copy_strided_with(&view, &view, item, Some(unit), config) };
                assert!(a.bytes == expected.bytes, "item {item} unit {unit}");
                // Without a swap, copying onto itself changes nothing.
                // SAFETY: as above.
                unsafe { copy_strided_with(&view, &view, item, None, config) };
                assert!(a.bytes == expected.bytes);
            }
        }
    }

    #[test]
    fn mismatched_shapes_copy_nothing() {
        let mut a = [1u8; 4];
        let b = [2u8; 4];
        let d = Strided {
            ptr: a.as_mut_ptr(),
            shape: vec![4],
            strides: vec![1],
        };
        let s = Strided {
            ptr: b.as_ptr().cast_mut(),
            shape: vec![2],
            strides: vec![1],
        };
        // SAFETY: nothing is addressed beyond the arrays.
        unsafe { copy_strided(&d, &s, 1, None) };
        assert_eq!(a, [1; 4]);
        let s = Strided {
            shape: vec![4],
            strides: vec![],
            ..s
        };
        // SAFETY: as above.
        unsafe { copy_strided(&d, &s, 1, None) };
        assert_eq!(a, [1; 4]);
    }

    #[test]
    fn overlap() {
        let mk = |ptr: usize, shape: Vec<usize>, strides: Vec<isize>| Strided {
            ptr: ptr as *mut u8,
            shape,
            strides,
        };
        assert!(may_overlap(
            &mk(1000, vec![4], vec![4]),
            &mk(1012, vec![2], vec![4]),
            4
        ));
        assert!(!may_overlap(
            &mk(1000, vec![4], vec![4]),
            &mk(1016, vec![2], vec![4]),
            4
        ));
        assert!(may_overlap(
            &mk(1016, vec![4], vec![-4]),
            &mk(1002, vec![1], vec![4]),
            4
        ));
        assert!(!may_overlap(
            &mk(1016, vec![4], vec![-4]),
            &mk(1000, vec![1], vec![4]),
            4
        ));
        assert!(!may_overlap(
            &mk(1000, vec![0], vec![4]),
            &mk(1000, vec![3], vec![4]),
            4
        ));
        assert!(may_overlap(
            &mk(1000, vec![], vec![]),
            &mk(1000, vec![3], vec![0]),
            8
        ));
        assert!(!may_overlap(
            &mk(usize::MAX - 8, vec![2], vec![isize::MAX]),
            &mk(0, vec![1], vec![1]),
            1
        ));
    }

    #[test]
    fn swap_units() {
        assert_eq!(swap_unit_for(8, None), 0);
        assert_eq!(swap_unit_for(8, Some(1)), 0);
        assert_eq!(swap_unit_for(8, Some(4)), 4);
        assert_eq!(swap_unit_for(8, Some(3)), 8);
        assert_eq!(swap_unit_for(8, Some(16)), 8);
        assert_eq!(swap_unit_for(1, Some(2)), 0);
    }

    /// Throughput of the engine alone: `cargo test --release copy::cpu::tests::throughput --
    /// --ignored --nocapture`.
    #[test]
    #[ignore = "benchmark"]
    fn throughput() {
        use std::alloc::{self, Layout as AllocLayout};
        use std::time::Instant;
        fn best(repeats: usize, mut f: impl FnMut()) -> f64 {
            f();
            (0..repeats)
                .map(|_| {
                    let t = Instant::now();
                    f();
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        }
        /// Page-aligned zeroed memory, asking for transparent huge pages as numpy does.
        struct Big(*mut u8, AllocLayout);
        impl Big {
            fn new(bytes: usize) -> Big {
                unsafe extern "C" {
                    fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
                }
                let layout = AllocLayout::from_size_align(bytes, 2 << 20).unwrap();
                // SAFETY: non-zero size; madvise only advises (14 = MADV_HUGEPAGE on Linux).
                unsafe {
                    let p = alloc::alloc(layout);
                    assert!(!p.is_null());
                    if cfg!(target_os = "linux") {
                        madvise(p.cast(), bytes, 14);
                    }
                    for (i, chunk) in std::slice::from_raw_parts_mut(p.cast::<u32>(), bytes / 4)
                        .iter_mut()
                        .enumerate()
                    {
                        *chunk = i as u32;
                    }
                    Big(p, layout)
                }
            }
        }
        impl Drop for Big {
            fn drop(&mut self) {
                // SAFETY: allocated in `new` with this layout.
                unsafe { alloc::dealloc(self.0, self.1) }
            }
        }
        let n = 16 << 20; // 64 MiB of f32
        let (src, dst) = (Big::new(8 * n), Big::new(4 * n + 4096));
        let (sp, dp) = (src.0, dst.0);
        let report = |name: &str, secs: f64| {
            println!(
                "{name:<40} {:8.2} ms {:6.1} GB/s",
                secs * 1e3,
                2.0 * (n * 4) as f64 / secs / 1e9
            );
        };
        // Every layout below addresses inside `src` (2n items) and `dst` (n items).
        report(
            "memcpy 64 MiB (1 thread)",
            // SAFETY: as just said.
            best(15, || unsafe {
                std::ptr::copy_nonoverlapping(sp, dp, n * 4)
            }),
        );
        let c = |shape: Vec<usize>, strides: Vec<isize>, p: *mut u8| Strided {
            ptr: p,
            shape,
            strides,
        };
        let cases: Vec<(&str, Strided, Strided)> = vec![
            (
                "contiguous 64 MiB",
                c(vec![n], vec![4], dp),
                c(vec![n], vec![4], sp),
            ),
            (
                "transpose 4096x4096",
                c(vec![4096, 4096], vec![4 * 4096, 4], dp),
                c(vec![4096, 4096], vec![4, 4 * 4096], sp),
            ),
            (
                "transpose 4096x4096 +64 bytes",
                c(vec![4096, 4096], vec![4 * 4096, 4], dp.wrapping_add(64)),
                c(vec![4096, 4096], vec![4, 4 * 4096], sp.wrapping_add(64)),
            ),
            (
                "transpose 4096x4096 +16 bytes",
                c(vec![4096, 4096], vec![4 * 4096, 4], dp.wrapping_add(16)),
                c(vec![4096, 4096], vec![4, 4 * 4096], sp.wrapping_add(16)),
            ),
            (
                "permute 64^4 (3,1,2,0)",
                c(vec![64; 4], vec![4 << 18, 4 << 12, 4 << 6, 4], dp),
                c(vec![64; 4], vec![4, 4 << 12, 4 << 6, 4 << 18], sp),
            ),
            (
                "gather stride 2",
                c(vec![n], vec![4], dp),
                c(vec![n], vec![8], sp),
            ),
            (
                "reverse",
                c(vec![n], vec![4], dp),
                c(vec![n], vec![-4], sp.wrapping_add(4 * (n - 1))),
            ),
            (
                "transpose 2048x8192 f64",
                c(vec![2048, 4096], vec![8 * 4096, 8], dp),
                c(vec![2048, 4096], vec![8, 8 * 2048], sp),
            ),
        ];
        let only = std::env::var("COPY_BENCH").unwrap_or_default();
        let configs = [
            ("", Config::new()),
            (
                " (1 thread)",
                Config {
                    threads: 1,
                    ..Config::new()
                },
            ),
            (
                " (no streaming)",
                Config {
                    streaming_threshold: usize::MAX,
                    ..Config::new()
                },
            ),
        ];
        for (name, d, s) in cases.iter().filter(|c| c.0.contains(only.as_str())) {
            let item = if name.contains("f64") { 8 } else { 4 };
            let mut times = [f64::INFINITY; 3];
            for _ in 0..15 {
                for (k, (_, config)) in configs.iter().enumerate() {
                    // SAFETY: see above.
                    let t = best(1, || unsafe {
                        copy_strided_with(d, s, item, None, *config)
                    });
                    times[k] = times[k].min(t);
                }
            }
            for ((label, _), t) in configs.iter().zip(times) {
                report(&format!("{name}{label}"), t);
            }
        }
    }
}
