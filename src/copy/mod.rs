//! The copy engine: what zero-copy can't serve (`copy=True`, memory DLPack can't express,
//! read-only data asked for a legacy capsule) and `copyto` into existing arrays. `cpu` is the
//! strided engine; `host` plans its work from tensor descriptions.

pub mod cpu;
pub mod host;

pub use cpu::AlignedBuffer;
pub use host::{copy_into, to_c_order};
