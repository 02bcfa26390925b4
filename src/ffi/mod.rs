//! The C ABIs we speak beside DLPack's (which is the core's, `dlpack_core::abi`): the Python
//! DLPack protocol's capsule names (`capsule`), numpy's structs (`numpy`), the Arrow PyCapsule
//! interface's methods and the C Device interface's structs (`arrow`), and (in `python`) every
//! raw call into CPython's C API.

pub mod arrow;
mod capsule;
mod numpy;
pub mod python;

pub use capsule::{
    CAPSULE_EXCHANGE_API, CAPSULE_LEGACY, CAPSULE_LEGACY_USED, CAPSULE_VERSIONED,
    CAPSULE_VERSIONED_USED,
};
pub use numpy::{NPY_ARRAY_WRITEABLE, NumpyArrayFields, PyArrayInterface, array_struct_flags};
