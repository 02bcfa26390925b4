//! A planned copy cut into rows contiguous on both sides, in blocks a pitched transfer can send.

use super::mover::MAX_PITCH;
use crate::copy::plan::{Dim, Plan};

/// A copy cut into rows contiguous on both sides: `width` bytes each, in blocks of `depth`
/// slices of `height` rows (one pitched transfer per block), the blocks walked by `loops`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rows {
    pub dst_offset: isize,
    pub src_offset: isize,
    pub width: usize,
    pub height: Dim,
    pub depth: Dim,
    pub loops: Vec<Dim>,
}

impl Rows {
    /// Transfers when every block is one pitched copy.
    pub fn transfers(&self) -> usize {
        self.loops.iter().map(|d| d.n).product()
    }

    /// Rows in all.
    pub fn count(&self) -> usize {
        self.transfers()
            .saturating_mul(self.height.n)
            .saturating_mul(self.depth.n)
    }

    /// Whether the whole copy is one contiguous run on both sides.
    pub(super) fn is_one_run(&self) -> bool {
        self.loops.is_empty() && self.height.n == 1 && self.depth.n == 1
    }
}

pub(super) const UNIT: Dim = Dim {
    n: 1,
    dst: 0,
    src: 0,
};

/// Cut a planned copy into rows: the innermost loop when it is contiguous on both sides (else
/// single elements), rows from the next loop when both its strides can be pitches, and slices
/// from the one after when its strides are whole numbers of those rows on both sides.
pub fn rows(plan: &Plan, itemsize: usize) -> Rows {
    let mut loops = plan.dims.clone();
    let mut width = itemsize;
    if let Some(inner) = loops.last()
        && inner.dst == itemsize as isize
        && inner.src == itemsize as isize
    {
        width = inner.n * itemsize;
        loops.pop();
    }
    let pitch = |stride: isize| (width..=MAX_PITCH).contains(&(stride.max(0) as usize));
    let (mut height, mut depth) = (UNIT, UNIT);
    if let Some(&h) = loops.last()
        && pitch(h.dst)
        && pitch(h.src)
    {
        height = h;
        loops.pop();
        let stacked = |stride: isize, pitch: isize| {
            stride > 0 && stride % pitch == 0 && (stride / pitch) as usize >= h.n
        };
        if let Some(&d) = loops.last()
            && stacked(d.dst, h.dst)
            && stacked(d.src, h.src)
        {
            depth = d;
            loops.pop();
        }
    }
    Rows {
        dst_offset: plan.dst_offset,
        src_offset: plan.src_offset,
        width,
        height,
        depth,
        loops,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::copy::plan;

    fn dim(n: usize, dst: isize, src: isize) -> Dim {
        Dim { n, dst, src }
    }

    fn rows_of(shape: &[usize], dst: &[isize], src: &[isize], itemsize: usize) -> Rows {
        rows(&plan::plan(shape, dst, src).unwrap(), itemsize)
    }

    #[test]
    fn contiguous_is_one_run() {
        let r = rows_of(&[4, 5], &[20, 4], &[20, 4], 4);
        assert_eq!(r.width, 80);
        assert!(r.is_one_run());
    }

    #[test]
    fn column_slice_is_one_2d_transfer() {
        // dst: dense (6, 3) float32; src: x[:, :3] of a (6, 10) array.
        let r = rows_of(&[6, 3], &[12, 4], &[40, 4], 4);
        assert_eq!((r.width, r.height, r.depth), (12, dim(6, 12, 40), UNIT));
        assert_eq!(r.transfers(), 1);
    }

    #[test]
    fn sliced_3d_is_one_3d_transfer() {
        // src: x[:, :5, :3] of a (4, 8, 10) array; slices are 8 rows of 40 bytes apart.
        let r = rows_of(&[4, 5, 3], &[60, 12, 4], &[320, 40, 4], 4);
        assert_eq!(
            (r.width, r.height, r.depth),
            (12, dim(5, 12, 40), dim(4, 60, 320))
        );
        assert!(r.loops.is_empty());
    }

    #[test]
    fn transpose_is_element_rows() {
        let r = rows_of(&[3, 4], &[16, 4], &[4, 12], 4);
        assert_eq!((r.width, r.height), (4, dim(4, 4, 12)));
        assert_eq!(r.loops, vec![dim(3, 16, 4)]);
        assert_eq!(r.count(), 12);
    }

    #[test]
    fn broadcast_source_loops() {
        // A (1, 8) row broadcast into (5, 8): the stride-0 loop can't be a pitch.
        let r = rows_of(&[5, 8], &[32, 4], &[0, 4], 4);
        assert_eq!((r.width, r.height), (32, UNIT));
        assert_eq!(r.loops, vec![dim(5, 32, 0)]);
    }
}
