//! Importers for numpy's `__array_interface__` (v3) and `__array_struct__`, plus the dict-field
//! readers the CUDA array interface shares.

use std::ffi::c_void;
use std::mem::ManuallyDrop;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule, PyDict, PyInt, PyString, PyTuple};

use super::buffer::View;
use crate::error::{Error, Result};
use crate::ffi::python;
use crate::ffi::{PyArrayInterface, array_struct_flags};
use crate::tensor::{Device, Owner, Storage, Tensor};
use dlpack_core::dtype::{self, DType, StoredType, TypeStr};
use dlpack_core::layout::Layout;

/// Reads the fields of an interface dict, naming the interface in its errors.
pub struct InterfaceDict<'py> {
    pub dict: Bound<'py, PyDict>,
    pub name: &'static str,
}

impl<'py> InterfaceDict<'py> {
    pub fn new(value: Bound<'py, PyAny>, name: &'static str) -> Result<Self> {
        let dict = value.cast_into::<PyDict>().map_err(|e| {
            Error::type_(format!(
                "{name} must be a dict, not {}",
                type_name(e.into_inner().as_any())
            ))
        })?;
        Ok(InterfaceDict { dict, name })
    }

    /// A key's value, `None` when missing or None.
    pub fn get(&self, key: &str) -> Result<Option<Bound<'py, PyAny>>> {
        Ok(self.dict.get_item(key)?.filter(|v| !v.is_none()))
    }

    pub fn require(&self, key: &str) -> Result<Bound<'py, PyAny>> {
        self.get(key)?
            .ok_or_else(|| Error::value(format!("{} has no {key:?}", self.name)))
    }

    /// An integer field, read as numpy reads them: anything with `__index__` (numpy integers
    /// too).
    pub fn int(&self, key: &str, value: &Bound<'py, PyAny>) -> Result<i64> {
        let what = || format!("{} {key:?}", self.name);
        let index = value.call_method0(pyo3::intern!(value.py(), "__index__"));
        let Ok(index) = index else {
            return Err(Error::type_(format!(
                "{} must be an integer, not {}",
                what(),
                type_name(value)
            )));
        };
        index
            .extract::<i64>()
            .map_err(|_| Error::value(format!("{} {index} does not fit in 64 bits", what())))
    }

    pub fn version(&self, accepted: std::ops::RangeInclusive<i64>) -> Result<i64> {
        let version = self.int("version", &self.require("version")?)?;
        if !accepted.contains(&version) {
            return Err(Error::value(format!(
                "{} version {version} is not supported (expected {} to {})",
                self.name,
                accepted.start(),
                accepted.end()
            )));
        }
        Ok(version)
    }

    pub fn shape(&self) -> Result<Vec<i64>> {
        let shape = self.require("shape")?;
        self.int_tuple("shape", &shape)
    }

    pub fn strides(&self) -> Result<Option<Vec<i64>>> {
        self.get("strides")?
            .map(|s| self.int_tuple("strides", &s))
            .transpose()
    }

    /// The type string: a str, or bytes (which numpy still accepts).
    pub fn typestr(&self) -> Result<String> {
        let typestr = self.require("typestr")?;
        if let Ok(bytes) = typestr.cast::<PyBytes>() {
            return Ok(String::from_utf8_lossy(bytes.as_bytes()).into_owned());
        }
        let typestr = typestr.cast::<PyString>().map_err(|_| {
            Error::type_(format!(
                "{} \"typestr\" must be a str, not {}",
                self.name,
                type_name(&typestr)
            ))
        })?;
        Ok(typestr.to_str()?.to_owned())
    }

    /// `data` given as `(address, readonly)`: the address a Python int (as numpy requires), the
    /// flag read by its truth value (as numpy reads it).
    pub fn pointer_pair(&self, data: &Bound<'py, PyAny>) -> Result<(*mut c_void, bool)> {
        let pair = data.cast::<PyTuple>().map_err(|_| {
            Error::type_(format!(
                "{} \"data\" must be a (pointer, readonly) tuple, not {}",
                self.name,
                type_name(data)
            ))
        })?;
        if pair.len() != 2 {
            return Err(Error::value(format!(
                "{} \"data\" must be a (pointer, readonly) pair, got {} items",
                self.name,
                pair.len()
            )));
        }
        let address = pair.get_item(0)?;
        if !address.is_instance_of::<PyInt>() {
            return Err(Error::type_(format!(
                "{} data pointer must be an int, not {}",
                self.name,
                type_name(&address)
            )));
        }
        let address = self.int("data", &address)?;
        let address = usize::try_from(address).map_err(|_| {
            Error::value(format!("{} data pointer {address} is negative", self.name))
        })?;
        let readonly = pair.get_item(1)?.is_truthy()?;
        Ok((address as *mut c_void, readonly))
    }

    pub fn reject_mask(&self) -> Result<()> {
        if self.get("mask")?.is_some() {
            return Err(Error::buffer(format!(
                "{} with a mask can't be DLPack (DLPack has no masked arrays)",
                self.name
            )));
        }
        Ok(())
    }

    fn int_tuple(&self, key: &str, value: &Bound<'py, PyAny>) -> Result<Vec<i64>> {
        let tuple = value.cast::<PyTuple>().map_err(|_| {
            Error::type_(format!(
                "{} {key:?} must be a tuple, not {}",
                self.name,
                type_name(value)
            ))
        })?;
        tuple.iter().map(|item| self.int(key, &item)).collect()
    }
}

/// An exact Python int (bools included, as Python allows) converted to `i64`.
pub fn to_i64(value: &Bound<'_, PyAny>, what: &str) -> Result<i64> {
    if !value.is_instance_of::<PyInt>() {
        return Err(Error::type_(format!(
            "{what} must be int, not {}",
            type_name(value)
        )));
    }
    value
        .extract::<i64>()
        .map_err(|_| Error::value(format!("{what} {value} does not fit in 64 bits")))
}

pub fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned())
}

/// Resolve a typestr; opaque element types (ml_dtypes' bfloat16, float8_*) are named by the
/// source's `dtype.name`.
pub fn resolve_dtype(source: &Bound<'_, PyAny>, typestr: &str) -> Result<StoredType> {
    match dtype::parse_typestr(typestr)? {
        TypeStr::Known(element) => Ok(element),
        TypeStr::Opaque { itemsize, swapped } => named_dtype(source, itemsize)
            .map(|dtype| StoredType { dtype, swapped })
            .ok_or_else(|| {
                Error::buffer(format!(
                    "typestr {typestr:?} (opaque or structured elements) is not a DLPack type"
                ))
            }),
    }
}

fn named_dtype(source: &Bound<'_, PyAny>, itemsize: usize) -> Option<DType> {
    let py = source.py();
    let name = source
        .getattr_opt(intern!(py, "dtype"))
        .ok()??
        .getattr(intern!(py, "name"))
        .ok()?;
    let dt = DType::from_name(name.cast::<PyString>().ok()?.to_str().ok()?)?;
    (dt.itemsize() == itemsize).then_some(dt)
}

/// Import an object through its `__array_interface__` dict.
pub fn import(source: &Bound<'_, PyAny>, interface: Bound<'_, PyAny>) -> Result<Tensor> {
    let fields = InterfaceDict::new(interface, "__array_interface__")?;
    fields.version(3..=i64::MAX)?;
    fields.reject_mask()?;
    let shape = fields.shape()?;
    let strides = fields.strides()?;
    let typestr = fields.typestr()?;
    let StoredType { dtype, swapped } = resolve_dtype(source, &typestr)?;
    let layout = Layout::from_byte_strides(&shape, strides.as_deref(), dtype.itemsize())?;
    let data = fields.get("data")?;
    let (data, readonly, owner) = match data {
        // A pointer: `offset` is not read (the interface defines it for buffers only, and numpy
        // ignores it here).
        Some(data) if data.is_instance_of::<PyTuple>() => {
            let (address, readonly) = fields.pointer_pair(&data)?;
            (address, readonly, Owner::object(source.clone().unbind()))
        }
        // No data: the object's own buffer; otherwise a buffer object holding the data, where
        // the elements start `offset` bytes in.
        other => {
            let offset = match fields.get("offset")? {
                Some(value) => fields.int("offset", &value)?,
                None => 0,
            };
            let provider = other.as_ref().unwrap_or(source);
            if !super::buffer::supports(provider) {
                return Err(Error::type_(match &other {
                    Some(_) => format!(
                        "__array_interface__ \"data\" must be a (pointer, readonly) tuple, a \
                         buffer or None, not {}",
                        type_name(provider)
                    ),
                    None => format!(
                        "__array_interface__ has no \"data\", so the memory is the object's own \
                         buffer, and {} does not support the buffer protocol",
                        type_name(provider)
                    ),
                }));
            }
            let view = View::acquire(provider)?;
            let raw = view.raw();
            let (low, high) = layout.byte_extent(dtype.itemsize())?;
            if low.saturating_add(offset) < 0 || high.saturating_add(offset) > raw.len as i64 {
                return Err(Error::value(format!(
                    "__array_interface__ shape, strides and offset reach bytes [{}, {}) outside \
                     the {}-byte data buffer",
                    low.saturating_add(offset),
                    high.saturating_add(offset),
                    raw.len
                )));
            }
            // SAFETY: the offset lies within the buffer (checked just above).
            let data = unsafe { raw.buf.cast::<u8>().add(offset as usize) }.cast::<c_void>();
            (data, view.readonly(), view.into_owner())
        }
    };
    Tensor::check_data(data, &layout)?;
    let storage = Storage {
        data,
        device: Device::CPU,
        dtype,
        readonly,
        swapped,
        indirect: false,
        stream: None,
    };
    // SAFETY: the producer's word, which nothing can check: per the array interface, its data
    // pointer (or the buffer it names, whose bounds the layout was checked against), shape and
    // strides address the elements in host memory while the object (or the buffer view), the
    // owner, lives; writable unless the interface (or the buffer) says read-only.
    Ok(unsafe { Tensor::new(storage, layout, owner) })
}

/// Import an object through its `__array_struct__` capsule (numpy's C struct: no dict to build
/// or parse, so this is the faster of the two).
pub fn import_struct(source: &Bound<'_, PyAny>, capsule: Bound<'_, PyAny>) -> Result<Tensor> {
    let capsule = capsule.cast_into::<PyCapsule>().map_err(|e| {
        Error::type_(format!(
            "__array_struct__ must be a PyCapsule, not {}",
            type_name(e.into_inner().as_any())
        ))
    })?;
    // SAFETY: `capsule` is a live capsule, and we hold the GIL (`capsule` proves it).
    let name = unsafe { python::capsule_name(capsule.as_ptr()) };
    // SAFETY: we hold the GIL (`capsule` proves it).
    if name.is_null() && unsafe { python::error_occurred() } {
        return Err(PyErr::fetch(source.py()).into());
    }
    // SAFETY: `capsule` is live and we hold the GIL (`capsule` proves both); `name` is the
    // capsule's own, a C string or null.
    let info = unsafe { python::capsule_pointer(capsule.as_ptr(), name) };
    if info.is_null() {
        // SAFETY: we hold the GIL (`capsule` proves it).
        unsafe { python::clear_error() }; // ours says more
    }
    let info = info as *const PyArrayInterface;
    if info.is_null() {
        return Err(Error::value(
            "__array_struct__ capsule holds no PyArrayInterface",
        ));
    }
    // SAFETY: numpy's protocol: the capsule holds a PyArrayInterface valid while it lives.
    let info = unsafe { &*info };
    if info.two != 2 {
        return Err(Error::value(
            "__array_struct__ is not a PyArrayInterface (two != 2)",
        ));
    }
    let ndim = usize::try_from(info.nd)
        .map_err(|_| Error::value(format!("__array_struct__ nd {} is negative", info.nd)))?;
    if ndim > 0 && info.shape.is_null() {
        return Err(Error::value("__array_struct__ has no shape"));
    }
    let itemsize = usize::try_from(info.itemsize)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| Error::value(format!("__array_struct__ itemsize {}", info.itemsize)))?;
    let order = if info.flags & array_struct_flags::NOTSWAPPED != 0 {
        '='
    } else if cfg!(target_endian = "little") {
        '>'
    } else {
        '<'
    };
    let typestr = format!("{order}{}{itemsize}", info.typekind as char);
    let StoredType { dtype, swapped } = resolve_dtype(source, &typestr)?;
    // SAFETY: numpy's protocol: the shape has `nd` entries while the capsule (ours here) lives;
    // not null when `ndim > 0` (checked above), not read when 0.
    let shape = unsafe { dlpack_core::abi::c_array(info.shape, ndim) };
    let shape: Vec<i64> = shape.iter().map(|&n| n as i64).collect();
    let strides = (ndim > 0 && !info.strides.is_null()).then(|| {
        // SAFETY: numpy's protocol: non-null strides (checked) have `nd` entries while the
        // capsule (ours here) lives.
        let strides = unsafe { dlpack_core::abi::c_array(info.strides, ndim) };
        strides.iter().map(|&n| n as i64).collect::<Vec<_>>()
    });
    let layout = Layout::from_byte_strides(&shape, strides.as_deref(), dtype.itemsize())?;
    Tensor::check_data(info.data, &layout)?;
    let owner = Owner::ArrayStruct {
        capsule: ManuallyDrop::new(capsule.into_any().unbind()),
        producer: ManuallyDrop::new(source.clone().unbind()),
    };
    let storage = Storage {
        data: info.data,
        device: Device::CPU,
        dtype,
        readonly: info.flags & array_struct_flags::WRITEABLE == 0,
        swapped,
        indirect: false,
        stream: None,
    };
    // SAFETY: the producer's word, which nothing can check: per numpy's protocol, the
    // PyArrayInterface's data, shape and strides address the elements in host memory while the
    // capsule (held with its source by the owner) lives; writable when its WRITEABLE flag is set.
    Ok(unsafe { Tensor::new(storage, layout, owner) })
}
