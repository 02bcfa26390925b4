//! Exporters: from the one `Tensor` description to what consumers take.

pub mod capsule;
pub mod exchange_api;
