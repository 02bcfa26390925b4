#![doc = include_str!("../README.md")]
//!
//! # The crate
//!
//! A thin client of the installed `dlpack` package's extension, the one runtime of a process:
//! every call goes through the C API capsule `dlpack._dlpack._C_API` (`capi`), so views of any
//! extension share one importer and one registry of borrowed memory, and `from_vec` makes the
//! runtime's one `DLPackObject` type.

mod args;
mod array;
pub mod capi;
mod element;
#[cfg(feature = "ndarray")]
mod ndarray;
mod owned;

pub use args::{Array, ArrayMut};
pub use array::{ArrayView, ArrayViewMut, view, view_mut};
pub use dlpack_core::abi::DLDevice;
pub use dlpack_core::dtype::DType;
pub use element::Element;
#[cfg(feature = "ndarray")]
pub use owned::from_ndarray;
pub use owned::{from_boxed_slice, from_vec};
