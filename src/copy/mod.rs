//! The copy engine: what zero-copy can't serve (`copy=True`, read-only data asked for a legacy
//! capsule). For now a CPU strided copy into a fresh, aligned, C-ordered buffer.

pub mod cpu;

pub use cpu::{AlignedBuffer, copy_to_c_order};
