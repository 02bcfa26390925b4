//! The `Layout` type: shape and strides as importers read them, checked, kept in bytes and in
//! DLPack's elements, with the element count, byte extent and contiguity.

use crate::error::{Error, Result};

/// Shape and strides: always in bytes, and in elements (as DLPack carries them) when the
/// byte strides allow. All three live together, `[shape | byte strides | strides]`: inline for
/// up to `INLINE_NDIM` dimensions, otherwise in one allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    dims: Dims,
    /// False when a dimension of extent > 1 has a byte stride that is not a multiple of the
    /// item size: DLPack can't express that memory without a copy.
    whole_elements: bool,
    /// C-contiguous (see `is_c_contiguous`), found while the strides are read: asked of every
    /// view, where a second pass cost a tenth of the view.
    c_contiguous: bool,
}

/// The most dimensions we accept (numpy's limit is 64; DLPack's `ndim` is an `int32`).
pub const MAX_NDIM: usize = 64;

/// Layouts of up to this many dimensions (most arrays) need no allocation of their own.
pub const INLINE_NDIM: usize = 2;

/// The `3 * ndim` numbers of a layout. `repr(u8)` gives it a defined layout in which all-zero
/// bytes are `Inline { len: 0, values: [0; 6] }` (see `write_into`).
#[derive(Clone)]
#[repr(u8)]
enum Dims {
    #[allow(
        dead_code,
        reason = "made from zeroed bytes by `write_into`, never as a value"
    )]
    Inline {
        len: u8,
        values: [i64; 3 * INLINE_NDIM],
    },
    Heap(Box<[i64]>),
}

impl Dims {
    /// Write the extents, then room for both strides (zeros), into `dst`. Written in place: a
    /// `Dims` built on the stack and copied in is read back while its stores are still in
    /// flight, which stalls the copy (it cost a sixth of `asdlpack`).
    ///
    /// # Safety
    /// `dst` is valid for writes of a `Dims`.
    #[inline(always)]
    unsafe fn write_into(dst: *mut Dims, ndim: usize, extent: impl Fn(usize) -> i64) {
        if ndim <= INLINE_NDIM {
            // Zeroed bytes, then the fields: writing the zeroed variant as a value went through
            // a misaligned copy on the stack.
            // SAFETY: per the contract, `dst` may be written.
            unsafe { std::ptr::write_bytes(dst, 0, 1) };
            // SAFETY: all-zero bytes are a valid `Dims::Inline` (`repr(u8)`, first variant),
            // whose fields are then set through the enum; nothing else refers to `dst`.
            let dims = unsafe { &mut *dst };
            if let Dims::Inline { len, values } = dims {
                *len = (3 * ndim) as u8;
                for (k, value) in values[..ndim].iter_mut().enumerate() {
                    *value = extent(k);
                }
            }
            return;
        }
        // Filled from the extents rather than zeroed: a zeroed allocation is a `calloc`, which
        // skips the allocator's fast path.
        let mut dims = Vec::with_capacity(3 * ndim);
        dims.extend((0..ndim).map(extent));
        dims.resize(3 * ndim, 0);
        // SAFETY: `dst` is valid for writes of a `Dims` (this function's contract).
        unsafe { dst.write(Dims::Heap(dims.into_boxed_slice())) };
    }

    #[inline(always)]
    fn as_slice(&self) -> &[i64] {
        match self {
            Dims::Inline { len, values } => &values[..usize::from(*len)],
            Dims::Heap(dims) => dims,
        }
    }

    #[inline(always)]
    fn as_mut_slice(&mut self) -> &mut [i64] {
        match self {
            Dims::Inline { len, values } => &mut values[..usize::from(*len)],
            Dims::Heap(dims) => dims,
        }
    }
}

impl PartialEq for Dims {
    fn eq(&self, other: &Dims) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Dims {}

impl std::fmt::Debug for Dims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_slice().fmt(f)
    }
}

impl Layout {
    /// Build a layout from a shape and optional byte strides (`None` = C order).
    ///
    /// Checks that extents are non-negative and that the element count and the byte span fit in
    /// `i64`. Strides of dimensions of extent 1, and all strides of an empty tensor, never address
    /// anything, so they are normalised to the C-order value.
    pub fn from_byte_strides(
        shape: &[i64],
        byte_strides: Option<&[i64]>,
        itemsize: usize,
    ) -> Result<Layout> {
        if let Some(bs) = byte_strides
            && bs.len() != shape.len()
        {
            return Err(Error::value(format!(
                "strides {bs:?} do not match the {} dimensions of shape {shape:?}",
                shape.len()
            )));
        }
        Layout::build(
            shape.len(),
            itemsize,
            |k| shape[k],
            byte_strides.map(|bs| |k: usize| Ok(bs[k])),
        )
    }

    /// Build a layout from per-dimension accessors, without intermediate vectors (importers read
    /// their producer's arrays in place). See `from_byte_strides` for the checks.
    pub fn build<S: Fn(usize) -> Result<i64>>(
        ndim: usize,
        itemsize: usize,
        extent: impl Fn(usize) -> i64,
        byte_stride: Option<S>,
    ) -> Result<Layout> {
        let mut layout = std::mem::MaybeUninit::uninit();
        // SAFETY: `layout` is valid for writes.
        unsafe { Layout::build_into(layout.as_mut_ptr(), ndim, itemsize, extent, byte_stride)? };
        // SAFETY: `build_into` succeeded, so it initialised `layout`.
        Ok(unsafe { layout.assume_init() })
    }

    /// `build`, writing the layout into `dst` (see `Dims::write_into` for why): initialised
    /// when this returns `Ok`, untouched (or dropped again) otherwise.
    ///
    /// # Safety
    /// `dst` is valid for writes of a `Layout`.
    #[inline(always)]
    pub unsafe fn build_into<S: Fn(usize) -> Result<i64>>(
        dst: *mut Layout,
        ndim: usize,
        itemsize: usize,
        extent: impl Fn(usize) -> i64,
        byte_stride: Option<S>,
    ) -> Result<()> {
        if ndim > MAX_NDIM {
            return Err(Error::value(format!(
                "{ndim} dimensions is more than the {MAX_NDIM} supported"
            )));
        }
        let item = i64::try_from(itemsize).map_err(|_| Error::value("item size too large"))?;
        // SAFETY: per the contract, `dst` points at a `Layout`'s memory: its fields lie inside.
        let dims = unsafe { &raw mut (*dst).dims };
        // SAFETY: `dst` points at a `Layout`'s memory (this function's contract), which this
        // field lies in.
        let whole_elements = unsafe { &raw mut (*dst).whole_elements };
        // SAFETY: per the contract, the field may be written.
        unsafe { Dims::write_into(dims, ndim, extent) };
        // SAFETY: `dst` points at a `Layout`'s memory (this function's contract), which this
        // field lies in.
        let c_contiguous = unsafe { &raw mut (*dst).c_contiguous };
        // SAFETY: a field of `*dst`, which is valid for writes (this function's contract).
        unsafe { whole_elements.write(true) };
        // SAFETY: a field of `*dst`, which is valid for writes (this function's contract).
        unsafe { c_contiguous.write(true) };
        // SAFETY: all three fields were written just above; nothing else refers to `dst`.
        let layout = unsafe { &mut *dst };
        let filled = layout.fill(ndim, item, itemsize, byte_stride);
        if filled.is_err() {
            // SAFETY: initialised above, and not used again.
            unsafe { std::ptr::drop_in_place(dst) };
        }
        filled
    }

    /// Fill in the strides of a layout whose `dims` hold the extents, and check it.
    #[inline(always)]
    fn fill<S: Fn(usize) -> Result<i64>>(
        &mut self,
        ndim: usize,
        item: i64,
        itemsize: usize,
        byte_stride: Option<S>,
    ) -> Result<()> {
        let (shape, rest) = self.dims.as_mut_slice().split_at_mut(ndim);
        let (bytes, strides) = rest.split_at_mut(ndim);
        if let Some(&bad) = shape.iter().find(|&&n| n < 0) {
            return Err(Error::value(format!(
                "negative extent {bad} in shape {shape:?}"
            )));
        }
        let empty = numel(shape)? == 0;
        // C order first (in elements, then bytes); dimensions that address memory then take the
        // producer's strides.
        let mut acc = 1i64;
        for k in (0..ndim).rev() {
            strides[k] = acc;
            bytes[k] = acc
                .checked_mul(item)
                .ok_or_else(|| Error::value("shape addresses more than 2**63 bytes"))?;
            acc = acc.saturating_mul(shape[k].max(1));
        }
        let mut whole_elements = true;
        // C order unless a dimension that addresses memory has another stride.
        let mut c_order = true;
        if let Some(byte_stride) = byte_stride
            && !empty
        {
            for k in 0..ndim {
                if shape[k] > 1 {
                    let c_bytes = bytes[k];
                    bytes[k] = byte_stride(k)?;
                    c_order &= bytes[k] == c_bytes;
                    if item != 0 && bytes[k] % item == 0 {
                        strides[k] = bytes[k] / item;
                    } else {
                        whole_elements = false;
                    }
                }
            }
        }
        self.whole_elements = whole_elements;
        self.c_contiguous = empty || (whole_elements && c_order);
        self.byte_extent(itemsize)?;
        Ok(())
    }

    /// A C-ordered layout; fails only when the dense tensor would span more than 2**63 bytes
    /// (a broadcast view can describe more elements than fit in memory).
    pub fn c_order(shape: &[i64], itemsize: usize) -> Result<Layout> {
        let c_order = None::<fn(usize) -> Result<i64>>;
        Layout::build(shape.len(), itemsize, |k| shape[k], c_order)
    }

    #[inline(always)]
    pub fn ndim(&self) -> usize {
        self.dims.as_slice().len() / 3
    }

    #[inline(always)]
    pub fn shape(&self) -> &[i64] {
        &self.dims.as_slice()[..self.ndim()]
    }

    #[inline(always)]
    pub fn byte_strides(&self) -> &[i64] {
        let n = self.ndim();
        &self.dims.as_slice()[n..2 * n]
    }

    /// Strides in elements, or `None` when the byte strides aren't whole elements.
    #[inline]
    pub fn strides(&self) -> Option<&[i64]> {
        let n = self.ndim();
        self.whole_elements.then(|| &self.dims.as_slice()[2 * n..])
    }

    /// Number of elements (the product was checked not to overflow when the layout was built).
    pub fn numel(&self) -> i64 {
        self.shape().iter().product()
    }

    /// The byte offsets, relative to the first element, of the lowest and one past the highest
    /// byte addressed; `(0, 0)` for an empty tensor.
    #[inline(always)]
    pub fn byte_extent(&self, itemsize: usize) -> Result<(i64, i64)> {
        if self.shape().contains(&0) {
            return Ok((0, 0));
        }
        let overflow = || Error::value("shape and strides address more than 2**63 bytes");
        let item = i64::try_from(itemsize).map_err(|_| overflow())?;
        let (mut low, mut high) = (0i64, 0i64);
        for (&extent, &stride) in self.shape().iter().zip(self.byte_strides()) {
            let reach = (extent - 1).checked_mul(stride).ok_or_else(overflow)?;
            if reach < 0 {
                low = low.checked_add(reach).ok_or_else(overflow)?;
            } else {
                high = high.checked_add(reach).ok_or_else(overflow)?;
            }
        }
        Ok((low, high.checked_add(item).ok_or_else(overflow)?))
    }

    /// C-contiguous in the sense consumers use: dimensions of extent 1 may have any stride.
    #[inline]
    pub fn is_c_contiguous(&self) -> bool {
        self.c_contiguous
    }

    /// Fortran-contiguous, with the same allowance for extent-1 dimensions.
    pub fn is_f_contiguous(&self) -> bool {
        if self.shape().contains(&0) {
            return true;
        }
        let Some(strides) = self.strides() else {
            return false;
        };
        let mut expected = 1i64;
        for (&extent, &stride) in self.shape().iter().zip(strides) {
            if extent != 1 && stride != expected {
                return false;
            }
            expected *= extent;
        }
        true
    }
}

/// Element count, or a `ValueError` if it overflows `i64`. Inlined: every view of a numpy
/// array builds a layout, where the call cost 25 instructions of an extraction's 1,000.
#[inline(always)]
pub fn numel(shape: &[i64]) -> Result<i64> {
    shape
        .iter()
        .try_fold(1i64, |acc, &n| acc.checked_mul(n))
        .ok_or_else(|| Error::value(format!("shape {shape:?} has more than 2**63 elements")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::reference::{c_strides, offsets};
    use proptest::prelude::*;

    #[test]
    fn c_order_default() {
        let l = Layout::from_byte_strides(&[2, 3, 4], None, 4).unwrap();
        assert_eq!(l.strides(), Some(&[12, 4, 1][..]));
        assert_eq!(l.byte_strides(), &[48, 16, 4]);
        assert_eq!(l, Layout::c_order(&[2, 3, 4], 4).unwrap());
        // a broadcast view of more bytes than an i64 can count has no dense copy
        let huge = Layout::from_byte_strides(&[1 << 61], Some(&[0]), 8).unwrap();
        assert!(Layout::c_order(huge.shape(), 8).is_err());
        assert!(l.is_c_contiguous());
        assert!(!l.is_f_contiguous());
        assert_eq!(l.byte_extent(4).unwrap(), (0, 96));
    }

    #[test]
    fn layouts_are_equal_when_their_shapes_and_strides_are() {
        let c = Layout::c_order(&[2, 3], 4).unwrap();
        assert_eq!(
            c,
            Layout::from_byte_strides(&[2, 3], Some(&[12, 4]), 4).unwrap()
        );
        assert_ne!(c, Layout::c_order(&[3, 2], 4).unwrap());
        assert_ne!(
            c,
            Layout::from_byte_strides(&[2, 3], Some(&[4, 8]), 4).unwrap()
        );
    }

    #[test]
    fn byte_strides_convert() {
        let l = Layout::from_byte_strides(&[3, 2], Some(&[-16, 4]), 4).unwrap();
        assert_eq!(l.strides(), Some(&[-4, 1][..]));
        assert_eq!(l.byte_extent(4).unwrap(), (-32, 8));
        // Byte strides DLPack can't count: kept in bytes only.
        let l = Layout::from_byte_strides(&[3, 2], Some(&[6, 3]), 4).unwrap();
        assert_eq!(l.strides(), None);
        assert_eq!(l.byte_strides(), &[6, 3]);
        assert!(!l.is_c_contiguous() && !l.is_f_contiguous());
        // A dimension of extent 1 may have any stride, even one DLPack can't count.
        let l = Layout::from_byte_strides(&[1, 2], Some(&[3, 4]), 4).unwrap();
        assert_eq!(l.strides(), Some(&[2, 1][..]));
    }

    #[test]
    fn fortran_order_is_f_contiguous() {
        // element strides 1, 2, 6: each the product of the extents before it
        let f = Layout::from_byte_strides(&[2, 3, 4], Some(&[4, 8, 24]), 4).unwrap();
        assert!(f.is_f_contiguous() && !f.is_c_contiguous());
        // an extent of 1 takes any stride
        let f = Layout::from_byte_strides(&[2, 1, 4], Some(&[4, 100, 8]), 4).unwrap();
        assert!(f.is_f_contiguous());
        let off = Layout::from_byte_strides(&[2, 3, 4], Some(&[4, 8, 28]), 4).unwrap();
        assert!(!off.is_f_contiguous());
    }

    #[test]
    fn zero_size_broadcast_and_scalar() {
        let l = Layout::from_byte_strides(&[0, 5], Some(&[7, 9]), 4).unwrap();
        assert_eq!(l.numel(), 0);
        assert_eq!(l.byte_extent(4).unwrap(), (0, 0));
        let l = Layout::from_byte_strides(&[4, 3], Some(&[0, 8]), 8).unwrap();
        assert_eq!(l.strides(), Some(&[0, 1][..]));
        let l = Layout::from_byte_strides(&[], None, 8).unwrap();
        assert_eq!(l.numel(), 1);
        assert_eq!(l.byte_extent(8).unwrap(), (0, 8));
        assert!(l.is_c_contiguous() && l.is_f_contiguous());
    }

    #[test]
    fn rejects_bad_values() {
        assert!(matches!(
            Layout::from_byte_strides(&[-1], None, 1),
            Err(Error::Value(_))
        ));
        assert!(matches!(
            Layout::from_byte_strides(&[1 << 62, 1 << 62], None, 1),
            Err(Error::Value(_))
        ));
        assert!(matches!(
            Layout::from_byte_strides(&[2, 2], Some(&[8]), 4),
            Err(Error::Value(_))
        ));
        assert!(matches!(
            Layout::from_byte_strides(&[3], Some(&[i64::MAX - 7]), 8),
            Err(Error::Value(_))
        ));
        assert!(matches!(
            Layout::from_byte_strides(&[1 << 61], None, 8),
            Err(Error::Value(_))
        ));
    }

    proptest! {
        #[test]
        fn extent_matches_reference(dims in proptest::collection::vec((0i64..5, -6i64..7), 0..5),
                                    item in proptest::sample::select(vec![1usize, 2, 4, 8])) {
            let shape: Vec<i64> = dims.iter().map(|d| d.0).collect();
            let bytes: Vec<i64> = dims.iter().map(|d| d.1 * item as i64).collect();
            let l = Layout::from_byte_strides(&shape, Some(&bytes), item).unwrap();
            let strides = l.strides().unwrap().to_vec();
            prop_assert_eq!(l.byte_strides().iter().zip(&strides).all(|(b, s)| *b == s * item as i64), true);
            let offs = offsets(l.shape(), &strides, item as i64);
            let (low, high) = l.byte_extent(item).unwrap();
            if l.numel() == 0 {
                prop_assert_eq!((low, high), (0, 0));
            } else {
                prop_assert_eq!(low, *offs.iter().min().unwrap());
                prop_assert_eq!(high, *offs.iter().max().unwrap() + item as i64);
            }
            // Same addresses as the byte strides describe, on every dimension that has more than
            // one element.
            prop_assert_eq!(offs, offsets(&shape, &bytes.iter().map(|b| b / item as i64)
                .collect::<Vec<_>>(), item as i64));
        }

        /// Any shape (no dimensions, extents 0 and 1 included) with any byte strides: zero,
        /// negative, odd, not multiples of the item, overlapping, in any order. Every predicate
        /// is checked against the list of every element's byte offset.
        #[test]
        fn layout_matches_enumeration(
            (item, dims) in proptest::sample::select(vec![1i64, 2, 3, 4, 8]).prop_flat_map(|item| {
                let stride = prop_oneof![
                    3 => (-4i64..=4).prop_map(move |k| k * item),
                    1 => -13i64..=13,
                ];
                let extent = prop_oneof![1 => Just(0i64), 1 => Just(1i64), 4 => 2i64..5];
                (Just(item), proptest::collection::vec((extent, stride), 0..=5))
            }),
        ) {
            let shape: Vec<i64> = dims.iter().map(|d| d.0).collect();
            let given: Vec<i64> = dims.iter().map(|d| d.1).collect();
            let l = Layout::from_byte_strides(&shape, Some(&given), item as usize).unwrap();
            prop_assert_eq!(l.shape(), &shape[..]);
            let c_offsets = offsets(&shape, &given, 1);
            let f_offsets = {
                let (rs, rb): (Vec<i64>, Vec<i64>) = dims.iter().rev().copied().unzip();
                offsets(&rs, &rb, 1)
            };
            let numel = if shape.contains(&0) { 0 } else { c_offsets.len() };
            prop_assert_eq!(l.numel(), numel as i64);
            let dense: Vec<i64> = (0..numel as i64).map(|i| i * item).collect();
            let c_dense = numel == 0 || c_offsets == dense;
            let f_dense = numel == 0 || f_offsets == dense;
            prop_assert_eq!(l.is_c_contiguous(), c_dense);
            prop_assert_eq!(l.is_f_contiguous(), f_dense);
            let extent = if numel == 0 {
                (0, 0)
            } else {
                (*c_offsets.iter().min().unwrap(), *c_offsets.iter().max().unwrap() + item)
            };
            prop_assert_eq!(l.byte_extent(item as usize).unwrap(), extent);
            // Strides that address nothing (extent 1, or any of an empty tensor) read as C order;
            // the others are kept as given.
            let c = c_strides(&shape);
            for k in 0..shape.len() {
                let expected = if numel == 0 || shape[k] == 1 { c[k] * item } else { given[k] };
                prop_assert_eq!(l.byte_strides()[k], expected);
            }
            // Element strides exist exactly when every stride that addresses memory is a whole
            // number of items, and then address the same bytes in the same order.
            let whole = numel == 0 || dims.iter().all(|&(n, s)| n <= 1 || s % item == 0);
            prop_assert_eq!(l.strides().is_some(), whole);
            if let Some(strides) = l.strides()
                && numel > 0
            {
                prop_assert_eq!(offsets(&shape, strides, item), c_offsets);
            }
        }

        #[test]
        fn never_panics(shape in proptest::collection::vec(any::<i64>(), 0..4),
                        strides in proptest::collection::vec(any::<i64>(), 0..4),
                        item in 0usize..17) {
            if let Ok(l) = Layout::from_byte_strides(&shape, Some(&strides), item) {
                let _ = l.byte_extent(item);
            }
        }
    }
}
