//! Exporters to numpy's array interface (`__array_interface__`, version 3, and the C-level
//! `__array_struct__`) for host memory, and to the CUDA array interface (`__cuda_array_interface__`,
//! version 3) for CUDA memory. Strides are in bytes and type strings carry the byte order, so
//! every layout but memory behind suboffsets is described as it is; for that, the array interface
//! names a read-only copy (an object with the buffer protocol) as its data.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::error::{Error, Result};
use crate::ffi::python::{self, PyObject};
use crate::ffi::{PyArrayInterface, array_struct_flags};
use crate::tensor::{Device, Owner, Tensor};

/// Where an array interface's consumer finds the elements.
pub enum Data<'py> {
    /// At the tensor's address, kept alive by the object the interface belongs to.
    Address,
    /// In this object's buffer (a copy of memory the interface can't describe in place).
    Buffer(Bound<'py, PyAny>),
}

/// The keys and values both array interfaces share: shape, typestr, strides (None when
/// C-contiguous, as the interfaces say), version 3.
fn common_fields<'py>(py: Python<'py>, tensor: &Tensor) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    let layout = tensor.layout();
    dict.set_item("shape", PyTuple::new(py, layout.shape())?)?;
    dict.set_item("typestr", tensor.dtype().typestr(tensor.swapped()))?;
    if layout.is_c_contiguous() {
        dict.set_item("strides", py.None())?;
    } else {
        dict.set_item("strides", PyTuple::new(py, layout.byte_strides())?)?;
    }
    dict.set_item("version", 3)?;
    Ok(dict)
}

/// `__array_interface__` of a host tensor: its address and read-only flag, or (for a copy) the
/// object whose buffer holds it.
pub fn array_interface<'py>(
    py: Python<'py>,
    tensor: &Tensor,
    data: Data<'py>,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = common_fields(py, tensor)?;
    match data {
        Data::Address => {
            dict.set_item("data", (tensor.data() as usize, tensor.readonly()))?;
        }
        Data::Buffer(holder) => dict.set_item("data", holder)?,
    }
    Ok(dict)
}

/// `__cuda_array_interface__` of CUDA memory, with the stream its consumer must order its work
/// after (None: the data is ready).
pub fn cuda_array_interface<'py>(py: Python<'py>, tensor: &Tensor) -> PyResult<Bound<'py, PyDict>> {
    let dict = common_fields(py, tensor)?;
    dict.set_item("data", (tensor.data() as usize, tensor.readonly()))?;
    dict.set_item("stream", ready_on(tensor))?;
    Ok(dict)
}

/// The stream on which a CUDA tensor's data is ready, for the CUDA array interface's `stream`:
/// a CUDA array interface producer's own; for a DLPack producer's, the legacy default stream (1),
/// since we asked it with `stream=None`, which DLPack defines as that stream; none for copies we
/// made, which were complete before we handed them out.
fn ready_on(tensor: &Tensor) -> Option<i64> {
    match tensor.owner() {
        Owner::Legacy(_) | Owner::Versioned(_) => Some(1),
        _ => tensor.stream().map(|s| s as i64),
    }
}

/// Whether the CUDA array interface describes this tensor's memory (CUDA or managed memory).
pub fn is_cuda(tensor: &Tensor) -> bool {
    use dlpack_core::abi::device_type::{CUDA, CUDA_MANAGED};
    match tensor.device() {
        Device::Known(device) => matches!(device.device_type, CUDA | CUDA_MANAGED),
        Device::Unresolved { .. } => true, // CUDA memory whose device the driver couldn't name
    }
}

/// One `__array_struct__` capsule's memory: the interface numpy reads, and the reference that
/// keeps the tensor (shape and strides included) alive while the capsule lives (and the
/// interface's `descr`, when it has one, its own). The interface comes first: the capsule's
/// pointer is read as a `PyArrayInterface *`.
#[repr(C)]
struct ArrayStruct {
    #[allow(
        dead_code,
        reason = "read by the consumer through the capsule's pointer"
    )]
    interface: PyArrayInterface,
    holder: *mut PyObject,
}

/// `__array_struct__` of a host tensor DLPack-style memory can describe in place (not behind
/// suboffsets), held by `holder`: a capsule of numpy's `PyArrayInterface`, whose shape and
/// strides point into the tensor's layout. `descr`: the numpy dtype of an element type the
/// type kind can't name (ml_dtypes' bfloat16 is "V", 2 bytes, without it), so that numpy (and
/// `jnp.asarray`, which reads through numpy) makes arrays of that type.
///
/// # Safety
/// `holder` keeps `tensor` alive and unchanged for as long as it lives.
pub unsafe fn array_struct<'py>(
    holder: &Bound<'py, PyAny>,
    tensor: &Tensor,
    descr: Option<Bound<'py, PyAny>>,
) -> Result<Bound<'py, PyAny>> {
    if tensor.indirect() {
        return Err(Error::buffer(
            "memory behind suboffsets has no __array_struct__ (its __array_interface__ is a copy)",
        ));
    }
    let layout = tensor.layout();
    let itemsize = tensor.dtype().itemsize();
    let unit = tensor.dtype().swap_unit().max(1) as i64; // what alignment is counted in
    let aligned = (tensor.data() as usize as i64) % unit == 0
        && layout.byte_strides().iter().all(|s| s % unit == 0);
    let mut flags = 0;
    let mut set = |bit, on: bool| flags |= if on { bit } else { 0 };
    set(array_struct_flags::CONTIGUOUS, layout.is_c_contiguous());
    set(array_struct_flags::FORTRAN, layout.is_f_contiguous());
    set(array_struct_flags::ALIGNED, aligned);
    set(array_struct_flags::NOTSWAPPED, !tensor.swapped());
    set(array_struct_flags::WRITEABLE, !tensor.readonly());
    set(array_struct_flags::HAS_DESCR, descr.is_some());
    let ndim = layout.ndim();
    let (shape, strides) = if ndim == 0 {
        (std::ptr::null(), std::ptr::null())
    } else {
        // i64 is isize on the 64-bit targets we build for (checked in `export::buffer`).
        (
            layout.shape().as_ptr().cast::<isize>(),
            layout.byte_strides().as_ptr().cast::<isize>(),
        )
    };
    let allocation = Box::new(ArrayStruct {
        interface: PyArrayInterface {
            two: 2,
            nd: ndim as i32,
            typekind: tensor.dtype().typekind(),
            itemsize: itemsize as i32,
            flags,
            shape,
            strides,
            data: tensor.data(),
            // The allocation's own reference, released with it.
            descr: descr.map_or(std::ptr::null_mut(), Bound::into_ptr),
        },
        holder: holder.clone().into_ptr(),
    });
    let pointer = Box::into_raw(allocation);
    // SAFETY: we hold the GIL (`holder` proves it); the capsule owns the allocation, which its
    // destructor frees (with the holder reference) exactly once; numpy asks for the pointer
    // under the capsule's name, none, as numpy names its own.
    let capsule = unsafe { python::capsule_new_unnamed(pointer.cast(), free_array_struct) };
    if capsule.is_null() {
        let err = PyErr::fetch(holder.py());
        // SAFETY: no capsule owns the allocation: it is ours to free, once; we hold the GIL.
        unsafe { drop_array_struct(pointer) };
        return Err(Error::Python(err));
    }
    // SAFETY: a new reference to a live capsule.
    Ok(unsafe { Bound::from_owned_ptr(holder.py(), capsule) })
}

/// Free an `ArrayStruct` and release its holder.
///
/// # Safety
/// `pointer` came from `array_struct`'s `Box::into_raw` and is freed once; the calling thread
/// holds the GIL.
unsafe fn drop_array_struct(pointer: *mut ArrayStruct) {
    // SAFETY: `pointer` came from `Box::into_raw` in `array_struct` and is freed once (this
    // function's contract).
    let allocation = unsafe { Box::from_raw(pointer) };
    // SAFETY: the reference the allocation held, given up once (it is freed once, this
    // function's contract); the calling thread holds the GIL (the contract too).
    unsafe { python::decref(allocation.holder) };
    if !allocation.interface.descr.is_null() {
        // SAFETY: the allocation's own reference to its dtype, given up once, as the holder's.
        unsafe { python::decref(allocation.interface.descr) };
    }
}

/// The `__array_struct__` capsule's destructor.
unsafe extern "C" fn free_array_struct(capsule: *mut PyObject) {
    // A panic must not unwind into C; none is expected.
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: CPython calls a capsule's destructor holding the GIL, with the live capsule:
        // ours, unnamed, so a null name is its own.
        let pointer = unsafe { python::capsule_pointer(capsule, std::ptr::null()) };
        if pointer.is_null() {
            // SAFETY: CPython calls a capsule's destructor holding the GIL.
            unsafe { python::clear_error() };
            return;
        }
        // SAFETY: our capsule's pointer is the `ArrayStruct` `array_struct` boxed; the capsule
        // is dying, so it is freed once, and CPython holds the GIL here.
        unsafe { drop_array_struct(pointer.cast::<ArrayStruct>()) };
    });
}
