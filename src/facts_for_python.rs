//! What the package knows, for Python: device codes, element types, the layout math the
//! Python modules need and the order `asdlpack` tries protocols in, read from the same tables
//! the Rust code uses, so Python restates none.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFrozenSet, PyMappingProxy, PyTuple};

use dlpack_core::device::{CPU_READABLE_DEVICE_TYPES, DEVICE_TYPES, HOST_DEVICE_TYPES};
use dlpack_core::dtype::DType;
use dlpack_core::layout;

use crate::error::Result;

/// Adds `DLDeviceType`, `HOST_DEVICE_TYPES`, `CPU_READABLE_DEVICE_TYPES`, `ELEMENT_TYPES`,
/// `byte_extent` and `dense_strides` to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    // An IntEnum as users know it from `dlpack.DLDeviceType` (pickled by that name).
    let members: Vec<(&str, i32)> = DEVICE_TYPES.to_vec();
    let kwargs = PyDict::new(py);
    kwargs.set_item("module", "dlpack")?;
    let enum_type = py
        .import("enum")?
        .getattr("IntEnum")?
        .call(("DLDeviceType", members), Some(&kwargs))?;
    enum_type.setattr(
        "__doc__",
        "DLPack device type codes, as in ``dlpack.h``; ``__dlpack_device__()`` returns these ints.",
    )?;
    m.add("DLDeviceType", enum_type)?;
    // The protocols `asdlpack` tries, in its order (the guide states it; a test compares).
    let order: Vec<&str> = crate::import::ORDER
        .iter()
        .filter_map(|step| step.protocol())
        .collect();
    m.add("IMPORT_ORDER", PyTuple::new(py, order)?)?;
    m.add(
        "HOST_DEVICE_TYPES",
        PyFrozenSet::new(py, HOST_DEVICE_TYPES)?,
    )?;
    m.add(
        "CPU_READABLE_DEVICE_TYPES",
        PyFrozenSet::new(py, CPU_READABLE_DEVICE_TYPES)?,
    )?;
    let types = PyDict::new(py);
    for (name, dtype) in DType::named() {
        types.set_item(name, (dtype.typestr(false), dtype.itemsize()))?;
    }
    m.add("ELEMENT_TYPES", PyMappingProxy::new(py, types.as_mapping()))?;
    m.add_function(wrap_pyfunction!(byte_extent, m)?)?;
    m.add_function(wrap_pyfunction!(dense_strides, m)?)?;
    Ok(())
}

/// The bytes ``[low, high)`` the elements span relative to the first element; ``(0, 0)`` when
/// there are none.
#[pyfunction]
fn byte_extent(shape: Vec<i64>, byte_strides: Vec<i64>, itemsize: usize) -> Result<(i64, i64)> {
    Ok(layout::byte_extent(&shape, &byte_strides, itemsize)?)
}

/// Byte strides packing ``shape`` densely in the order ``byte_strides`` lays the dimensions out
/// in memory (numpy's ``order="K"``; ties go the C way).
#[pyfunction]
fn dense_strides(shape: Vec<i64>, byte_strides: Vec<i64>, itemsize: usize) -> Result<Vec<i64>> {
    Ok(layout::dense_strides(&shape, &byte_strides, itemsize)?)
}
