//! The layout planner of the CPU copy engine: pure functions on shapes and byte strides.
//!
//! [`plan`] turns a (shape, destination strides, source strides) triple into the fewest loops
//! that address exactly the same (destination, source) byte-offset pairs: extent-1 dimensions
//! go, negative destination strides are flipped (jointly with the source's), the loops are
//! ordered by destination stride (outermost largest, so the innermost loop writes with the
//! smallest stride) and neighbours that are contiguous on both sides are merged.
//! [`choose_kernel`] picks the inner kernel for a plan and [`split`] cuts a plan into pieces
//! for threads.

/// One loop: `n` steps of `dst` bytes in the destination and `src` bytes in the source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dim {
    pub n: usize,
    pub dst: isize,
    pub src: isize,
}

/// Loops (outermost first) and where they start, in bytes from the callers' base pointers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub dst_offset: isize,
    pub src_offset: isize,
    pub dims: Vec<Dim>,
}

impl Plan {
    /// Elements the plan copies.
    pub fn numel(&self) -> usize {
        self.dims
            .iter()
            .fold(1usize, |acc, d| acc.saturating_mul(d.n))
    }
}

/// Plan a copy of `shape` from `src_strides` to `dst_strides` (bytes). `None`: nothing to copy
/// (an extent is 0). Slices of different lengths are cut to the shortest.
pub fn plan(shape: &[usize], dst_strides: &[isize], src_strides: &[isize]) -> Option<Plan> {
    if shape.contains(&0) {
        return None;
    }
    let mut dst_offset = 0isize;
    let mut src_offset = 0isize;
    let mut dims: Vec<Dim> = shape
        .iter()
        .zip(dst_strides)
        .zip(src_strides)
        .filter(|((n, _), _)| **n > 1)
        .map(|((&n, &dst), &src)| {
            if dst < 0 {
                // Walk this loop backwards on both sides: the same pairs, a positive dst stride.
                let last = (n - 1) as isize;
                dst_offset = dst_offset.wrapping_add(last.wrapping_mul(dst));
                src_offset = src_offset.wrapping_add(last.wrapping_mul(src));
                Dim {
                    n,
                    dst: dst.wrapping_neg(),
                    src: src.wrapping_neg(),
                }
            } else {
                Dim { n, dst, src }
            }
        })
        .collect();
    // Largest destination stride outermost; ties (only possible with a zero or aliasing
    // destination stride) by source stride. A stable sort keeps the caller's order otherwise.
    dims.sort_by(|a, b| {
        (b.dst.unsigned_abs(), b.src.unsigned_abs())
            .cmp(&(a.dst.unsigned_abs(), a.src.unsigned_abs()))
    });
    let mut merged: Vec<Dim> = Vec::with_capacity(dims.len());
    for d in dims {
        if let Some(outer) = merged.last_mut()
            && let Some(n) = outer.n.checked_mul(d.n)
            && Some(outer.dst) == d.dst.checked_mul(d.n as isize)
            && Some(outer.src) == d.src.checked_mul(d.n as isize)
        {
            *outer = Dim {
                n,
                dst: d.dst,
                src: d.src,
            };
            continue;
        }
        merged.push(d);
    }
    Some(Plan {
        dst_offset,
        src_offset,
        dims: merged,
    })
}

/// The inner kernel for a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Rows: the last loop (the smallest destination stride) innermost, the one before it
    /// around it, the others in plan order outside.
    Rows,
    /// Cache-blocked tiles over loop `a` (the smallest source stride) and the last loop (the
    /// smallest destination stride), so that both sides are read and written along lines; the
    /// other loops in plan order outside, but for one that carries on along the source from
    /// where `a` ends, which the tiles walk too.
    Tile { a: usize },
}

/// Source strides at least this large make every element of a row its own cache line: worth
/// tiling when another loop walks the source densely.
pub const TILE_MIN_SRC_STRIDE: usize = 64;
/// A loop with a source stride at most this many items is dense enough to tile along.
pub const TILE_MAX_DENSE_ITEMS: usize = 2;
/// Loops shorter than this are not worth tiling.
pub const TILE_MIN_EXTENT: usize = 8;

/// Pick the kernel: tiles when the destination's innermost loop strides far through the source
/// and another loop walks the source (nearly) densely; rows otherwise.
pub fn choose_kernel(plan: &Plan, itemsize: usize) -> Kernel {
    let Some((inner, outer)) = plan.dims.split_last() else {
        return Kernel::Rows;
    };
    let inner_src = inner.src.unsigned_abs();
    if inner.n < TILE_MIN_EXTENT || inner_src < TILE_MIN_SRC_STRIDE.max(2 * itemsize) {
        return Kernel::Rows;
    }
    let best = outer
        .iter()
        .enumerate()
        .filter(|(_, d)| d.src != 0 && d.n >= TILE_MIN_EXTENT)
        .min_by_key(|(_, d)| d.src.unsigned_abs());
    match best {
        Some((a, d)) if d.src.unsigned_abs() <= TILE_MAX_DENSE_ITEMS * itemsize => {
            Kernel::Tile { a }
        }
        _ => Kernel::Rows,
    }
}

/// Which loop to cut into pieces for `pieces` threads, and in multiples of how many steps.
/// Prefers the outermost loop the kernel leaves outside with enough steps, then the kernel's
/// own loops, else the longest loop.
pub fn split_dim(
    plan: &Plan,
    kernel: Kernel,
    pieces: usize,
    tile: usize,
) -> Option<(usize, usize)> {
    let last = plan.dims.len().checked_sub(1)?;
    let kernel_dims: Vec<usize> = match kernel {
        Kernel::Rows => (last.saturating_sub(1)..=last).collect(),
        Kernel::Tile { a } => vec![a, last],
    };
    let granule = |j: usize| match kernel {
        Kernel::Tile { .. } if kernel_dims.contains(&j) => tile,
        // Whole pages of a long innermost row, so pieces don't share cache lines.
        Kernel::Rows if j == last => 1024,
        _ => 1,
    };
    let order = (0..=last)
        .filter(|j| !kernel_dims.contains(j))
        .chain(kernel_dims.iter().copied());
    let enough = |j: usize| plan.dims[j].n / granule(j) >= 2 * pieces;
    if let Some(j) = order.clone().find(|&j| enough(j)) {
        return Some((j, granule(j)));
    }
    let j = order.max_by_key(|&j| plan.dims[j].n / granule(j))?;
    (plan.dims[j].n > granule(j)).then(|| (j, granule(j)))
}

/// Cut loop `dim` of `plan` into at most `pieces` consecutive ranges (multiples of `granule`
/// steps, the last one takes the rest); each piece is a plan of its own.
pub fn split(plan: &Plan, dim: usize, granule: usize, pieces: usize) -> Vec<Plan> {
    let n = plan.dims[dim].n;
    let granule = granule.max(1);
    let units = n.div_ceil(granule);
    let pieces = pieces.clamp(1, units.max(1));
    let mut out = Vec::with_capacity(pieces);
    let mut start_unit = 0;
    for p in 0..pieces {
        let end_unit = units * (p + 1) / pieces;
        let start = (start_unit * granule).min(n);
        let end = (end_unit * granule).min(n);
        start_unit = end_unit;
        if end > start {
            out.push(slice(plan, dim, start..end));
        }
    }
    out
}

/// Steps `range` of loop `dim` of `plan` (inside `0..n`), as a plan of its own.
pub fn slice(plan: &Plan, dim: usize, range: std::ops::Range<usize>) -> Plan {
    let d = plan.dims[dim];
    let mut piece = plan.clone();
    piece.dims[dim].n = range.end.min(d.n).saturating_sub(range.start);
    let start = range.start as isize;
    piece.dst_offset = piece.dst_offset.wrapping_add(start.wrapping_mul(d.dst));
    piece.src_offset = piece.src_offset.wrapping_add(start.wrapping_mul(d.src));
    piece
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every (dst, src) byte-offset pair loops over `dims` from the offsets address.
    fn pairs(
        dst0: isize,
        src0: isize,
        shape: &[usize],
        dst: &[isize],
        src: &[isize],
    ) -> Vec<(isize, isize)> {
        let numel: usize = shape.iter().product();
        let mut out = Vec::with_capacity(numel);
        for flat in 0..numel {
            let (mut rest, mut d, mut s) = (flat, dst0, src0);
            for k in (0..shape.len()).rev() {
                let i = (rest % shape[k]) as isize;
                rest /= shape[k];
                d += i * dst[k];
                s += i * src[k];
            }
            out.push((d, s));
        }
        out
    }

    fn plan_pairs(p: &Plan) -> Vec<(isize, isize)> {
        let shape: Vec<usize> = p.dims.iter().map(|d| d.n).collect();
        let dst: Vec<isize> = p.dims.iter().map(|d| d.dst).collect();
        let src: Vec<isize> = p.dims.iter().map(|d| d.src).collect();
        pairs(p.dst_offset, p.src_offset, &shape, &dst, &src)
    }

    fn sorted(mut v: Vec<(isize, isize)>) -> Vec<(isize, isize)> {
        v.sort_unstable();
        v
    }

    #[test]
    fn c_contiguous_merges_to_one_loop() {
        let p = plan(&[3, 4, 5], &[80, 20, 4], &[80, 20, 4]).unwrap();
        assert_eq!(
            p.dims,
            vec![Dim {
                n: 60,
                dst: 4,
                src: 4
            }]
        );
        assert_eq!((p.dst_offset, p.src_offset), (0, 0));
    }

    #[test]
    fn extent_one_and_zero() {
        let p = plan(&[1, 5, 1], &[7, 4, 9], &[3, -4, 11]).unwrap();
        assert_eq!(
            p.dims,
            vec![Dim {
                n: 5,
                dst: 4,
                src: -4
            }]
        );
        assert!(plan(&[3, 0], &[4, 4], &[4, 4]).is_none());
        let p = plan(&[], &[], &[]).unwrap();
        assert!(p.dims.is_empty());
        assert_eq!(p.numel(), 1);
    }

    #[test]
    fn negative_dst_strides_flip_jointly() {
        let p = plan(&[4], &[-8], &[8]).unwrap();
        assert_eq!(
            p.dims,
            vec![Dim {
                n: 4,
                dst: 8,
                src: -8
            }]
        );
        assert_eq!((p.dst_offset, p.src_offset), (-24, 24));
        // Reversed on both sides: a plain contiguous run again.
        let p = plan(&[2, 3], &[-12, -4], &[-12, -4]).unwrap();
        assert_eq!(
            p.dims,
            vec![Dim {
                n: 6,
                dst: 4,
                src: 4
            }]
        );
        assert_eq!((p.dst_offset, p.src_offset), (-20, -20));
    }

    #[test]
    fn orders_by_destination() {
        // src = a.T (a C-ordered 3x5 float32) into C order: a transpose.
        let p = plan(&[5, 3], &[12, 4], &[4, 20]).unwrap();
        assert_eq!(
            p.dims,
            vec![
                Dim {
                    n: 5,
                    dst: 12,
                    src: 4
                },
                Dim {
                    n: 3,
                    dst: 4,
                    src: 20
                }
            ]
        );
        // Into F order from C order: the same loops, sorted by the destination.
        let p = plan(&[3, 5], &[4, 12], &[20, 4]).unwrap();
        assert_eq!(
            p.dims,
            vec![
                Dim {
                    n: 5,
                    dst: 12,
                    src: 4
                },
                Dim {
                    n: 3,
                    dst: 4,
                    src: 20
                }
            ]
        );
        // Broadcast source rows merge.
        let p = plan(&[4, 6], &[24, 4], &[0, 0]).unwrap();
        assert_eq!(
            p.dims,
            vec![Dim {
                n: 24,
                dst: 4,
                src: 0
            }]
        );
    }

    #[test]
    fn kernels() {
        let t = plan(&[4096, 4096], &[16384, 4], &[4, 16384]).unwrap();
        assert_eq!(choose_kernel(&t, 4), Kernel::Tile { a: 0 });
        // 64^4 permute (3, 1, 2, 0): the middle loops merge, tiles over the outer and inner.
        let e = 4isize;
        let s = [e, 64 * 64 * e, 64 * e, 64 * 64 * 64 * e];
        let d = [64 * 64 * 64 * e, 64 * 64 * e, 64 * e, e];
        let p = plan(&[64; 4], &d, &s).unwrap();
        assert_eq!(p.dims.len(), 3);
        assert_eq!(choose_kernel(&p, 4), Kernel::Tile { a: 0 });
        let g = plan(&[1000], &[4], &[8]).unwrap();
        assert_eq!(choose_kernel(&g, 4), Kernel::Rows);
        let c = plan(&[1000, 1000], &[4000, 4], &[4000, 4]).unwrap();
        assert_eq!(choose_kernel(&c, 4), Kernel::Rows);
    }

    /// A plan of `(n, dst, src)` loops from offset 0.
    fn loops(dims: &[(usize, isize, isize)]) -> Plan {
        Plan {
            dst_offset: 0,
            src_offset: 0,
            dims: dims
                .iter()
                .map(|&(n, dst, src)| Dim { n, dst, src })
                .collect(),
        }
    }

    #[test]
    fn tiles_start_at_each_threshold() {
        // float32: the inner loop tiles from 8 steps and a 64-byte source stride on, along an
        // outer loop of at least 8 steps that reads at most 2 items apart, never a broadcast one
        let tile = |inner_n, inner_src, outer_n, outer_src| {
            choose_kernel(
                &loops(&[(outer_n, 4096, outer_src), (inner_n, 4, inner_src)]),
                4,
            )
        };
        assert_eq!(tile(8, 64, 8, 8), Kernel::Tile { a: 0 });
        assert_eq!(tile(7, 64, 8, 8), Kernel::Rows);
        assert_eq!(tile(8, 63, 8, 8), Kernel::Rows);
        assert_eq!(tile(8, 64, 7, 8), Kernel::Rows);
        assert_eq!(tile(8, 64, 8, 12), Kernel::Rows);
        assert_eq!(tile(8, 64, 16, 0), Kernel::Rows);
        // and a short inner loop stays rows however far apart its source items lie
        assert_eq!(tile(7, 4096, 8, 8), Kernel::Rows);
        // 64-byte items: the inner source stride must span two of them
        let wide = |inner_src| choose_kernel(&loops(&[(8, 8192, 64), (8, 64, inner_src)]), 64);
        assert_eq!(wide(128), Kernel::Tile { a: 0 });
        assert_eq!(wide(100), Kernel::Rows);
    }

    #[test]
    fn split_dim_prefers_outer_loops_then_the_kernels_in_granules() {
        let rows = Kernel::Rows;
        // the outermost loop the kernel leaves outside, when it has 2 steps per piece
        let p = loops(&[(3, 1 << 20, 8), (5000, 4096, 4096 * 8), (4096, 1, 1)]);
        assert_eq!(split_dim(&p, rows, 1, 32), Some((0, 1)));
        // else the kernel's outer loop, step by step
        assert_eq!(split_dim(&p, rows, 2, 32), Some((1, 1)));
        // a lone row is cut in whole pages (1024 steps)
        let row = loops(&[(4096, 1, 1)]);
        assert_eq!(split_dim(&row, rows, 2, 32), Some((0, 1024)));
        assert_eq!(split_dim(&row, rows, 3, 32), Some((0, 1024)));
        // tiles: a loop outside them step by step, the tiled loops in tiles
        let tiled = Kernel::Tile { a: 1 };
        let t = loops(&[(64, 1 << 20, 1 << 20), (100, 4096, 4), (100, 4, 4096)]);
        assert_eq!(split_dim(&t, tiled, 2, 32), Some((0, 1)));
        // the tiled loops alone, too short for 2 tiles per piece: the one with most tiles,
        // the last of equals
        let short = loops(&[(100, 4096, 4), (100, 4, 4096)]);
        assert_eq!(
            split_dim(&short, Kernel::Tile { a: 0 }, 2, 32),
            Some((1, 32))
        );
        let uneven = loops(&[(96, 4096, 4), (70, 4, 4096)]);
        assert_eq!(
            split_dim(&uneven, Kernel::Tile { a: 0 }, 2, 32),
            Some((0, 32))
        );
        // none at all when the best of them is a single tile
        let one = loops(&[(32, 4096, 4), (32, 4, 4096)]);
        assert_eq!(split_dim(&one, Kernel::Tile { a: 0 }, 1, 32), None);
        let ties = loops(&[(70, 4096, 4), (64, 4, 4096)]);
        assert_eq!(
            split_dim(&ties, Kernel::Tile { a: 0 }, 2, 32),
            Some((1, 32))
        );
        // 5 tiles are enough for 2 pieces, not for 3
        let five = loops(&[(160, 4096, 4), (8, 4, 4096)]);
        assert_eq!(
            split_dim(&five, Kernel::Tile { a: 0 }, 2, 32),
            Some((0, 32))
        );
        assert_eq!(
            split_dim(&five, Kernel::Tile { a: 0 }, 3, 32),
            Some((0, 32))
        );
        let fives = loops(&[(160, 4096, 4), (160, 4, 4096)]);
        assert_eq!(
            split_dim(&fives, Kernel::Tile { a: 0 }, 2, 32),
            Some((0, 32))
        );
        assert_eq!(
            split_dim(&fives, Kernel::Tile { a: 0 }, 3, 32),
            Some((1, 32))
        );
    }

    #[test]
    fn splits_cover_the_plan() {
        let p = plan(&[4096, 4096], &[16384, 4], &[4, 16384]).unwrap();
        let k = choose_kernel(&p, 4);
        let (j, g) = split_dim(&p, k, 2, 32).unwrap();
        assert_eq!((j, g), (0, 32));
        let pieces = split(&p, j, g, 2);
        assert_eq!(pieces.len(), 2);
        assert_eq!(pieces[0].dims[0].n, 2048);
        assert_eq!(pieces[1].dst_offset, 2048 * 16384);
    }

    fn dims_strategy() -> impl Strategy<Value = Vec<(usize, isize, isize)>> {
        proptest::collection::vec((0usize..6, -40isize..40, -40isize..40), 0..=5)
    }

    proptest! {
        #[test]
        fn plan_addresses_the_same_pairs(dims in dims_strategy()) {
            let shape: Vec<usize> = dims.iter().map(|d| d.0).collect();
            let dst: Vec<isize> = dims.iter().map(|d| d.1).collect();
            let src: Vec<isize> = dims.iter().map(|d| d.2).collect();
            let reference = pairs(0, 0, &shape, &dst, &src);
            match plan(&shape, &dst, &src) {
                None => prop_assert!(reference.is_empty()),
                Some(p) => {
                    prop_assert_eq!(p.numel(), reference.len());
                    prop_assert!(p.dims.iter().all(|d| d.n > 1 && d.dst >= 0));
                    prop_assert!(p.dims.windows(2).all(|w| w[0].dst >= w[1].dst));
                    prop_assert_eq!(sorted(plan_pairs(&p)), sorted(reference));
                }
            }
        }

        #[test]
        fn split_pieces_partition_the_plan(dims in dims_strategy(), pieces in 1usize..5, tile in 1usize..4) {
            let shape: Vec<usize> = dims.iter().map(|d| d.0).collect();
            let dst: Vec<isize> = dims.iter().map(|d| d.1).collect();
            let src: Vec<isize> = dims.iter().map(|d| d.2).collect();
            if let Some(p) = plan(&shape, &dst, &src) {
                let kernel = choose_kernel(&p, 1);
                let whole = sorted(plan_pairs(&p));
                if let Some((j, g)) = split_dim(&p, kernel, pieces, tile) {
                    let parts = split(&p, j, g, pieces);
                    prop_assert!(parts.len() <= pieces);
                    let all = sorted(parts.iter().flat_map(plan_pairs).collect());
                    prop_assert_eq!(all, whole);
                }
            }
        }
    }
}
