//! Which protocols a type offers, probed once per type: a failed attribute lookup costs an
//! AttributeError, several times the price of the whole exchange, so `import` looks up on an
//! instance only what its type has, or what its instances could add themselves.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::sync::Interned;
use pyo3::types::{PyCapsule, PyString, PyType};

use super::address_map::AddressMap;
use crate::ffi::CAPSULE_EXCHANGE_API;
use crate::ffi::arrow::Method;
use crate::ffi::python;
use dlpack_core::abi::DLPACK_MAJOR_VERSION;
use dlpack_core::abi::DLPackExchangeAPI;
use pyo3::intern;

#[derive(Clone, Copy, Debug)]
pub struct Protocols {
    pub dlpack: bool,
    pub cuda_array_interface: bool,
    pub array_struct: bool,
    pub array_interface: bool,
    /// The Arrow PyCapsule interface's methods the type declares, indexed by `Method as usize`.
    pub arrow_methods: [bool; 4],
    /// numpy's `__array__`, the last resort.
    pub numpy_array: bool,
    /// The type declares any of the Arrow PyCapsule interface's four methods.
    pub arrow: bool,
    /// The type's DLPack C exchange API table (major version 1).
    pub exchange_api: Option<ExchangeApi>,
    /// A torch tensor type: its C exchange API exports tensors its `__dlpack__` refuses
    /// (conjugate or negative bit, requires grad), so those are checked first.
    pub torch: bool,
    /// Exactly `numpy.ndarray`: read from its struct (see `import::numpy`).
    pub ndarray: bool,
    /// A `numpy.ma.MaskedArray` (or subclass): its DLPack and array interface exports are its
    /// data without the mask, so masked elements must be refused first.
    pub numpy_masked: bool,
    /// A JAX array or numpy scalar type: immutable, though its exports carry no read-only flag.
    pub immutable: bool,
    /// Absent protocols must still be looked up on each instance: its type is a heap type
    /// (whose attributes can change after we probed it), or its instances may carry attributes
    /// of their own (an instance `__dict__`, or `__getattr__`).
    pub dynamic: bool,
}

/// A `DLPackExchangeAPI` table a type published: only `exchange_api`, which found it in the
/// type's capsule, makes one. Valid for the life of the process, by the protocol's rules.
#[derive(Clone, Copy)]
pub struct ExchangeApi(&'static DLPackExchangeAPI);

impl std::fmt::Debug for ExchangeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ExchangeApi({:p})", self.0)
    }
}

// SAFETY: the table is immutable, and its functions may be called from any thread (holding the
// GIL, as the protocol asks).
unsafe impl Send for ExchangeApi {}
// SAFETY: a shared `ExchangeApi` only gives out the `'static` table, which is immutable and
// whose functions may be called from any thread (holding the GIL, as the protocol asks).
unsafe impl Sync for ExchangeApi {}

impl ExchangeApi {
    pub fn table(self) -> &'static DLPackExchangeAPI {
        self.0
    }
}

/// Types seen so far by address, each held alive so its address can't be reused by another.
type TypeCache = AddressMap<(Py<PyType>, Protocols)>;
static CACHE: Mutex<Option<TypeCache>> = Mutex::new(None);
/// Beyond this many types, probe every time rather than grow without bound.
const MAX_CACHED_TYPES: usize = 1024;

pub fn of_type(ty: &Bound<'_, PyType>) -> Protocols {
    let key = ty.as_ptr() as usize;
    if let Ok(cache) = CACHE.lock()
        && let Some((_, protocols)) = cache.as_ref().and_then(|c| c.get(&key))
    {
        return *protocols;
    }
    // Probing may run Python code (metaclass attributes), so the lock is not held meanwhile.
    let protocols = probe(ty);
    if let Ok(mut cache) = CACHE.lock() {
        let cache = cache.get_or_insert_with(AddressMap::default);
        if cache.len() < MAX_CACHED_TYPES {
            cache.insert(key, (ty.clone().unbind(), protocols));
        }
    }
    protocols
}

fn probe(ty: &Bound<'_, PyType>) -> Protocols {
    let py = ty.py();
    let has = |name| ty.hasattr(name).unwrap_or(true);
    let heap_type = python::is_heap_type(ty);
    let dict_offset = ty
        .getattr(intern!(py, "__dictoffset__"))
        .and_then(|v| v.extract::<isize>())
        .unwrap_or(1);
    let mut arrow_methods = [false; 4];
    for method in Method::ALL {
        arrow_methods[method as usize] = has(arrow_name(py, method));
    }
    Protocols {
        dlpack: has(intern!(py, "__dlpack__")),
        cuda_array_interface: has(intern!(py, "__cuda_array_interface__")),
        array_struct: has(intern!(py, "__array_struct__")),
        array_interface: has(intern!(py, "__array_interface__")),
        arrow_methods,
        numpy_array: has(intern!(py, "__array__")),
        arrow: arrow_methods.contains(&true),
        exchange_api: exchange_api(ty),
        ndarray: super::numpy::is_ndarray_type(ty),
        numpy_masked: is_numpy_masked_array_type(ty),
        immutable: ty.module().is_ok_and(|m| {
            m.to_str()
                .is_ok_and(|m| m == "jax" || m.starts_with("jax.") || m.starts_with("jaxlib"))
        }) || in_mro(ty, "generic", |m| m == "numpy"),
        torch: ty.module().is_ok_and(|m| {
            m.to_str()
                .is_ok_and(|m| m == "torch" || m.starts_with("torch."))
        }),
        dynamic: heap_type || dict_offset != 0 || has(intern!(py, "__getattr__")),
    }
}

/// The Arrow methods' names, interned once, indexed by `Method as usize`.
static ARROW_NAMES: [Interned; 4] = [
    Interned::new(Method::Array.name()),
    Interned::new(Method::Stream.name()),
    Interned::new(Method::DeviceArray.name()),
    Interned::new(Method::DeviceStream.name()),
];

/// The name of an Arrow method, as an interned Python string.
pub fn arrow_name(py: Python<'_>, method: Method) -> &Bound<'_, PyString> {
    ARROW_NAMES[method as usize].get(py)
}

/// The `DLPackExchangeAPI` a type publishes in `__dlpack_c_exchange_api__` (a capsule named
/// "dlpack_exchange_api"), if its major version is ours and it can export managed tensors.
fn exchange_api(ty: &Bound<'_, PyType>) -> Option<ExchangeApi> {
    let py = ty.py();
    let capsule = ty
        .getattr_opt(intern!(py, "__dlpack_c_exchange_api__"))
        .ok()??;
    let capsule = capsule.cast::<PyCapsule>().ok()?;
    // SAFETY: `capsule` is live and we hold the GIL (`capsule` proves both); a wrong name gives
    // NULL (and an error we clear).
    let table = unsafe { python::capsule_pointer(capsule.as_ptr(), CAPSULE_EXCHANGE_API.as_ptr()) };
    if table.is_null() {
        // SAFETY: we hold the GIL (`capsule` proves it).
        unsafe { python::clear_error() };
        return None;
    }
    // SAFETY: a capsule of this name holds a `DLPackExchangeAPI` that lives as long as the
    // process (the protocol's rule).
    let table: &'static DLPackExchangeAPI = unsafe { &*(table as *const DLPackExchangeAPI) };
    (table.header.version.major == DLPACK_MAJOR_VERSION
        && table.managed_tensor_from_py_object_no_sync.is_some())
    .then_some(ExchangeApi(table))
}

/// Whether `ty` is `numpy.ma.MaskedArray` or a subclass of it (found by name along the MRO, so
/// numpy need not be imported here).
fn is_numpy_masked_array_type(ty: &Bound<'_, PyType>) -> bool {
    in_mro(ty, "MaskedArray", |m| m.starts_with("numpy.ma"))
}

/// Whether `ty` is or derives from a class of this name whose module `module` accepts (numpy's
/// scalars derive from `numpy.generic`: immutable, though their array interfaces lend a
/// writable temporary).
fn in_mro(ty: &Bound<'_, PyType>, name: &str, module: impl Fn(&str) -> bool) -> bool {
    let py = ty.py();
    let Ok(mro) = ty.getattr(intern!(py, "__mro__")) else {
        return false;
    };
    let Ok(mro) = mro.try_iter() else {
        return false;
    };
    mro.flatten().any(|class| {
        let text = |attr| {
            class
                .getattr(attr)
                .ok()
                .and_then(|v| v.extract::<String>().ok())
        };
        text(intern!(py, "__name__")).as_deref() == Some(name)
            && text(intern!(py, "__module__")).is_some_and(|m| module(&m))
    })
}
