//! The CPU copy engine: N-dimensional strided copies between any two strided byte layouts, and
//! fresh C-ordered copies of host tensors (`copy=True`).
//!
//! [`copy_strided`] plans the loops ([`crate::copy::plan`]), picks an inner kernel (a `memcpy`
//! of contiguous runs, specialised gather/scatter loops, or cache-blocked tiles for transposes;
//! see [`kernels`] and [`tiles`]) and, from a size up, cuts the work between threads and writes
//! with streaming stores, as [`tune`] measured for that kind of copy on this machine. It never
//! touches Python: callers release the GIL around it.
//!
//! [`copy_runs`] copies a batch of contiguous runs (a shared tree's leaves) as one contiguous copy
//! of their total size chooses its threads and stores.

mod batch;
mod blocks;
mod elem;
mod engine;
mod kernels;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod throughput;
mod tiles;
pub mod tune;

pub use batch::{Run, copy_runs};
pub use engine::{Strided, byte_span, calibrate_now, copy_strided, may_overlap};
pub use tune::{LARGE_THRESHOLD, PARALLEL_THRESHOLD};
