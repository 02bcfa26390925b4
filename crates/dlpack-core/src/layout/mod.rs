//! Shape and strides: validation of what importers read, conversion of byte strides to DLPack's
//! element strides, and contiguity (`strided`); strides and extents derived from a layout
//! (`derived`); whether a layout's elements share bytes (`overlap`).

mod derived;
mod overlap;
#[cfg(test)]
mod reference;
mod strided;

pub use derived::{broadcast_strides, byte_extent, dense_strides};
pub use overlap::{SelfOverlap, self_overlap, strides_nest};
pub use strided::{INLINE_NDIM, Layout, MAX_NDIM, numel};
