//! Tests of the CPU copy engine against an element-by-element reference.

use super::engine::*;
use super::tiles::Isa;
use super::tune::{Band, Choice, Class, How, Key, Limits, Memory, Settings, Tuner};
use crate::copy::plan::{self, Kernel};
use proptest::prelude::*;

/// Several threads and streaming stores for any size.
fn force_threads() -> Config {
    Config::fixed(3, true)
}

/// Limits that make copies of a few bytes measure: every copy is in a band, and calibrations
/// take chunks of any size.
pub(super) const TINY: Limits = Limits {
    parallel: 1,
    large: 256,
    min_bytes_per_thread: 1,
    calibration_max_bytes: usize::MAX,
    calibration_chunk_bytes: 1 << 30,
    calibration_min_bytes_per_thread: 1,
    // Tests count chunks: measuring never stops for its cost.
    cost_budget: f64::INFINITY,
};

/// `tuner` for the rest of the test process: kept in a list, so a leak check sees it reachable
/// (configurations hold a `&'static Tuner`).
pub(super) fn keep(tuner: Tuner) -> &'static Tuner {
    static KEPT: std::sync::Mutex<Vec<&'static Tuner>> = std::sync::Mutex::new(Vec::new());
    let tuner: &'static Tuner = Box::leak(Box::new(tuner));
    KEPT.lock().unwrap_or_else(|e| e.into_inner()).push(tuner);
    tuner
}

/// A fresh tuner with [`TINY`] limits and up to 3 threads: the copy measures.
fn measuring() -> Config {
    let tuner = keep(Tuner::new(TINY, Settings::default(), 3));
    Config {
        tuner,
        ..Config::new()
    }
}

/// The configurations every layout is checked with: the default, forced threads and streaming
/// with the CPU's block kernels, and with the architecture's baseline ones, and a calibration.
fn configs() -> [Config; 4] {
    [
        Config::new(),
        force_threads(),
        Config {
            isa: Isa::baseline(),
            ..force_threads()
        },
        measuring(),
    ]
}

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
        let gaps = proptest::collection::vec(prop_oneof![3 => Just(0usize), 1 => 1usize..5], ndim);
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
        for config in configs() {
            check(&shape, &src, &dst, item, swap, pads, config)?;
        }
    }
}

/// Reference: whether two elements of a layout share a byte, by marking every byte of every
/// element.
fn shares_bytes(shape: &[usize], strides: &[isize], itemsize: usize) -> bool {
    let mut seen = std::collections::HashSet::new();
    let numel: usize = shape.iter().product();
    for flat in 0..numel {
        let (mut rest, mut at) = (flat, 0isize);
        for k in (0..shape.len()).rev() {
            at += (rest % shape[k]) as isize * strides[k];
            rest /= shape[k];
        }
        if !(0..itemsize as isize).all(|b| seen.insert(at + b)) {
            return true;
        }
    }
    false
}

/// Shape, source and destination strides of any byte value (zero, negative, odd, interleaved
/// in ways that don't nest), the destination's elements disjoint (by the reference), not only
/// the permuted packed layouts `case` gives the destination.
fn any_disjoint_case() -> impl Strategy<Value = Case> {
    let item = proptest::sample::select(vec![1usize, 2, 3, 4, 8, 16]);
    (item, 0usize..=4)
        .prop_flat_map(|(item, ndim)| {
            let shape = proptest::collection::vec(0usize..5, ndim);
            let span = 5 * item as isize + 5;
            let stride = move || {
                prop_oneof![
                    (-5isize..=5).prop_map(move |k| k * item as isize),
                    -span..=span,
                ]
            };
            let src = proptest::collection::vec(stride(), ndim);
            let dst = proptest::collection::vec(stride(), ndim);
            let swap = prop_oneof![Just(None), Just(Some(item)), Just(Some((item / 2).max(1)))];
            (shape, src, dst, Just(item), swap, (0usize..4, 0usize..4))
        })
        .prop_filter(
            "destination elements overlap",
            |(shape, _, dst, item, _, _)| !shares_bytes(shape, dst, *item),
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn any_disjoint_destination_matches_reference(
        (shape, src, dst, item, swap, pads) in any_disjoint_case()
    ) {
        for config in configs() {
            check(&shape, &src, &dst, item, swap, pads, config)?;
        }
    }

    /// `byte_span` and `may_overlap` against every element's bytes. No memory is touched: the
    /// base addresses are plain numbers.
    #[test]
    fn spans_and_overlap_match_enumeration(
        a in proptest::collection::vec((0usize..4, -9isize..=9), 0..=3),
        b in proptest::collection::vec((0usize..4, -9isize..=9), 0..=3),
        bases in (1000usize..1040, 1000usize..1040),
        item in 1usize..5,
    ) {
        let strided = |dims: &[(usize, isize)], base: usize| Strided {
            ptr: base as *mut u8,
            shape: dims.iter().map(|d| d.0).collect(),
            strides: dims.iter().map(|d| d.1).collect(),
        };
        let bytes = |x: &Strided| -> std::collections::BTreeSet<i128> {
            let numel: usize = x.shape.iter().product();
            let mut out = std::collections::BTreeSet::new();
            for flat in 0..numel {
                let (mut rest, mut at) = (flat, x.ptr as usize as i128);
                for k in (0..x.shape.len()).rev() {
                    at += (rest % x.shape[k]) as i128 * x.strides[k] as i128;
                    rest /= x.shape[k];
                }
                out.extend(at..at + item as i128);
            }
            out
        };
        let (sa, sb) = (strided(&a, bases.0), strided(&b, bases.1));
        let (ba, bb) = (bytes(&sa), bytes(&sb));
        let span = |set: &std::collections::BTreeSet<i128>| {
            Some((*set.first()?, *set.last()? + 1))
        };
        prop_assert_eq!(byte_span(&sa, item), span(&ba));
        prop_assert_eq!(byte_span(&sb, item), span(&bb));
        // Conservative: bytes in common imply "may overlap"; "may overlap" is exactly that the
        // two spans meet.
        let meet = match (span(&ba), span(&bb)) {
            (Some(x), Some(y)) => x.0 < y.1 && y.0 < x.1,
            _ => false,
        };
        prop_assert_eq!(may_overlap(&sa, &sb, item), meet);
        if !ba.is_disjoint(&bb) {
            prop_assert!(may_overlap(&sa, &sb, item));
        }
    }
}

/// One thread, whatever the size.
fn one_thread() -> Config {
    Config::fixed(1, false)
}

/// Copy into a destination whose elements may overlap one another (strides of any byte value,
/// zero included): forced threading must not split it between threads, so the bytes are
/// exactly what one thread writes.
fn check_overlapping(dims: &[(usize, isize)], item: usize) -> Result<(), TestCaseError> {
    let shape: Vec<usize> = dims.iter().map(|d| d.0).collect();
    let dst: Vec<isize> = dims.iter().map(|d| d.1).collect();
    let c_order: Vec<usize> = (0..shape.len()).rev().collect();
    let no_gaps = vec![0; shape.len()];
    let src = dst_strides(&shape, item, &c_order, &no_gaps, &vec![false; shape.len()]);
    let source = Array::new(&shape, &src, item, 0, 7);
    let mut results = Vec::new();
    for config in [one_thread(), force_threads(), measuring()] {
        let mut source = Array::new(&shape, &src, item, 0, 7);
        let mut target = Array::new(&shape, &dst, item, 3, 101);
        // SAFETY: both layouts lie inside their own buffers.
        unsafe { copy_strided_with(&target.strided(), &source.strided(), item, None, config) };
        prop_assert!(source.bytes == Array::new(&shape, &src, item, 0, 7).bytes);
        results.push(target.bytes);
    }
    prop_assert!(results[0] == results[1], "threads changed the result");
    prop_assert!(results[0] == results[2], "calibrating changed the result");
    // Where the elements are disjoint, that is the element-by-element reference.
    let layout = shape.iter().zip(&dst).map(|(&n, &s)| (n as u64, s as i64));
    if crate::layout::self_overlap(layout, item as u64) == crate::layout::SelfOverlap::Disjoint {
        let mut expected = Array::new(&shape, &dst, item, 3, 101);
        reference(&mut expected, &source, item, 0);
        prop_assert!(results[0] == expected.bytes);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]
    #[test]
    fn overlapping_destinations_are_written_by_one_thread(
        dims in proptest::collection::vec((1usize..40, -20isize..21), 1..4),
        item in proptest::sample::select(vec![1usize, 2, 4, 8]),
    ) {
        check_overlapping(&dims, item)?;
    }
}

/// Cases the property test once found.
#[test]
fn overlapping_destinations_found_before() {
    check_overlapping(&[(12, -2), (24, 11)], 1).unwrap();
    check_overlapping(&[(18, -5), (28, -9)], 2).unwrap();
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
                    let dst =
                        dst_strides(&shape, item, &c_order, &dst_gaps, &vec![false; shape.len()]);
                    (shape, src, dst, item, swap, pads)
                },
            )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn transposes_match_reference((shape, src, dst, item, swap, pads) in transposed_case()) {
        for config in configs() {
            check(&shape, &src, &dst, item, swap, pads, config)?;
        }
    }
}

/// Every choice the calibration can make, forced: threads from one to four, ordinary and
/// streaming stores.
fn every_choice() -> impl Iterator<Item = Config> {
    (1..=4).flat_map(|threads| [false, true].map(|streaming| Config::fixed(threads, streaming)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    /// Whatever threads and stores the engine picks, the bytes are the reference's: any layout,
    /// and transposes large enough for the tiled kernels.
    #[test]
    fn every_choice_matches_reference(
        (shape, src, dst, item, swap, pads) in case(),
        (t_shape, t_src, t_dst, t_item, t_swap, t_pads) in transposed_case(),
    ) {
        for config in every_choice() {
            check(&shape, &src, &dst, item, swap, pads, config)?;
            check(&t_shape, &t_src, &t_dst, t_item, t_swap, t_pads, config)?;
        }
    }
}

/// A copy with room for a chunk more than the calibration times copies it first, untimed,
/// from the first line boundary on: the bytes are the reference's at every alignment, and the
/// measuring counts them.
#[test]
fn calibration_warms_up_on_a_chunk() {
    let limits = Limits {
        calibration_chunk_bytes: 16 << 10,
        ..TINY
    };
    for pads in [(0, 0), (1, 3), (4, 20), (16, 44)] {
        for (shape, src, dst) in [
            (vec![1usize << 18], vec![4isize], vec![4isize]),
            (vec![512, 512], vec![4, 2048], vec![2048, 4]),
        ] {
            let tuner: &'static Tuner = keep(Tuner::new(limits, Settings::default(), 3));
            let config = Config {
                tuner,
                ..Config::new()
            };
            check(&shape, &src, &dst, 4, None, pads, config).unwrap();
            let log = tuner.log();
            let [(_, record)] = &log[..] else {
                panic!("{shape:?} {pads:?}: one calibration, kept: {log:?}");
            };
            let How::Measured(m) = &record.how else {
                panic!("measured");
            };
            // The warm-up chunk, the least rounds of the first candidate and a chunk of every
            // other (one whose threads waited for a core takes no more), in chunks of at least
            // half the size asked for.
            let k = m.candidates.len();
            let least = (1 + 2 + (k - 1)) * (8 << 10);
            assert!(m.calibrated_bytes >= least, "{m:?}");
            assert!(m.calibrated_bytes <= 1 << 20, "{m:?}");
        }
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
            for config in configs() {
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
    let eight = Choice {
        threads: 8,
        streaming: false,
    };
    assert_eq!(Limits::DEFAULT.threads_for(n * 4, eight), 8);
    assert_eq!(Limits::DEFAULT.threads_for((4 << 20) - 1, eight), 1);
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
    // SAFETY: `d2` addresses `dst2` exactly; `s2` items 0, 2, .., n - 2 of `src`.
    unsafe { copy_strided_with(&d2, &s2, 4, None, force_threads()) };
    assert!(dst2.iter().enumerate().all(|(k, &v)| v as usize == 2 * k));
    let s3 = Strided {
        strides: vec![4],
        ..s2
    };
    // SAFETY: `d2` addresses `dst2` exactly; `s3` the first n / 2 items of `src`.
    unsafe { copy_strided_with(&d2, &s3, 4, None, force_threads()) };
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
        for config in configs() {
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
            // SAFETY: the layout lies inside `a`'s buffer, readable and writable; the same view.
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
    // SAFETY: `d` addresses `a` exactly; `s` (no strides for its one dimension) addresses
    // nothing, and the mismatch copies nothing.
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

/// Calibration runs on the copy itself: every candidate copies chunks of it, the choice is
/// kept and used by the next copy, and the bytes are the reference's whatever it picks.
#[test]
fn calibration_measures_on_the_copy() {
    let contiguous = (
        vec![1usize << 16],
        vec![4isize],
        vec![4isize],
        None,
        Class::Contiguous,
    );
    let cases = [
        contiguous.clone(),
        (
            vec![256, 256],
            vec![4, 1024],
            vec![1024, 4],
            None,
            Class::Tiles,
        ),
        (vec![1 << 15], vec![8], vec![4], None, Class::Gather),
        (vec![1 << 16], vec![4], vec![4], Some(4), Class::Swap),
        (
            vec![64, 1024],
            vec![-4096, 4],
            vec![4096, 4],
            None,
            Class::Contiguous,
        ),
    ];
    for (shape, src, dst, swap, class) in cases {
        let tuner: &'static Tuner = keep(Tuner::new(TINY, Settings::default(), 3));
        let config = Config {
            tuner,
            ..Config::new()
        };
        for _ in 0..2 {
            check(&shape, &src, &dst, 4, swap, (0, 0), config).unwrap();
        }
        let log = tuner.log();
        let [(key, record)] = &log[..] else {
            panic!("{class:?}: one calibration, kept: {log:?}");
        };
        let band = Band::Large;
        let memory = Memory::Mapped;
        assert_eq!(
            *key,
            Key {
                class,
                band,
                memory
            }
        );
        let How::Measured(m) = &record.how else {
            panic!("{class:?}: measured");
        };
        let candidates = tuner.candidates(class);
        let measured: Vec<Choice> = m.candidates.iter().map(|c| c.0).collect();
        assert_eq!(measured, candidates);
        assert!(m.candidates.iter().all(|c| c.1.is_some()), "{m:?}");
        assert!(candidates.contains(&record.choice));
        let bytes = shape.iter().product::<usize>() * 4;
        assert_eq!(m.copy_bytes, bytes);
        assert!(m.calibrated_bytes > 0 && m.calibrated_bytes <= bytes);
        assert!(m.cost_seconds <= m.seconds);
    }
}

/// A copy too small to cut into chunks for every candidate measures nothing, and a later,
/// larger one does.
#[test]
fn calibration_waits_for_a_copy_large_enough() {
    let tuner: &'static Tuner = keep(Tuner::new(TINY, Settings::default(), 3));
    let config = Config {
        tuner,
        ..Config::new()
    };
    check(&[16], &[4], &[4], 4, None, (1, 2), config).unwrap();
    assert!(tuner.log().is_empty());
    check(&[1 << 14], &[4], &[4], 4, None, (1, 2), config).unwrap();
    assert_eq!(tuner.log().len(), 1);
}

/// A copy into memory never written before, whose pages the kernel maps as it writes them, is
/// measured and kept apart from copies into memory written before; the next copy into the same
/// memory measures again, for memory in place. Every byte is copied each time.
#[cfg(target_os = "linux")]
#[test]
fn fresh_memory_is_measured_apart() {
    use rustix::mm::{MapFlags, ProtFlags, mmap_anonymous, munmap};
    let n = 1 << 18; // 1 MiB of u32
    let src: Vec<u32> = (0..n as u32).collect();
    // SAFETY: a fresh private anonymous mapping, no address asked for.
    let fresh = unsafe {
        mmap_anonymous(
            std::ptr::null_mut(),
            4 * n,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE,
        )
    }
    .expect("a mapping");
    let tuner: &'static Tuner = keep(Tuner::new(TINY, Settings::default(), 3));
    let config = Config {
        tuner,
        ..Config::new()
    };
    let flat = |ptr| Strided {
        ptr,
        shape: vec![n],
        strides: vec![4],
    };
    let (d, s) = (flat(fresh.cast()), flat(src.as_ptr().cast_mut().cast()));
    for memory in [Memory::Fresh, Memory::Mapped] {
        // SAFETY: `d` addresses the mapping exactly, `s` the vector.
        unsafe { copy_strided_with(&d, &s, 4, None, config) };
        // SAFETY: the mapping holds `n` u32, all written by the copy.
        let out = unsafe { std::slice::from_raw_parts(fresh.cast::<u32>(), n) };
        assert!(out == &src[..]);
        let log = tuner.log();
        let (key, record) = log.last().expect("a calibration");
        let class = Class::Contiguous;
        let band = Band::Large;
        assert_eq!(
            *key,
            Key {
                class,
                band,
                memory
            }
        );
        assert!(matches!(record.how, How::Measured(_)));
    }
    assert_eq!(tuner.log().len(), 2);
    // SAFETY: the mapping made above, no longer used.
    unsafe { munmap(fresh, 4 * n) }.expect("unmapped");
}

/// Rows contiguous in the destination but not in the source (broadcasts, reversals, every other
/// item, any stride), long enough for whole destination lines, at every alignment: written with
/// streaming stores a line at a time, they are the reference's bytes.
#[test]
fn gathers_with_streaming_stores() {
    for item in [1usize, 2, 4, 8, 16, 3] {
        let i = item as isize;
        for s in [0, -i, 2 * i, 3 * i, -2 * i, 2 * i + 1] {
            for n in [1usize, 15, 64, 100, 257] {
                for pads in [(0, 0), (1, 3), (2, 16), (5, 40)] {
                    for (swap, config) in [
                        (None, Config::fixed(1, true)),
                        (Some(item), Config::fixed(1, true)),
                        (None, Config::fixed(2, true)),
                    ] {
                        check(&[n], &[s], &[i], item, swap, pads, config).unwrap();
                    }
                }
            }
        }
    }
}
