//! What the package knows, for Python: device codes, element types, the layout math the
//! Python modules need and the order `asdlpack` tries protocols in, read from the same tables
//! the Rust code uses, so Python restates none.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFrozenSet, PyList, PyMappingProxy, PyTuple};

use dlpack_core::copy::cpu::tune::{self, Choice, How, Memory};

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
    m.add_function(wrap_pyfunction!(_copy_engine, m)?)?;
    Ok(())
}

/// What the CPU copy engine chose, per kind of copy and size band, and from what (see the
/// stub in `_dlpack.pyi` for the dict). `measure`: first measure, on copies of the engine's
/// own, whatever this process hasn't yet.
#[pyfunction]
#[pyo3(signature = (measure = false))]
fn _copy_engine(py: Python<'_>, measure: bool) -> Result<Bound<'_, PyDict>> {
    if measure {
        py.detach(dlpack_core::copy::cpu::calibrate_now)?;
    }
    let report = tune::report();
    let out = PyDict::new(py);
    out.set_item("max_threads", report.max_threads)?;
    out.set_item("parallel_threshold", tune::PARALLEL_THRESHOLD)?;
    out.set_item("large_threshold", tune::LARGE_THRESHOLD)?;
    out.set_item("margin", tune::MARGIN)?;
    let settings = PyDict::new(py);
    for name in [tune::THREADS_VAR, tune::STORES_VAR] {
        settings.set_item(name, std::env::var(name).ok())?;
    }
    out.set_item("settings", settings)?;
    out.set_item("settings_error", report.settings.err())?;
    let stores = |c: &Choice| if c.streaming { "streaming" } else { "regular" };
    let choices = PyList::empty(py);
    for entry in report.entries {
        let e = PyDict::new(py);
        e.set_item("kind", entry.key.class.name())?;
        let memory = match entry.key.memory {
            Memory::Mapped => "mapped",
            Memory::Fresh => "fresh",
        };
        e.set_item("memory", memory)?;
        e.set_item("bytes", entry.bytes)?;
        let (state, choice) = match &entry.record {
            None => ("not yet", None),
            Some(r) if r.how == How::Fixed => ("fixed", Some(r.choice)),
            Some(r) => ("measured", Some(r.choice)),
        };
        e.set_item("state", state)?;
        e.set_item("threads", choice.map(|c| c.threads))?;
        e.set_item("stores", choice.as_ref().map(stores))?;
        let measured = match entry.record.map(|r| r.how) {
            Some(How::Measured(m)) => Some(m),
            _ => None,
        };
        let candidates = PyList::empty(py);
        for c in &entry.candidates {
            let d = PyDict::new(py);
            d.set_item("threads", c.threads)?;
            d.set_item("stores", stores(c))?;
            let per_byte = measured
                .as_ref()
                .and_then(|m| m.candidates.iter().find(|(x, _)| x == c))
                .and_then(|(_, t)| *t);
            // Bytes read and written per second, as the benchmarks count them.
            d.set_item("gb_per_s", per_byte.map(|t| 2.0 / t / 1e9))?;
            candidates.append(d)?;
        }
        e.set_item("candidates", candidates)?;
        e.set_item("copy_bytes", measured.as_ref().map(|m| m.copy_bytes))?;
        e.set_item(
            "calibrated_bytes",
            measured.as_ref().map(|m| m.calibrated_bytes),
        )?;
        e.set_item("seconds", measured.as_ref().map(|m| m.seconds))?;
        e.set_item("cost_seconds", measured.as_ref().map(|m| m.cost_seconds))?;
        choices.append(e)?;
    }
    out.set_item("choices", choices)?;
    Ok(out)
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
