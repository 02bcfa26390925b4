//! The one tensor description every importer produces and every exporter reads: where the data
//! is (pointer and device), what it holds (dtype), how it is laid out (shape, strides), whether
//! it may be written (`description`), and who keeps the memory alive (`owner`). Its parts without
//! Python (element types, layouts, buffers we own) are the core's (`dlpack_core::dtype`,
//! `layout`, `memory`), named there.

mod description;
mod owner;

pub use description::{Device, Exportable, Storage, Tensor};
pub use owner::{FilledView, Managed, Owner};
