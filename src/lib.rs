//! `dlpack._dlpack`, the extension behind the `dlpack` Python package and the one runtime of a
//! process: other extensions reach it through its C API (`api::capi`, whose Rust client is the
//! `dlpack-adapter` crate). Here, module registration only. The data path is `import` (one importer per
//! protocol) -> `tensor` (the one description) -> `export` (DLPack capsules, the C exchange
//! API) and `copy`; `object` is the Python face, `facts_for_python` what Python asks of the core. What
//! needs no Python (DLPack's ABI, element types, layouts, memory we own, the copy engines, the
//! CUDA driver loaded at run time) is the core crate's, `dlpack_core`; `ffi` adds the Python
//! side's ABIs, `error` the one mapping to Python exceptions.
//!
//! ```text
//! import   one importer per protocol (buffer, array_interface, cuda_array_interface, dlpack,
//!          numpy's struct, arrow and what its arrays become, arrow_values); dispatch picks
//!          one, protocols caches what a type offers
//! tensor   description (Tensor, Device, Exportable) and owner (what keeps the memory alive)
//! export   policy (what a request gets), capsule, buffer (PEP 3118), interface (numpy's and
//!          the CUDA array interfaces), arrow and arrow_stream (the Arrow PyCapsule interface)
//! copy     copies between tensors: host, cuda, copyto (the checks both share)
//! object   DLPackObject: state, methods, instance (its CPython memory), pytype (the type and
//!          entry points), arguments, exchange_api; asdlpack and copy_into (the module's
//!          functions)
//! ffi      capsule names, numpy's structs, arrow (the Arrow PyCapsule interface's methods
//!          and capsule names, the C Device interface's structs arrow-rs doesn't bind), python
//!          (every raw CPython call); DLPack's ABI is the core's
//! facts_for_python  device types, element types and layout math for the Python package
//! testing  hooks for the package's tests and benchmarks (dlpack._dlpack._testing), not API
//! error    the core's error or Python's, one mapping to Python exceptions
//! ```

mod api;
mod copy;
mod error;
mod export;
mod facts_for_python;
mod ffi;
mod import;
mod object;
#[cfg(target_os = "linux")]
mod share;
mod tensor;
mod testing;

use pyo3::prelude::*;

#[pymodule(gil_used = false)]
fn _dlpack(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The copy engine's settings come from the environment: refuse what can't be understood
    // rather than copy otherwise than asked.
    if let Err(why) = dlpack_core::copy::cpu::tune::Settings::from_env() {
        return Err(pyo3::exceptions::PyValueError::new_err(why.clone()));
    }
    m.add("DLPackObject", object::type_object(m.py())?)?;
    // The runtime other extensions view memory through (see `api::capi`).
    m.add("_C_API", api::capi::capsule(m.py())?)?;
    m.add("asdlpack", object::asdlpack_function(m)?)?;
    m.add_function(wrap_pyfunction!(object::copyto, m)?)?;
    m.add_function(wrap_pyfunction!(object::_from_buffer, m)?)?;
    // Pickles name `_from_buffer` as the reconstructor of a DLPackObject.
    object::set_reconstructor(&m.getattr("_from_buffer")?);
    m.add(
        "DLPACK_VERSION",
        (
            dlpack_core::abi::DLPACK_MAJOR_VERSION,
            dlpack_core::abi::DLPACK_MINOR_VERSION,
        ),
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    facts_for_python::register(m)?;
    #[cfg(feature = "pyclass-probe")]
    object::register_pyclass_probe(m)?;
    #[cfg(target_os = "linux")]
    share::register(m)?;
    testing::register(m)?;
    Ok(())
}
