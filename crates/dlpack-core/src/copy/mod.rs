//! The copy engine: strided copies between any two layouts. `plan` lays out a copy's loops,
//! `cpu` runs them on host memory (threads, kernels, byte swaps); `device` plans copies that
//! involve device memory as transfers over a `Mover`, which `driver` implements with the CUDA
//! driver.

pub mod cpu;
pub mod device;
pub mod driver;
pub mod plan;
