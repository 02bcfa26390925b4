//! What other extensions reach this runtime through: the C API table (`capi`, published as
//! `dlpack._dlpack._C_API`), views' holds on memory (`held`), and the one registry of borrowed
//! memory (`borrows`, which the runtime's own writers consult too), beside rust-numpy's borrow
//! flags for numpy arrays (`rust_numpy`). The `dlpack-adapter` crate is its Rust client.

pub mod borrows;
pub mod capi;
mod held;
mod rust_numpy;
