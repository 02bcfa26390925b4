//! The Python face: `asdlpack(obj)` and the `DLPackObject` it returns, whose `__dlpack__`
//! follows the array API standard's argument rules, and `copyto`. `state` is the object's Rust
//! side and `methods` what Python sees of it; `instance` is its CPython memory (allocation,
//! free list, deallocation) and `pytype` the type with its entry points; `arguments` reads their
//! calls' arguments, `exchange_api` is the type's DLPack C exchange API; `asdlpack` and
//! `copy_into` are the module's functions. `view` makes objects over memory a Rust owner holds (a shared segment's
//! mapping), `from_buffer` over a Python object's flat memory plus a layout, `pickling` is
//! the type's `__reduce_ex__`, and `stand_in` a type whose instances `asdlpack` takes as the
//! `DLPackObject` they hold.

mod arguments;
mod asdlpack;
mod copy_into;
mod exchange_api;
mod from_buffer;
mod instance;
mod methods;
mod pickling;
#[cfg(feature = "pyclass-probe")]
mod probe;
mod pytype;
mod stand_in;
mod state;
mod view;

pub use asdlpack::read;
pub use copy_into::copyto;
pub use from_buffer::_from_buffer;
pub use pickling::set_reconstructor;
#[cfg(feature = "pyclass-probe")]
pub use probe::register as register_pyclass_probe;
pub use pytype::{asdlpack_function, type_object};
pub use stand_in::register_stand_in;
pub use state::footprint;
pub use view::{Described, empty_view, new_view, tensor_of};
