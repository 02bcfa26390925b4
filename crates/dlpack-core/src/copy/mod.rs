//! The copy engine: strided copies between any two layouts. `plan` lays out a copy's loops,
//! `cpu` runs them on host memory (threads, kernels, byte swaps); `device` plans copies that
//! involve device memory as transfers over a `Mover`, which `driver` implements with the CUDA
//! driver.

// The engine's kernels group pointer arithmetic with the access it serves, several unsafe
// operations to a block under one `// SAFETY:` comment; they are to be split one operation per
// block as the rest of the workspace is.
#[expect(
    clippy::multiple_unsafe_ops_per_block,
    reason = "the kernels are still to be split one unsafe operation per block"
)]
pub mod cpu;
pub mod device;
pub mod driver;
pub mod plan;
