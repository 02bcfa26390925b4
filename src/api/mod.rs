//! The Rust API: PyO3 extensions accept any array through [`view`] and hand arrays back with
//! [`from_vec`]. See the crate's documentation for the safety model.

mod array;
mod borrows;
pub mod capi;
mod element;
#[cfg(feature = "ndarray")]
mod ndarray;
mod owned;

pub use array::{ArrayView, ArrayViewMut, view, view_mut};
pub use element::Element;
#[cfg(feature = "ndarray")]
pub use owned::from_ndarray;
pub use owned::{from_boxed_slice, from_vec};
