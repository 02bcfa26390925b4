//! The copy engine: what zero-copy can't serve (`copy=True`, memory DLPack can't express,
//! read-only data asked for a legacy capsule) and `copyto` into existing arrays. `cpu` is the
//! strided engine, `plan` lays out its loops; `host` plans its work from tensor descriptions;
//! `cuda` moves and copies device memory.

pub mod cpu;
pub mod cuda;
pub mod device;
pub mod host;
pub mod plan;

pub use host::{copy_into, to_c_order};
