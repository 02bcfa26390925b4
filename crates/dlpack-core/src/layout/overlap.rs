//! Whether the elements of a strided layout share bytes: exactly when the strides nest, by
//! enumeration within a budget otherwise.

/// Whether the elements of a strided layout share bytes with one another (a write through one
/// would change another: torch's "more than one element of the written-to tensor refers to a
/// single memory location").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelfOverlap {
    Disjoint,
    Overlapping,
    /// Too many elements to settle by enumeration, and the strides don't nest: treat as
    /// possibly overlapping.
    Unknown,
}

/// How much work `self_overlap` may do on layouts whose strides don't nest: offsets listed and
/// pairs compared (8 bytes each, at most this many held).
const OVERLAP_BUDGET: u64 = 1 << 20;

/// Whether the elements of a layout, given as (extent, byte stride) pairs, overlap one another.
/// Always exact when the strides nest (each, smallest first, steps over everything the smaller
/// ones reach: C, Fortran and any permuted, gapped or reversed dense layout); otherwise exact
/// unless it would take more than `OVERLAP_BUDGET` steps (`Unknown`).
pub fn self_overlap(layout: impl IntoIterator<Item = (u64, i64)>, itemsize: u64) -> SelfOverlap {
    self_overlap_within(layout, itemsize, OVERLAP_BUDGET)
}

fn self_overlap_within(
    layout: impl IntoIterator<Item = (u64, i64)>,
    itemsize: u64,
    budget: u64,
) -> SelfOverlap {
    let layout: Vec<(u64, i64)> = layout.into_iter().collect();
    if itemsize == 0 || layout.iter().any(|&(n, _)| n == 0) {
        return SelfOverlap::Disjoint; // no bytes, or no elements
    }
    let mut dims: Vec<(u64, u64)> = Vec::with_capacity(layout.len());
    for (n, stride) in layout {
        // Walking a dimension backwards addresses the same set of bytes, shifted.
        let stride = stride.unsigned_abs();
        match n {
            1 => {}
            // Neighbours along this dimension meet.
            _ if stride < itemsize => return SelfOverlap::Overlapping,
            _ => dims.push((n, stride)),
        }
    }
    // The inner dimensions, smallest stride first, as far as they nest: a block of disjoint
    // elements reaching `span` bytes from its first one.
    dims.sort_unstable_by_key(|&(_, stride)| stride);
    let mut span = itemsize;
    let mut nested = 0;
    for &(n, stride) in &dims {
        match (n - 1)
            .checked_mul(stride)
            .and_then(|s| s.checked_add(span))
        {
            Some(reach) if stride >= span => span = reach,
            _ => break,
        }
        nested += 1;
    }
    let (inner, outer) = dims.split_at(nested);
    if outer.is_empty() {
        return SelfOverlap::Disjoint;
    }
    // The outer dimensions place copies of the block; two copies less than `span` bytes apart
    // may meet, and meet exactly when an element of one falls on an element of the other.
    let count = outer
        .iter()
        .try_fold(1u64, |acc, &(n, _)| acc.checked_mul(n))
        .filter(|&count| count <= budget);
    let Some(count) = count else {
        return SelfOverlap::Unknown;
    };
    let mut starts: Vec<u64> = Vec::with_capacity(count as usize);
    starts.push(0);
    for &(n, stride) in outer {
        let before = starts.len();
        for i in 1..n {
            // No overflow: importers checked that the layout's bytes fit in an i64.
            let shift = i.wrapping_mul(stride);
            starts.extend_from_within(..before);
            let copies = before * i as usize..;
            starts[copies]
                .iter_mut()
                .for_each(|o| *o = o.wrapping_add(shift));
        }
    }
    starts.sort_unstable();
    let mut work = budget;
    for (k, &first) in starts.iter().enumerate() {
        for &second in &starts[k + 1..] {
            let gap = second - first;
            if gap >= span {
                break;
            }
            match blocks_meet(inner, i128::from(gap), i128::from(itemsize), &mut work) {
                Some(false) => {}
                Some(true) => return SelfOverlap::Overlapping,
                None => return SelfOverlap::Unknown,
            }
        }
    }
    SelfOverlap::Disjoint
}

/// Whether an element of the nested block `inner` (sorted by stride, each stride at least the
/// reach of those before it) shares a byte with an element of the same block moved by `gap`
/// bytes: some steps `d_k`, `|d_k| < n_k`, with `|gap + sum(d_k * stride_k)| < itemsize`.
/// Nesting leaves at most two candidate steps per dimension. `None`: out of `work`.
fn blocks_meet(inner: &[(u64, u64)], gap: i128, itemsize: i128, work: &mut u64) -> Option<bool> {
    *work = work.checked_sub(1)?;
    let Some((&(n, stride), rest)) = inner.split_last() else {
        return Some(gap.abs() < itemsize);
    };
    let (n, stride) = (i128::from(n), i128::from(stride));
    // The rest moves an element by less than `reach` bytes either way.
    let reach = rest
        .iter()
        .map(|&(n, s)| (i128::from(n) - 1) * i128::from(s))
        .sum::<i128>()
        + itemsize;
    let low = (-gap - reach).div_euclid(stride) + 1;
    let high = (-gap + reach - 1).div_euclid(stride);
    for d in low.max(1 - n)..=high.min(n - 1) {
        if blocks_meet(rest, gap + d * stride, itemsize, work)? {
            return Some(true);
        }
    }
    Some(false)
}

/// Whether (extent, |stride|) pairs of extents above 1 nest: sorted by stride, each stride is
/// at least the span of the dimensions inside it, so no two elements can meet. Sorts `dims`.
pub fn strides_nest(dims: &mut [(u64, u64)], itemsize: u64) -> bool {
    dims.sort_unstable_by_key(|&(_, stride)| stride);
    let mut span = itemsize; // bytes reached by the dimensions inside, from one element
    for &(n, stride) in dims.iter() {
        if stride < span {
            return false;
        }
        span = match (n - 1)
            .checked_mul(stride)
            .and_then(|s| s.checked_add(span))
        {
            Some(span) => span,
            None => return false,
        };
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::reference::offsets;
    use proptest::prelude::*;

    #[test]
    fn self_overlap_cases() {
        use SelfOverlap::*;
        // dense, transposed, gapped, reversed
        assert_eq!(self_overlap([(3, 16), (4, 4)], 4), Disjoint);
        assert_eq!(self_overlap([(4, 4), (3, 16)], 4), Disjoint);
        assert_eq!(self_overlap([(3, -20), (4, 4)], 4), Disjoint);
        // broadcast, stride smaller than the item, rows that run into each other
        assert_eq!(self_overlap([(2, 0)], 4), Overlapping);
        assert_eq!(self_overlap([(3, 2)], 4), Overlapping);
        assert_eq!(self_overlap([(3, 8), (3, 4)], 4), Overlapping);
        // interleaved without overlap: strides don't nest, the listing settles it
        assert_eq!(self_overlap([(2, 12), (3, 8)], 4), Disjoint);
        // empty, a single element, extent-1 dimensions with any stride
        assert_eq!(self_overlap([(0, 0), (5, 0)], 4), Disjoint);
        assert_eq!(self_overlap([(1, 0), (1, 3)], 4), Disjoint);
        // large layouts whose strides don't nest: settled through the nested block
        assert_eq!(self_overlap([(2048, 4), (1024, 4)], 4), Overlapping);
        assert_eq!(self_overlap([(2, 12), (1 << 21, 8)], 4), Disjoint);
        assert_eq!(self_overlap([(1 << 21, 3)], 4), Overlapping);
        assert_eq!(self_overlap([(1 << 11, 0), (1 << 11, 8)], 4), Overlapping);
        assert_eq!(self_overlap([(1 << 11, 12), (1 << 11, 8)], 4), Overlapping); // 2*12 = 3*8
        // ... unless placing the blocks is too much work
        assert_eq!(self_overlap([(1 << 21, 12), (3, 8)], 4), Unknown);
    }

    /// Within the nested block a step is less than its extent: a step as long as the extent
    /// would place an element that isn't there. Here the block (strides 2, 3, 8) moved by 4
    /// bytes (between the outer copies at 8 and 12) would meet itself only through such a step
    /// (4 - 8 + 2 * 2 = 0), and no element of the layout shares a byte with another.
    #[test]
    fn a_block_meets_itself_only_through_steps_within_its_extents() {
        let layout = [(2, 2), (2, 3), (2, 12), (3, 8)];
        assert!(!overlaps_by_bytes(&layout, 1));
        assert_eq!(self_overlap(layout, 1), SelfOverlap::Disjoint);
    }

    /// Reference: mark every byte of every element; any byte marked twice is an overlap.
    fn overlaps_by_bytes(dims: &[(u64, i64)], itemsize: u64) -> bool {
        let shape: Vec<i64> = dims.iter().map(|d| d.0 as i64).collect();
        let strides: Vec<i64> = dims.iter().map(|d| d.1).collect();
        let mut seen = std::collections::HashSet::new();
        for start in offsets(&shape, &strides, 1) {
            for b in 0..itemsize as i64 {
                if !seen.insert(start + b) {
                    return true;
                }
            }
        }
        false
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// Blocks of up to three nested loops placed closer together than a block spans, where
        /// only a search of the steps between two blocks (`blocks_meet`) tells whether they
        /// meet: the answer is the bytes' own.
        #[test]
        fn interleaved_blocks_match_reference(
            inner in proptest::collection::vec((2u64..4, 0u64..3), 1..=3),
            outer in proptest::collection::vec((2u64..4, 0u64..1000, any::<bool>()), 1..=2),
            item in 1u64..5,
        ) {
            let mut dims: Vec<(u64, i64)> = Vec::new();
            let mut span = item;
            for &(n, extra) in &inner {
                let stride = span + extra;
                dims.push((n, stride as i64));
                span += (n - 1) * stride;
            }
            for &(n, stride, negative) in &outer {
                let stride = (stride % span) as i64;
                dims.push((n, if negative { -stride } else { stride }));
            }
            let expected = if overlaps_by_bytes(&dims, item) {
                SelfOverlap::Overlapping
            } else {
                SelfOverlap::Disjoint
            };
            prop_assert_eq!(self_overlap(dims.iter().copied(), item), expected, "{:?}", dims);
        }
    }

    proptest! {
        #[test]
        fn self_overlap_matches_reference(
            dims in proptest::collection::vec((0u64..5, -12i64..13), 0..5),
            item in 1u64..9,
        ) {
            let expected = if overlaps_by_bytes(&dims, item) {
                SelfOverlap::Overlapping
            } else {
                SelfOverlap::Disjoint
            };
            prop_assert_eq!(self_overlap(dims.iter().copied(), item), expected);
            // Small budgets: the answer may be Unknown, but never the wrong one.
            for budget in [0, 1, 2, 7] {
                let answer = self_overlap_within(dims.iter().copied(), item, budget);
                prop_assert!(answer == expected || answer == SelfOverlap::Unknown);
            }
            let mut big: Vec<(u64, u64)> = dims.iter().filter(|d| d.0 > 1)
                .map(|d| (d.0, d.1.unsigned_abs())).collect();
            if strides_nest(&mut big, item) {
                prop_assert_eq!(expected, SelfOverlap::Disjoint);
            }
        }
    }
}
