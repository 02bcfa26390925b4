//! Importer for DLPack itself: `__dlpack__` producers and raw `"dltensor"` /
//! `"dltensor_versioned"` capsules.
//!
//! Taking a capsule renames it `"used_..."` (so nobody else consumes it) and moves its managed
//! tensor into an `Owner`, whose drop calls the producer's deleter exactly once.

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCapsule, PyDict, PyTuple};
use pyo3::{PyTypeInfo, intern};

use super::protocols::ExchangeApi;
use crate::error::{Error, Result};
use crate::ffi::python;
use crate::ffi::{CAPSULE_LEGACY, CAPSULE_LEGACY_USED, CAPSULE_VERSIONED, CAPSULE_VERSIONED_USED};
use crate::tensor::{Device, Managed, Owner, Storage, Tensor};
use dlpack_core::abi::DLManagedTensor;
use dlpack_core::abi::DLManagedTensorVersioned;
use dlpack_core::abi::DLPACK_MAJOR_VERSION;
use dlpack_core::abi::DLPACK_MINOR_VERSION;
use dlpack_core::abi::DLTensor;
use dlpack_core::abi::FLAG_READ_ONLY;
use dlpack_core::dtype::DType;
use dlpack_core::layout;
use dlpack_core::layout::Layout;

/// Call a producer's `__dlpack__` method (newest protocol first, then the pre-versioning call
/// for old producers that don't take `max_version`) and import the capsule. `stream` is
/// forwarded as is.
pub fn import_producer(
    method: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
) -> Result<Tensor> {
    let py = method.py();
    let max_version = || PyTuple::new(py, [DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION]);
    let kwargs = match stream {
        // The common call's keywords never change: build them once. (Python unpacks a kwargs
        // dict into the callee's own arguments, so sharing it is safe.)
        None => {
            static PLAIN: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
            PLAIN
                .get_or_try_init(py, || -> PyResult<_> {
                    let kwargs = PyDict::new(py);
                    kwargs.set_item("max_version", max_version()?)?;
                    Ok(kwargs.unbind())
                })?
                .bind(py)
                .clone()
        }
        Some(stream) => {
            let kwargs = PyDict::new(py);
            kwargs.set_item(intern!(py, "stream"), stream)?;
            kwargs.set_item(intern!(py, "max_version"), max_version()?)?;
            kwargs
        }
    };
    let capsule = match method.call((), Some(&kwargs)) {
        Ok(capsule) => capsule,
        // A producer older than `max_version` raises a plain TypeError at the keyword; a
        // subclass (pyarrow's ArrowTypeError) is a refusal of the data, which the legacy call
        // would only repeat (with a deprecation warning).
        Err(err)
            if err
                .get_type(py)
                .is(py.get_type::<pyo3::exceptions::PyTypeError>()) =>
        {
            let legacy = PyDict::new(py);
            if let Some(stream) = stream {
                legacy.set_item(intern!(py, "stream"), stream)?;
            }
            method.call((), Some(&legacy)).map_err(|_| err)?
        }
        Err(err) => return Err(err.into()),
    };
    import_capsule(&capsule)
}

/// Import host memory through a producer's DLPack C exchange API, skipping its Python
/// `__dlpack__`. `None` sends the caller down the Python path: when the producer fails (that
/// path gives the error, or a fallback), and for device memory, which needs the stream
/// handshake only `__dlpack__` has.
///
/// # Safety
/// `api` is the exchange API published by `obj`'s type, whose functions take its objects.
pub unsafe fn import_exchange_api(obj: &Bound<'_, PyAny>, api: ExchangeApi) -> Option<Tensor> {
    let export = api.table().managed_tensor_from_py_object_no_sync?;
    let mut managed: *mut DLManagedTensorVersioned = std::ptr::null_mut();
    // SAFETY: the producer's function (per the contract), called with an object of its type and
    // an out slot.
    let status = unsafe { export(obj.as_ptr().cast(), &mut managed) };
    if status != 0 || managed.is_null() {
        // SAFETY: the producer may have set an exception; the Python path reports its own. We
        // hold the GIL (`obj` proves it).
        unsafe { python::clear_error() };
        return None;
    }
    let managed = NonNull::new(managed)?;
    // SAFETY: on success the producer handed us ownership of a valid managed tensor.
    let tensor = unsafe { import_versioned(managed) }.ok()?;
    let host = tensor.device().get().is_ok_and(|d| d.is_host());
    host.then_some(tensor)
}

/// Whether `obj` is a PyCapsule (of any name).
pub fn is_capsule(obj: &Bound<'_, PyAny>) -> bool {
    PyCapsule::is_type_of(obj)
}

/// Take ownership of the managed tensor in a DLPack capsule and describe it.
pub fn import_capsule(capsule: &Bound<'_, PyAny>) -> Result<Tensor> {
    if !is_capsule(capsule) {
        return Err(Error::type_(format!(
            "__dlpack__ returned {}, not a PyCapsule",
            super::array_interface::type_name(capsule)
        )));
    }
    let ptr = capsule.as_ptr();
    // SAFETY: `ptr` is a live capsule, and we hold the GIL (`capsule` proves it).
    let name = unsafe { python::capsule_name(ptr) };
    if name.is_null() {
        // SAFETY: clears a possible error from GetName; we hold the GIL.
        unsafe { python::clear_error() };
        return Err(Error::type_(
            "a PyCapsule without a name is not a DLPack capsule",
        ));
    }
    // SAFETY: the capsule's name is a NUL-terminated string that lives as long as the capsule.
    let name = unsafe { CStr::from_ptr(name) };
    let versioned = if name == CAPSULE_VERSIONED {
        true
    } else if name == CAPSULE_LEGACY {
        false
    } else if name == CAPSULE_VERSIONED_USED || name == CAPSULE_LEGACY_USED {
        return Err(Error::value("this DLPack capsule was already consumed"));
    } else {
        return Err(Error::type_(format!(
            "a PyCapsule named {name:?} is not a DLPack capsule"
        )));
    };
    let (current, used) = if versioned {
        (CAPSULE_VERSIONED, CAPSULE_VERSIONED_USED)
    } else {
        (CAPSULE_LEGACY, CAPSULE_LEGACY_USED)
    };
    // SAFETY: `ptr` is a live capsule whose name matches, so GetPointer returns the managed
    // tensor (never null for a valid DLPack capsule); we hold the GIL.
    let managed = unsafe { python::capsule_pointer(ptr, current.as_ptr()) };
    let Some(managed) = NonNull::new(managed) else {
        return Err(PyErr::fetch(capsule.py()).into());
    };
    // Renaming marks it consumed, as the protocol asks.
    // SAFETY: `ptr` is a live capsule, and we hold the GIL (`capsule` proves it).
    if !unsafe { python::capsule_rename(ptr, used) } {
        return Err(PyErr::fetch(capsule.py()).into());
    }
    if versioned {
        // SAFETY: the capsule held a versioned managed tensor, now ours alone.
        unsafe { import_versioned(managed.cast()) }
    } else {
        let managed = managed.cast::<DLManagedTensor>();
        // SAFETY: the capsule held a legacy managed tensor, now ours alone (renamed "used_").
        let owner = Owner::Legacy(unsafe { Managed::take(managed) });
        // SAFETY: the capsule's legacy managed tensor stays readable until its deleter runs,
        // which only `owner`, alive here, calls.
        let tensor = unsafe { (*managed.as_ptr()).dl_tensor };
        // SAFETY: the producer's tensor, valid while the owner keeps the managed tensor.
        unsafe { describe(&tensor, false, owner) }
    }
}

/// Take ownership of a producer's versioned managed tensor (from a capsule or the C exchange
/// API) and describe it; its deleter is called when the description goes, or on error now.
///
/// # Safety
/// `managed` is a valid `DLManagedTensorVersioned` whose deleter nobody else will call.
pub unsafe fn import_versioned(managed: NonNull<DLManagedTensorVersioned>) -> Result<Tensor> {
    // From here on the owner calls the deleter, on success or on any error below.
    // SAFETY: `managed` is a valid managed tensor whose deleter nobody else will call (this
    // function's contract), as `take` asks.
    let owner = Owner::Versioned(unsafe { Managed::take(managed) });
    // SAFETY: per the contract, the managed tensor is readable until the deleter runs.
    let m = unsafe { &*managed.as_ptr() };
    let (version, flags, tensor) = (m.version, m.flags, m.dl_tensor);
    if version.major != DLPACK_MAJOR_VERSION {
        return Err(Error::buffer(format!(
            "DLPack major version {} is not supported (this is DLPack {}.{})",
            version.major, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION
        )));
    }
    // SAFETY: the producer's tensor, valid while the owner keeps the managed tensor.
    unsafe { describe(&tensor, flags & FLAG_READ_ONLY != 0, owner) }
}

/// Validate a producer's `DLTensor` and describe it. On error the owner (and so the producer's
/// deleter) is dropped.
///
/// # Safety
/// `t` is a producer's `DLTensor` that stays valid while `owner` lives: its shape and (when not
/// null) strides have `ndim` entries.
unsafe fn describe(t: &DLTensor, readonly: bool, owner: Owner) -> Result<Tensor> {
    let ndim = dimensions(t.ndim, t.shape.is_null())?;
    let dtype = DType::from_dlpack(t.dtype)?;
    // SAFETY: per the contract; not null when `ndim > 0` (checked by `dimensions`), not read
    // when 0.
    let shape = unsafe { dlpack_core::abi::c_array(t.shape, ndim) };
    // SAFETY: non-null strides (checked) have `ndim` entries while `owner` lives (this
    // function's contract), as it does through this call.
    let strides = (ndim > 0 && !t.strides.is_null())
        .then(|| unsafe { dlpack_core::abi::c_array(t.strides, ndim) });
    let layout = layout_of(dtype, shape, strides)?;
    let data = first_element(t.data, t.byte_offset, &layout)?;
    let storage = Storage {
        data,
        device: Device::Known(t.device),
        dtype,
        readonly,
        swapped: false,
        indirect: false,
        stream: None,
    };
    // SAFETY: the producer's word, which nothing can check: per the DLPack contract, `data`
    // (the tensor's data plus its byte offset), shape and strides address its elements in
    // memory of its device while the managed tensor, held by `owner` until its deleter is
    // called, lives; writable unless it is flagged read-only (`readonly`).
    Ok(unsafe { Tensor::new(storage, layout, owner) })
}

/// A `DLTensor`'s dimension count, checked: from 0 to `layout::MAX_NDIM`, with a shape unless
/// it is 0 (a null shape of `ndim > 0` entries would be read).
fn dimensions(ndim: i32, shape_is_null: bool) -> Result<usize> {
    let ndim = usize::try_from(ndim)
        .ok()
        .filter(|&n| n <= layout::MAX_NDIM)
        .ok_or_else(|| Error::buffer(format!("DLPack tensor with ndim {ndim}")))?;
    if ndim > 0 && shape_is_null {
        return Err(Error::buffer("DLPack tensor without a shape"));
    }
    Ok(ndim)
}

/// The layout of a `DLTensor` of `dtype` elements with this shape and element strides (none:
/// C order), checked: a layout that can't be (negative extents, strides whose bytes overflow)
/// is a BufferError.
fn layout_of(dtype: DType, shape: &[i64], strides: Option<&[i64]>) -> Result<Layout> {
    let item = dtype.itemsize() as i64;
    let byte_stride = strides.map(|s| {
        move |k: usize| {
            s[k].checked_mul(item)
                .ok_or_else(|| dlpack_core::error::Error::buffer("DLPack strides overflow"))
        }
    });
    let layout = Layout::build(shape.len(), dtype.itemsize(), |k| shape[k], byte_stride).map_err(
        |e| match e {
            dlpack_core::error::Error::Value(msg) => dlpack_core::error::Error::Buffer(msg),
            other => other,
        },
    )?;
    debug_assert!(
        layout.strides().is_some(),
        "element strides times the item size divide evenly"
    );
    Ok(layout)
}

/// The address of a `DLTensor`'s first element, its data pointer plus its byte offset, checked:
/// an offset that overflows the address space, or a null address for a tensor with elements, is
/// a BufferError.
fn first_element(data: *mut c_void, byte_offset: u64, layout: &Layout) -> Result<*mut c_void> {
    let data = usize::try_from(byte_offset)
        .ok()
        .and_then(|offset| (data as usize).checked_add(offset))
        .ok_or_else(|| Error::buffer("DLPack data pointer + byte_offset overflows"))?
        as *mut c_void;
    Tensor::check_data(data, layout)
        .map_err(|_| Error::buffer("DLPack tensor with a null data pointer"))?;
    Ok(data)
}

/// Capsules met in an embedded interpreter, made here around managed tensors whose deleter
/// counts its calls: which names are taken, how they are renamed, and what producers' calls
/// are retried the old way. The Python suite meets the same through real producers
/// (test_bad_input.py, test_exchange_api.py); these reach them without building the extension.
#[cfg(test)]
mod tests {
    use std::ffi::{CStr, CString, c_void};
    use std::sync::atomic::{AtomicUsize, Ordering};

    use dlpack_core::abi::{
        DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor,
    };
    use pyo3::prelude::*;
    use pyo3::types::{PyCapsule, PyDict};

    use super::super::test_support::{attached, refusal};
    use super::{import_capsule, import_producer};
    use crate::error::Result;
    use crate::tensor::Tensor;

    /// A managed tensor of two int32s at a made-up address (never read), with its shape; the
    /// managed tensor first, so the deleter's pointer is the whole.
    #[repr(C)]
    struct Held<M> {
        managed: M,
        shape: [i64; 1],
        deleted: &'static AtomicUsize,
    }

    fn tensor(shape: *mut i64) -> DLTensor {
        DLTensor {
            data: 0x1000 as *mut c_void,
            device: DLDevice {
                device_type: 1,
                device_id: 0,
            },
            ndim: 1,
            dtype: DLDataType {
                code: 0,
                bits: 32,
                lanes: 1,
            },
            shape,
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        }
    }

    unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
        // SAFETY: made by `Box::into_raw` in `versioned`, and a deleter runs once.
        let held = unsafe { Box::from_raw(managed.cast::<Held<DLManagedTensorVersioned>>()) };
        held.deleted.fetch_add(1, Ordering::SeqCst);
    }

    unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
        // SAFETY: made by `Box::into_raw` in `legacy`, and a deleter runs once.
        let held = unsafe { Box::from_raw(managed.cast::<Held<DLManagedTensor>>()) };
        held.deleted.fetch_add(1, Ordering::SeqCst);
    }

    fn versioned(deleted: &'static AtomicUsize) -> *mut c_void {
        let mut held = Box::new(Held {
            managed: DLManagedTensorVersioned {
                version: DLPackVersion { major: 1, minor: 0 },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags: 0,
                dl_tensor: tensor(std::ptr::null_mut()),
            },
            shape: [2],
            deleted,
        });
        // the shape where the deleter frees it, beside the managed tensor
        held.managed.dl_tensor.shape = held.shape.as_mut_ptr();
        Box::into_raw(held).cast()
    }

    fn legacy(deleted: &'static AtomicUsize) -> *mut c_void {
        let mut held = Box::new(Held {
            managed: DLManagedTensor {
                dl_tensor: tensor(std::ptr::null_mut()),
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_legacy),
            },
            shape: [2],
            deleted,
        });
        // the shape where the deleter frees it, beside the managed tensor
        held.managed.dl_tensor.shape = held.shape.as_mut_ptr();
        Box::into_raw(held).cast()
    }

    /// A capsule of this name (or none) around `pointer`, without a destructor.
    fn capsule<'py>(
        py: Python<'py>,
        pointer: *mut c_void,
        name: Option<&'static CStr>,
    ) -> Bound<'py, PyAny> {
        let name = name.map_or(std::ptr::null(), CStr::as_ptr);
        // SAFETY: a non-NULL pointer and a static name; we are attached.
        let capsule = unsafe { pyo3::ffi::PyCapsule_New(pointer, name, None) };
        // SAFETY: a new reference, non-NULL (PyCapsule_New fails only on a NULL pointer).
        unsafe { Bound::from_owned_ptr(py, capsule) }
    }

    fn name_of(capsule: &Bound<'_, PyAny>) -> String {
        let capsule = capsule.cast::<PyCapsule>().unwrap();
        capsule
            .name()
            .unwrap()
            .map(|n| {
                // SAFETY: the capsule's name, a C string it keeps while it lives.
                unsafe { n.as_cstr() }.to_str().unwrap().to_owned()
            })
            .unwrap_or_default()
    }

    fn described(tensor: &Tensor) -> (usize, Vec<i64>, bool) {
        (
            tensor.data() as usize,
            tensor.layout().shape().to_vec(),
            tensor.readonly(),
        )
    }

    #[test]
    fn capsules_are_taken_once_renamed_and_deleted_once() {
        static VERSIONED: AtomicUsize = AtomicUsize::new(0);
        static LEGACY: AtomicUsize = AtomicUsize::new(0);
        attached(|py| {
            let cases = [
                (
                    capsule(py, versioned(&VERSIONED), Some(c"dltensor_versioned")),
                    &VERSIONED,
                    "used_dltensor_versioned",
                ),
                (
                    capsule(py, legacy(&LEGACY), Some(c"dltensor")),
                    &LEGACY,
                    "used_dltensor",
                ),
            ];
            for (capsule, deleted, used) in cases {
                let tensor = import_capsule(&capsule).ok().unwrap();
                assert_eq!(described(&tensor), (0x1000, vec![2], false));
                assert_eq!(name_of(&capsule), used);
                assert_eq!(
                    refusal(import_capsule(&capsule)),
                    (
                        "ValueError",
                        "this DLPack capsule was already consumed".to_owned()
                    )
                );
                assert_eq!(deleted.load(Ordering::SeqCst), 0);
                drop(tensor);
                assert_eq!(deleted.load(Ordering::SeqCst), 1);
            }
        });
    }

    #[test]
    fn objects_that_arent_dlpack_capsules_are_a_type_error() {
        attached(|py| {
            // never read: a capsule's pointer can't be NULL
            let nothing = 0x8 as *mut c_void;
            let type_error = |msg: &str| ("TypeError", msg.to_owned());
            assert_eq!(
                refusal(import_capsule(&capsule(
                    py,
                    nothing,
                    Some(c"dltensor_other")
                ))),
                type_error("a PyCapsule named \"dltensor_other\" is not a DLPack capsule")
            );
            assert_eq!(
                refusal(import_capsule(&capsule(py, nothing, None))),
                type_error("a PyCapsule without a name is not a DLPack capsule")
            );
            let number = 5_i32.into_pyobject(py).unwrap().into_any();
            assert_eq!(
                refusal(import_capsule(&number)),
                type_error("__dlpack__ returned int, not a PyCapsule")
            );
        });
    }

    #[test]
    fn only_a_plain_type_error_retries_the_call_without_max_version() {
        static DELETED: AtomicUsize = AtomicUsize::new(0);
        attached(|py| {
            let globals = PyDict::new(py);
            let producers = [
                // before max_version: the keyword is a TypeError
                "class Old:",
                "    def __dlpack__(self, stream=None):",
                "        return make()",
                // refuses the data whatever the call, but would answer the old one
                "class Refusing:",
                "    def __dlpack__(self, stream=None, **kwargs):",
                "        if kwargs:",
                "            raise ValueError('refused')",
                "        return make()",
                "class Typed(TypeError):",
                "    pass",
                "class RefusingTyped(Refusing):",
                "    def __dlpack__(self, stream=None, **kwargs):",
                "        if kwargs:",
                "            raise Typed('refused as a type')",
                "        return make()",
            ]
            .join("\n");
            let make = pyo3::types::PyCFunction::new_closure(py, None, None, |args, _| {
                let py = args.py();
                PyResult::Ok(capsule(py, versioned(&DELETED), Some(c"dltensor_versioned")).unbind())
            })
            .unwrap();
            globals.set_item("make", make).unwrap();
            py.run(&CString::new(producers).unwrap(), Some(&globals), None)
                .unwrap();
            let method = |class: &str| {
                let source = CString::new(format!("{class}().__dlpack__")).unwrap();
                py.eval(&source, Some(&globals), None).unwrap()
            };
            let tensor = import_producer(&method("Old"), None).ok().unwrap();
            assert_eq!(described(&tensor), (0x1000, vec![2], false));
            for (class, message) in [
                ("Refusing", "ValueError: refused"),
                ("RefusingTyped", "Typed: refused as a type"),
            ] {
                assert_eq!(
                    refusal(import_producer(&method(class), None)),
                    ("Python", message.to_owned())
                );
            }
            drop(tensor);
            assert_eq!(DELETED.load(Ordering::SeqCst), 1);
        });
    }

    /// A BufferError's message.
    fn buffer_error<T>(result: Result<T>) -> String {
        let (kind, msg) = refusal(result);
        assert_eq!(kind, "BufferError", "{msg}");
        msg
    }

    #[test]
    fn a_dlpack_tensors_dimensions_are_0_to_the_most_with_a_shape_where_there_are_any() {
        let most = dlpack_core::layout::MAX_NDIM as i32;
        assert_eq!(super::dimensions(0, true).unwrap(), 0);
        assert_eq!(super::dimensions(0, false).unwrap(), 0);
        assert_eq!(super::dimensions(1, false).unwrap(), 1);
        assert_eq!(super::dimensions(most, false).unwrap(), most as usize);
        for ndim in [-1, most + 1, i32::MAX, i32::MIN] {
            let msg = buffer_error(super::dimensions(ndim, false));
            assert_eq!(msg, format!("DLPack tensor with ndim {ndim}"));
        }
        for ndim in [1, most] {
            let msg = buffer_error(super::dimensions(ndim, true));
            assert_eq!(msg, "DLPack tensor without a shape");
        }
    }

    #[test]
    fn a_dlpack_tensors_layout_is_its_shape_and_element_strides_in_bytes() {
        let f32 = dlpack_core::dtype::DType::from_dlpack(DLDataType {
            code: 2,
            bits: 32,
            lanes: 1,
        })
        .unwrap();
        let c = super::layout_of(f32, &[2, 3], None).unwrap();
        assert_eq!((c.shape(), c.byte_strides()), (&[2, 3][..], &[12, 4][..]));
        let strided = super::layout_of(f32, &[2, 3], Some(&[1, 2])).unwrap();
        assert_eq!(strided.byte_strides(), &[4, 8]);
        let backwards = super::layout_of(f32, &[3], Some(&[-1])).unwrap();
        assert_eq!(backwards.byte_strides(), &[-4]);
        let scalar = super::layout_of(f32, &[], None).unwrap();
        assert_eq!((scalar.ndim(), scalar.numel()), (0, 1));
        // An element stride whose bytes don't fit an i64 is refused, not wrapped.
        let over = buffer_error(super::layout_of(f32, &[2], Some(&[i64::MAX / 2])));
        assert_eq!(over, "DLPack strides overflow");
        let far = super::layout_of(f32, &[2], Some(&[1 << 40])).unwrap();
        assert_eq!(far.byte_strides(), &[1 << 42]);
        // A negative extent is the layout's ValueError, served as a BufferError.
        buffer_error(super::layout_of(f32, &[-1], None));
    }

    #[test]
    fn a_dlpack_tensors_first_element_is_its_data_plus_its_offset() {
        let f32 = dlpack_core::dtype::DType::from_dlpack(DLDataType {
            code: 2,
            bits: 32,
            lanes: 1,
        })
        .unwrap();
        let some = super::layout_of(f32, &[2], None).unwrap();
        let none = super::layout_of(f32, &[0], None).unwrap();
        let at = |data: usize, offset: u64, layout| {
            super::first_element(data as *mut c_void, offset, layout).map(|p| p as usize)
        };
        assert_eq!(at(0x1000, 0, &some).unwrap(), 0x1000);
        assert_eq!(at(0x1000, 64, &some).unwrap(), 0x1040);
        assert_eq!(at(usize::MAX - 8, 8, &some).unwrap(), usize::MAX);
        let over = buffer_error(at(usize::MAX - 8, 9, &some));
        assert_eq!(over, "DLPack data pointer + byte_offset overflows");
        buffer_error(at(0x1000, u64::MAX, &some));
        let null = buffer_error(at(0, 0, &some));
        assert_eq!(null, "DLPack tensor with a null data pointer");
        // No element, nothing read: a null pointer describes it.
        assert_eq!(at(0, 0, &none).unwrap(), 0);
        assert_eq!(at(0, 4, &some).unwrap(), 4);
    }
}
