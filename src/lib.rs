//! `dlpack._dlpack`: module registration only. The data path is `import` (one importer per
//! protocol) -> `tensor` (the one description) -> `export` (DLPack capsules, the C exchange
//! API) and `copy`; `object` is the Python face, `cuda` the driver loaded at run time.

mod copy;
mod cuda;
mod error;
mod export;
mod ffi;
mod import;
mod object;
mod tensor;

use pyo3::prelude::*;

#[pymodule]
fn _dlpack(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<object::DLPackObject>()?;
    object::install_dlpack_method(&m.py().get_type::<object::DLPackObject>())?;
    m.add_function(wrap_pyfunction!(object::asdlpack, m)?)?;
    m.add_function(wrap_pyfunction!(object::copyto, m)?)?;
    m.add_function(wrap_pyfunction!(object::_footprint, m)?)?;
    m.add(
        "DLPACK_VERSION",
        (ffi::DLPACK_MAJOR_VERSION, ffi::DLPACK_MINOR_VERSION),
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
