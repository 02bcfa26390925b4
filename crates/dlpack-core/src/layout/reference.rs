//! References for the layout tests: what a layout addresses, computed the slow, obvious way.

/// The byte offset of every element of `shape` with element `strides`, in C order.
pub fn offsets(shape: &[i64], strides: &[i64], item: i64) -> Vec<i64> {
    let mut out = vec![0i64];
    for (&n, &s) in shape.iter().zip(strides) {
        out = out
            .iter()
            .flat_map(|&o| (0..n).map(move |i| o + i * s * item))
            .collect();
    }
    out
}

/// C-order strides in elements for `shape` (the caller has checked the product fits).
pub fn c_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![0i64; shape.len()];
    let mut acc = 1i64;
    for (stride, &extent) in strides.iter_mut().zip(shape).rev() {
        *stride = acc;
        acc = acc.saturating_mul(extent.max(1));
    }
    strides
}
