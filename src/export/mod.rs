//! Exporters: from the one `Tensor` description to what consumers take. `policy` decides what a
//! DLPack request gets (in place, a copy, a move, a refusal); `capsule` makes DLPack managed
//! tensors and capsules; `buffer` lends memory through the buffer protocol; `interface` describes
//! it as numpy's array interface and the CUDA array interface; `arrow` makes Arrow arrays, and
//! `arrow_stream` an Arrow C stream of one of them.

pub mod arrow;
pub mod arrow_stream;
pub mod buffer;
pub mod capsule;
pub mod interface;
pub mod policy;
