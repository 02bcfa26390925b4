//! The Python face: `asdlpack(obj)` and the `DLPackObject` it returns, whose `__dlpack__`
//! follows the array API standard's argument rules, and `copyto`. `state` is the object's Rust
//! side and `methods` what Python sees of it; `instance` is its CPython memory (allocation,
//! free list, deallocation) and `pytype` the type with its entry points; `arguments` reads their
//! calls' arguments, `exchange_api` is the type's DLPack C exchange API; `asdlpack` and
//! `copy_into` are the module's functions. `view` makes objects over memory a Rust owner holds (a shared segment's
//! mapping), `from_buffer` over a Python object's flat memory plus a layout, `pickling` is
//! the type's `__reduce_ex__`, and `stand_in` a type whose instances `asdlpack` takes as the
//! `DLPackObject` they hold. `probe`, built with the `pyclass-probe` feature only, is the same
//! state in a PyO3 `#[pyclass]`, for `bench/bench_pyclass.py` to measure against.
//!
//! # The hand-written type's safety model
//!
//! `DLPackObject` is written against CPython's type API (`pytype`, `instance`, `arguments`, over
//! `crate::ffi::python`) rather than as a PyO3 `#[pyclass]`: measured side by side, a
//! `#[pyclass(frozen, freelist)]` holding the same state and calling the same exports missed four
//! of the exchange goals (docs/benchmarks.md, "The hand-written type against a PyO3
//! #[pyclass]"). What PyO3 would guarantee is then ours to keep, and is kept as follows.
//!
//! - Layout. An instance's memory is `instance::Instance`, `#[repr(C)]`: the object header, then
//!   the state. The type's `basicsize` is that struct's size and it has no items
//!   (`pytype::create_type`); its alignment fits CPython's allocator (a compile-time assertion
//!   in `instance`). The type is final (no `Py_TPFLAGS_BASETYPE`) and Python can't instantiate it
//!   (`Py_TPFLAGS_DISALLOW_INSTANTIATION`, which `object.__new__` respects too), so every object
//!   of exactly this type was made by `instance::new_object_with`, and an exact type check
//!   (`instance::is_instance`) proves the layout.
//! - Which objects are read as instances. `instance::state_unchecked` is called on objects CPython
//!   passes to our slots and methods (its method and getset descriptors check `self`'s type before
//!   calling, and slots are only called on instances of their type), or after `is_instance`
//!   (`instance::state`, `asdlpack::read`).
//! - The state is written before anyone can see the object. A fresh instance is untracked by the
//!   garbage collector before any Python code can run (`python::new_instance`), a recycled one is
//!   untracked already; `init` writes the whole state, and only then is the object tracked (and
//!   only if it references a collected object: `DLPackObject::references_collectable`) or
//!   returned (`new_object_with`). An `init` that declines has written nothing that needs
//!   dropping, and the instance goes back to the free list.
//! - The state is immutable while the object lives: the type has no setters, no `__dict__` and no
//!   `tp_setattro`, and nothing takes `&mut` to a live state. So `&DLPackObject` stays valid
//!   across Python code the exports run, and an export may point into the tensor for as long as
//!   it holds a reference to the object: capsules hold one (`DLPackObject::lent`, which asserts
//!   the object is the state's own), buffer views another (`export::buffer::fill` sets `obj`).
//! - Deallocation, in this order (`instance::dealloc`): read the type, untrack, release the state
//!   exactly once (`DLPackObject::release_attached_in_place`, which may run Python code: the
//!   owner's deallocator; the instance is unreachable and untracked by then, so nothing can see
//!   it), then put the memory on the free list or free it, and give up the instance's reference
//!   to its heap type last. Traversal (`instance::traverse`) visits the type and what the state
//!   references; there is no `tp_clear`: the state can't be cleared in place, and a cycle through
//!   an instance is broken at its other, mutable members.
//! - The free list. `instance::FREE` keeps up to 16 dead instances (untracked, state released,
//!   type reference given up); `python::revive_instance` makes one live again with a new type
//!   reference. It is a `Latch`: a thread that finds it in use by another does without it
//!   (allocates, or frees), so it never waits; each use ends inside `pop` or `push`, so code
//!   that can run Python (the state's release, an allocation that starts a collection) never
//!   runs while it is held. Which lock or atomic guards each other shared value is listed in
//!   `crate::ffi::python`; none relies on the GIL, so a free-threaded build shares them as
//!   safely.
//! - Nothing unwinds into C. Each entry point runs its fallible work in `pytype::entry` (PyO3's
//!   `Python::attach` and `error::at_c_boundary`: an error is raised, a panic becomes a
//!   RuntimeError, the C caller gets NULL or -1) or in `pytype::fast_path` (a caught panic sends
//!   the call down the general path); `dealloc` catches a panic from the release (and leaks).
//!   What runs outside both (the buffer and `__dlpack_device__` fast paths, `traverse`) calls
//!   nothing that panics; should it, an `extern "C"` function aborts rather than unwind. The C
//!   exchange API (`exchange_api`) catches the same way.
//! - Arguments are borrowed for the call. `arguments` reads CPython's fast-call array and
//!   `kwnames` tuple in place: `common_arguments` gives raw pointers, `dlpack_arguments` and
//!   `asdlpack_argument` `Borrowed` references whose lifetime the caller keeps within the call;
//!   none outlives the call but a `max_version` tuple, to which `LAST_MAX_VERSION` takes a
//!   reference of its own. Keyword names are matched by address against `KEYWORD_NAMES`, interned
//!   strings kept alive by references leaked at initialisation (so no other string can take
//!   their address); the tuple `LAST_MAX_VERSION` remembers is an exact tuple of exact ints
//!   (immutable) that its reference keeps alive, so a matching address is the same value.
//! - Once per process. The type, its method and getset tables are made once and leaked
//!   (`pytype::type_object`; CPython keeps pointers to the tables), and `instance::TYPE` is set
//!   once; PyO3's module initialisation refuses a subinterpreter, so one interpreter sees them.

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
