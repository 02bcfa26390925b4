//! Copies the zero-copy path can't serve (`copy=True`, memory DLPack can't express, read-only
//! data asked for a legacy capsule) and `copyto` into existing arrays, between `Tensor`s: `host`
//! for host memory, `cuda` where CUDA memory takes part, `copyto` checks and dispatches. The
//! engines themselves (loop planning, the strided CPU engine, transfer planning, the CUDA
//! driver's side) are the core's, `dlpack_core::copy`.

mod copyto;
pub mod cuda;
pub mod host;

pub use copyto::copy_into;
pub use host::to_c_order;
