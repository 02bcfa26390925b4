//! `dlpack._dlpack`: module registration only. The data path is `import` (one importer per
//! protocol) -> `tensor` (the one description) -> `export` (DLPack capsules, the C exchange
//! API) and `copy`; `object` is the Python face, `tables` what Python asks of the core. What
//! needs no Python (DLPack's ABI, element types, layouts, memory we own, the copy engines, the
//! CUDA driver loaded at run time) is the core crate's, `dlpack_core`; `ffi` adds the Python
//! side's ABIs, `error` the one mapping to Python exceptions.

mod copy;
mod error;
mod export;
mod ffi;
mod import;
mod object;
mod tables;
mod tensor;

use pyo3::prelude::*;

#[pymodule]
fn _dlpack(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let ty = object::type_object(m.py())?;
    // For C consumers (tvm-ffi, torch) that skip the Python `__dlpack__` call.
    ty.setattr(
        "__dlpack_c_exchange_api__",
        object::exchange_api_capsule(m.py())?,
    )?;
    m.add("DLPackObject", ty)?;
    m.add("asdlpack", object::asdlpack_function(m)?)?;
    m.add_function(wrap_pyfunction!(object::copyto, m)?)?;
    m.add_function(wrap_pyfunction!(object::_footprint, m)?)?;
    m.add(
        "DLPACK_VERSION",
        (ffi::DLPACK_MAJOR_VERSION, ffi::DLPACK_MINOR_VERSION),
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    tables::register(m)?;
    Ok(())
}
