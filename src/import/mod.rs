//! Importers: one per protocol, each producing the one `Tensor` description.
//!
//! `import` tries the protocols in the order that keeps the most information: DLPack (it
//! carries devices and streams; a type's C exchange API first, then `__dlpack__`), the CUDA
//! array interface, the array interface (struct first, it is cheaper), the Arrow PyCapsule
//! interface (`arrow`), the buffer protocol, and numpy's `__array__` last. When a DLPack
//! producer refuses (BufferError) an object that also speaks another protocol, that one gets its
//! turn: numpy arrays of ml_dtypes types are served this way, and Arrow arrays whose own DLPack
//! export refuses them (booleans, fixed-size lists, nulls). Exact numpy arrays are read from
//! their C struct (`numpy`), which says what their DLPack export would.

mod address_map;
pub mod array_interface;
pub mod arrow;
pub mod arrow_check;
pub mod arrow_values;
pub mod buffer;
pub mod cuda_array_interface;
mod dispatch;
pub mod dlpack;
mod numpy;
mod protocols;
#[cfg(test)]
mod test_support;

pub use dispatch::{Imported, ORDER, import, import_in_place, import_known_into, is_immutable};
