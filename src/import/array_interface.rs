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

/// The interfaces' field checks met in an embedded interpreter, with dicts and capsules made
/// here: what each field's lie is refused as, and what a sound one describes. The Python suite
/// meets them through real producers (test_bad_input.py, test_providers.py); these reach every
/// check without building the extension.
#[cfg(test)]
mod tests {
    use std::ffi::{CString, c_void};

    use pyo3::prelude::*;
    use pyo3::types::{PyByteArray, PyBytes, PyCapsule};

    use super::super::test_support::{attached, refusal};
    use super::{import, import_struct, to_i64};
    use crate::error::Result;
    use crate::ffi::{PyArrayInterface, array_struct_flags};
    use crate::tensor::Tensor;

    fn eval<'py>(py: Python<'py>, source: &str) -> Bound<'py, PyAny> {
        py.eval(&CString::new(source).unwrap(), None, None)
            .unwrap_or_else(|err| panic!("{source}: {err}"))
    }

    /// What a tensor describes: its address, element type, shape, byte strides, and whether it
    /// is read-only and byte-swapped.
    fn described(tensor: &Tensor) -> (usize, String, Vec<i64>, Vec<i64>, bool, bool) {
        let layout = tensor.layout();
        (
            tensor.data() as usize,
            tensor.dtype().name(),
            layout.shape().to_vec(),
            layout.byte_strides().to_vec(),
            tensor.readonly(),
            tensor.swapped(),
        )
    }

    /// `__array_interface__` given as a dict display, on `source`.
    fn interface(source: &Bound<'_, PyAny>, dict: &str) -> Result<Tensor> {
        import(source, eval(source.py(), dict))
    }

    #[test]
    fn a_pointer_is_read_with_its_fields() {
        attached(|py| {
            let source = eval(py, "object()");
            let tensor = interface(
                &source,
                "{'version': 3, 'shape': (2, 3), 'strides': (4, 8), 'typestr': '<f4', \
                 'data': (4096, True)}",
            )
            .ok()
            .unwrap();
            let expected = (
                4096,
                "float32".to_owned(),
                vec![2, 3],
                vec![4, 8],
                true,
                false,
            );
            assert_eq!(described(&tensor), expected);
            // No strides (or None) is C order; numpy's integers and bytes typestrs are read as
            // numpy reads them; the flag by its truth value.
            let tensor = interface(
                &source,
                "{'version': type('I', (), {'__index__': lambda self: 3})(), 'shape': (2, 3), \
                 'strides': None, 'typestr': b'>i2', 'data': (8192, []), 'mask': None}",
            )
            .ok()
            .unwrap();
            let expected = (
                8192,
                "int16".to_owned(),
                vec![2, 3],
                vec![6, 2],
                false,
                true,
            );
            assert_eq!(described(&tensor), expected);
        });
    }

    #[test]
    fn each_lying_field_is_refused_naming_it() {
        attached(|py| {
            let source = eval(py, "object()");
            let with = |fields: &str| {
                let dict = format!(
                    "{{'version': 3, 'shape': (2,), 'typestr': '<f4', 'data': (4096, False), \
                     {fields}}}"
                );
                refusal(interface(&source, &dict))
            };
            let name = "__array_interface__";
            let cases = [
                (
                    "'version': 2",
                    "ValueError",
                    format!(
                        "{name} version 2 is not supported (expected 3 to 9223372036854775807)"
                    ),
                ),
                (
                    "'version': '3'",
                    "TypeError",
                    format!("{name} \"version\" must be an integer, not str"),
                ),
                (
                    "'version': 2**64",
                    "ValueError",
                    format!("{name} \"version\" 18446744073709551616 does not fit in 64 bits"),
                ),
                (
                    "'version': None",
                    "ValueError",
                    format!("{name} has no \"version\""),
                ),
                (
                    "'shape': None",
                    "ValueError",
                    format!("{name} has no \"shape\""),
                ),
                (
                    "'shape': [2]",
                    "TypeError",
                    format!("{name} \"shape\" must be a tuple, not list"),
                ),
                ("'strides': (4, 4)", "ValueError", String::new()),
                (
                    "'typestr': 4",
                    "TypeError",
                    format!("{name} \"typestr\" must be a str, not int"),
                ),
                (
                    "'data': (4096, False, 0)",
                    "ValueError",
                    format!("{name} \"data\" must be a (pointer, readonly) pair, got 3 items"),
                ),
                (
                    "'data': (4096.0, False)",
                    "TypeError",
                    format!("{name} data pointer must be an int, not float"),
                ),
                (
                    "'data': (-8, False)",
                    "ValueError",
                    format!("{name} data pointer -8 is negative"),
                ),
                (
                    "'data': 5",
                    "TypeError",
                    format!(
                        "{name} \"data\" must be a (pointer, readonly) tuple, a buffer or None, not int"
                    ),
                ),
                (
                    "'mask': b''",
                    "BufferError",
                    format!("{name} with a mask can't be DLPack (DLPack has no masked arrays)"),
                ),
            ];
            for (fields, kind, message) in cases {
                let (raised, said) = with(fields);
                assert_eq!(raised, kind, "{fields}: {said}");
                if !message.is_empty() {
                    assert_eq!(said, message, "{fields}");
                }
            }
            let (raised, said) = refusal(interface(
                &source,
                "{'version': 3, 'shape': (2,), 'typestr': '<f4'}",
            ));
            assert_eq!(raised, "TypeError");
            assert_eq!(
                said,
                "__array_interface__ has no \"data\", so the memory is the object's own buffer, \
                 and object does not support the buffer protocol"
            );
        });
    }

    #[test]
    fn a_buffer_holds_the_elements_within_its_bounds() {
        attached(|py| {
            let owned = PyByteArray::new(py, &[0; 24]);
            let start = owned.data() as usize;
            // No data: the source's own buffer, writable as a bytearray's is.
            let tensor = interface(
                owned.as_any(),
                "{'version': 3, 'shape': (6,), 'typestr': '<i4'}",
            )
            .ok()
            .unwrap();
            assert_eq!(
                described(&tensor),
                (start, "int32".to_owned(), vec![6], vec![4], false, false)
            );
            drop(tensor);
            // A buffer object in "data", the elements `offset` bytes in: up to its last byte,
            // and from its first, backwards.
            let globals = pyo3::types::PyDict::new(py);
            globals.set_item("buffer", &owned).unwrap();
            let with = |fields: &str| {
                let dict = format!("{{'version': 3, 'typestr': '<i4', 'data': buffer, {fields}}}");
                let dict = py
                    .eval(&CString::new(dict).unwrap(), Some(&globals), None)
                    .unwrap();
                import(&eval(py, "object()"), dict)
            };
            let tensor = with("'shape': (5,), 'offset': 4").ok().unwrap();
            assert_eq!(
                described(&tensor),
                (
                    start + 4,
                    "int32".to_owned(),
                    vec![5],
                    vec![4],
                    false,
                    false
                )
            );
            let tensor = with("'shape': (6,), 'strides': (-4,), 'offset': 20")
                .ok()
                .unwrap();
            assert_eq!(
                described(&tensor),
                (
                    start + 20,
                    "int32".to_owned(),
                    vec![6],
                    vec![-4],
                    false,
                    false
                )
            );
            let outside = |low: i64, high: i64| {
                (
                    "ValueError",
                    format!(
                        "__array_interface__ shape, strides and offset reach bytes [{low}, \
                         {high}) outside the 24-byte data buffer"
                    ),
                )
            };
            assert_eq!(refusal(with("'shape': (5,), 'offset': 5")), outside(5, 25));
            assert_eq!(
                refusal(with("'shape': (5,), 'offset': -1")),
                outside(-1, 19)
            );
            assert_eq!(
                refusal(with("'shape': (6,), 'strides': (-4,), 'offset': 19")),
                outside(-1, 23)
            );
            // bytes are read-only
            let frozen = PyBytes::new(py, &[0; 8]);
            let tensor = interface(
                frozen.as_any(),
                "{'version': 3, 'shape': (2,), 'typestr': '<u4'}",
            )
            .ok()
            .unwrap();
            let at = frozen.as_bytes().as_ptr() as usize;
            assert_eq!(
                described(&tensor),
                (at, "uint32".to_owned(), vec![2], vec![4], true, false)
            );
        });
    }

    #[test]
    fn opaque_elements_are_named_by_the_sources_dtype() {
        attached(|py| {
            let source = eval(
                py,
                "type('A', (), {'dtype': type('D', (), {'name': 'bfloat16'})()})()",
            );
            let dict = "{'version': 3, 'shape': (2,), 'typestr': '<V2', 'data': (4096, False)}";
            let tensor = interface(&source, dict).ok().unwrap();
            assert_eq!(
                described(&tensor),
                (4096, "bfloat16".to_owned(), vec![2], vec![2], false, false)
            );
            // a name whose size isn't the typestr's, or no name: not a DLPack type
            let wide = "{'version': 3, 'shape': (2,), 'typestr': '<V4', 'data': (4096, False)}";
            for (source, dict) in [(&source, wide), (&eval(py, "object()"), dict)] {
                let (raised, said) = refusal(interface(source, dict));
                assert_eq!(raised, "BufferError");
                assert!(said.ends_with("(opaque or structured elements) is not a DLPack type"));
            }
        });
    }

    #[test]
    fn exact_ints_only_and_within_64_bits() {
        attached(|py| {
            assert_eq!(to_i64(&eval(py, "7"), "n").ok(), Some(7));
            assert_eq!(to_i64(&eval(py, "True"), "n").ok(), Some(1));
            assert_eq!(
                refusal(to_i64(&eval(py, "7.0"), "n")),
                ("TypeError", "n must be int, not float".to_owned())
            );
            assert_eq!(
                refusal(to_i64(&eval(py, "-2**63 - 1"), "n")),
                (
                    "ValueError",
                    "n -9223372036854775809 does not fit in 64 bits".to_owned()
                )
            );
        });
    }

    /// `__array_struct__`: a capsule holding `info` (which must outlive its use), on no source.
    fn array_struct(py: Python<'_>, info: &PyArrayInterface) -> Result<Tensor> {
        let pointer = std::ptr::from_ref(info).cast_mut().cast::<c_void>();
        // SAFETY: a non-NULL pointer, no name and no destructor, as numpy's capsules have; we
        // are attached.
        let capsule = unsafe { pyo3::ffi::PyCapsule_New(pointer, std::ptr::null(), None) };
        // SAFETY: a new reference, non-NULL (PyCapsule_New fails only on a NULL pointer).
        let capsule = unsafe { Bound::from_owned_ptr(py, capsule) };
        assert!(capsule.is_instance_of::<PyCapsule>());
        import_struct(&eval(py, "object()"), capsule)
    }

    #[test]
    fn an_array_struct_is_read_with_its_fields() {
        use array_struct_flags::{NOTSWAPPED, WRITEABLE};
        let shape: [isize; 2] = [2, 3];
        let strides: [isize; 2] = [4, 8];
        let sound = PyArrayInterface {
            two: 2,
            nd: 2,
            typekind: b'f',
            itemsize: 4,
            flags: NOTSWAPPED | WRITEABLE,
            shape: shape.as_ptr(),
            strides: strides.as_ptr(),
            data: 4096 as *mut c_void,
            descr: std::ptr::null_mut(),
        };
        attached(|py| {
            let read = |info: PyArrayInterface| array_struct(py, &info).map(|t| described(&t));
            let strided = (
                4096,
                "float32".to_owned(),
                vec![2, 3],
                vec![4, 8],
                false,
                false,
            );
            assert_eq!(read(PyArrayInterface { ..sound }).ok(), Some(strided));
            // without WRITEABLE read-only, without NOTSWAPPED byte-swapped
            let readonly = (
                4096,
                "float32".to_owned(),
                vec![2, 3],
                vec![4, 8],
                true,
                false,
            );
            assert_eq!(
                read(PyArrayInterface {
                    flags: NOTSWAPPED,
                    ..sound
                })
                .ok(),
                Some(readonly)
            );
            let swapped = (
                4096,
                "float32".to_owned(),
                vec![2, 3],
                vec![4, 8],
                false,
                true,
            );
            assert_eq!(
                read(PyArrayInterface {
                    flags: WRITEABLE,
                    ..sound
                })
                .ok(),
                Some(swapped)
            );
            // no strides: C order; no dimensions: no shape or strides read
            let strides = std::ptr::null();
            let c_order = (
                4096,
                "float32".to_owned(),
                vec![2, 3],
                vec![12, 4],
                false,
                false,
            );
            assert_eq!(
                read(PyArrayInterface { strides, ..sound }).ok(),
                Some(c_order)
            );
            let shape = std::ptr::null();
            let scalar = (4096, "float32".to_owned(), vec![], vec![], false, false);
            assert_eq!(
                read(PyArrayInterface {
                    nd: 0,
                    shape,
                    strides,
                    ..sound
                })
                .ok(),
                Some(scalar)
            );
            let lie = |info: PyArrayInterface| refusal(read(info));
            let value = |msg: &str| ("ValueError", msg.to_owned());
            assert_eq!(
                lie(PyArrayInterface { two: 3, ..sound }),
                value("__array_struct__ is not a PyArrayInterface (two != 2)")
            );
            assert_eq!(
                lie(PyArrayInterface { nd: -1, ..sound }),
                value("__array_struct__ nd -1 is negative")
            );
            assert_eq!(
                lie(PyArrayInterface { shape, ..sound }),
                value("__array_struct__ has no shape")
            );
            assert_eq!(
                lie(PyArrayInterface {
                    itemsize: 0,
                    ..sound
                }),
                value("__array_struct__ itemsize 0")
            );
        });
    }
}
