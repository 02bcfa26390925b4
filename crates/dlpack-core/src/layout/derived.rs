//! Strides and extents derived from a layout: dense strides in its memory order, numpy's
//! broadcasting, the bytes it spans.

use super::strided::Layout;
use crate::error::{Error, Result};

/// Byte strides that pack `shape` densely with its dimensions in the order `byte_strides` lays
/// them out in memory (numpy's `order="K"`): C order stays C order and Fortran order stays
/// Fortran order, so copying into them is a plain copy. Ties go the C way (later dimensions
/// inner).
pub fn dense_strides(shape: &[i64], byte_strides: &[i64], itemsize: usize) -> Result<Vec<i64>> {
    if byte_strides.len() != shape.len() {
        return Err(Error::value(format!(
            "strides {byte_strides:?} do not match the {} dimensions of shape {shape:?}",
            shape.len()
        )));
    }
    let mut order: Vec<usize> = (0..shape.len()).collect();
    order.sort_by_key(|&k| (byte_strides[k].unsigned_abs(), std::cmp::Reverse(k)));
    let overflow = || Error::value(format!("shape {shape:?} spans more than 2**63 bytes"));
    let mut strides = vec![0i64; shape.len()];
    let mut step = i64::try_from(itemsize).map_err(|_| overflow())?;
    for k in order {
        strides[k] = step;
        step = step.checked_mul(shape[k].max(1)).ok_or_else(overflow)?;
    }
    Ok(strides)
}

/// Numpy's broadcasting of `src` to `shape`: byte strides for `src` viewed with `shape`.
pub fn broadcast_strides(src: &Layout, shape: &[i64]) -> Result<Vec<i64>> {
    let mismatch = || {
        Error::value(format!(
            "could not broadcast source of shape {:?} into destination of shape {shape:?}",
            src.shape()
        ))
    };
    // Like numpy, leading source dimensions of extent 1 beyond the destination's are dropped.
    let extra = src.shape().len().saturating_sub(shape.len());
    if src.shape()[..extra].iter().any(|&n| n != 1) {
        return Err(mismatch());
    }
    let (src_shape, src_strides) = (&src.shape()[extra..], &src.byte_strides()[extra..]);
    let lead = shape.len() - src_shape.len();
    let mut strides = vec![0i64; shape.len()];
    for (k, (&n, &s)) in src_shape.iter().zip(src_strides.iter()).enumerate() {
        let target = shape[lead + k];
        strides[lead + k] = if n == target {
            s
        } else if n == 1 {
            0
        } else {
            return Err(mismatch());
        };
    }
    Ok(strides)
}

/// The bytes `[low, high)` the elements of `shape` with `byte_strides` span relative to the
/// first element; `(0, 0)` when there are none. The shape and strides are checked as
/// `Layout::from_byte_strides` checks them.
pub fn byte_extent(shape: &[i64], byte_strides: &[i64], itemsize: usize) -> Result<(i64, i64)> {
    Layout::from_byte_strides(shape, Some(byte_strides), itemsize)?.byte_extent(itemsize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::reference::offsets;
    use proptest::prelude::*;

    #[test]
    fn dense_strides_keep_memory_order() {
        assert_eq!(dense_strides(&[2, 3], &[12, 4], 4).unwrap(), [12, 4]);
        assert_eq!(dense_strides(&[2, 3], &[4, 8], 4).unwrap(), [4, 8]);
        assert_eq!(dense_strides(&[2, 3], &[-4, 8], 4).unwrap(), [4, 8]);
        // ties (broadcast dimensions) go the C way
        assert_eq!(dense_strides(&[2, 3], &[0, 0], 8).unwrap(), [24, 8]);
        assert_eq!(dense_strides(&[0, 3], &[4, 8], 4).unwrap(), [4, 4]);
        assert!(dense_strides(&[2], &[4, 4], 4).is_err());
        assert!(dense_strides(&[1 << 62, 4], &[4, 8], 4).is_err());
    }

    #[test]
    fn broadcast_strides_as_numpy() {
        // float32 sources; the expected strides are numpy's np.broadcast_to(src, shape).strides
        let c = |shape: &[i64]| Layout::c_order(shape, 4).unwrap();
        assert_eq!(broadcast_strides(&c(&[3]), &[3]).unwrap(), [4]);
        assert_eq!(broadcast_strides(&c(&[3]), &[2, 3]).unwrap(), [0, 4]);
        assert_eq!(broadcast_strides(&c(&[2, 1]), &[2, 3]).unwrap(), [4, 0]);
        assert_eq!(
            broadcast_strides(&c(&[1, 3]), &[4, 2, 3]).unwrap(),
            [0, 0, 4]
        );
        let transposed = Layout::from_byte_strides(&[2, 3], Some(&[4, 8]), 4).unwrap();
        assert_eq!(
            broadcast_strides(&transposed, &[5, 2, 3]).unwrap(),
            [0, 4, 8]
        );
        // leading extents of 1 beyond the destination's are dropped, others refused
        assert_eq!(broadcast_strides(&c(&[1, 1, 3]), &[2, 3]).unwrap(), [0, 4]);
        assert_eq!(broadcast_strides(&c(&[1]), &[0]).unwrap(), [0]);
        for (src, shape) in [
            (&[2, 3][..], &[3][..]),
            (&[3], &[4]),
            (&[2, 3], &[3, 3]),
            (&[3], &[0]),
        ] {
            let err = broadcast_strides(&c(src), shape).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "could not broadcast source of shape {src:?} into destination of shape {shape:?}"
                )
            );
        }
    }

    proptest! {
        /// `dense_strides` packs every element exactly once, keeping the order of the source's
        /// stride magnitudes.
        #[test]
        fn dense_strides_pack_in_memory_order(
            dims in proptest::collection::vec((0i64..5, -13i64..=13), 0..=5),
            item in proptest::sample::select(vec![1usize, 2, 3, 8]),
        ) {
            let shape: Vec<i64> = dims.iter().map(|d| d.0).collect();
            let given: Vec<i64> = dims.iter().map(|d| d.1).collect();
            let out = dense_strides(&shape, &given, item).unwrap();
            let mut offs = offsets(&shape, &out, 1);
            offs.sort_unstable();
            let numel = offs.len() as i64;
            prop_assert_eq!(offs, (0..numel).map(|i| i * item as i64).collect::<Vec<_>>());
            for a in 0..shape.len() {
                for b in 0..shape.len() {
                    if shape[a] > 1 && shape[b] > 1 && given[a].abs() < given[b].abs() {
                        prop_assert!(out[a] < out[b], "{:?} {:?} -> {:?}", shape, given, out);
                    }
                }
            }
        }

        /// The free function is the layout's extent.
        #[test]
        fn byte_extent_is_the_layouts(
            dims in proptest::collection::vec((0i64..5, -13i64..=13), 0..=5),
            item in proptest::sample::select(vec![1usize, 2, 3, 8]),
        ) {
            let shape: Vec<i64> = dims.iter().map(|d| d.0).collect();
            let given: Vec<i64> = dims.iter().map(|d| d.1).collect();
            let layout = Layout::from_byte_strides(&shape, Some(&given), item).unwrap();
            prop_assert_eq!(byte_extent(&shape, &given, item).unwrap(), layout.byte_extent(item).unwrap());
        }
    }
}
