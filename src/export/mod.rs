//! Exporters: from the one `Tensor` description to what consumers take. `policy` decides what a
//! request gets (in place, a copy, a move, a refusal); `capsule` makes DLPack managed tensors and
//! capsules.

pub mod capsule;
pub mod policy;
