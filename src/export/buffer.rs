//! Exporter to the buffer protocol (PEP 3118), behind `DLPackObject`'s `bf_getbuffer`.
//!
//! Host memory is lent as it is: the shape and byte strides point into the tensor's own layout
//! and the format is a static string, so a view allocates nothing. Byte strides of any value
//! and the other byte order are expressible (PEP 3118 strides are in bytes; formats carry `<` and
//! `>`). What is not: a consumer that asks for contiguous memory the tensor isn't, and memory
//! reached through suboffsets (which our description doesn't keep). Such a consumer gets a
//! read-only, C-ordered copy if it only reads, and a BufferError if it wants to write (a copy
//! would silently drop its writes). Device memory is a BufferError naming the device.

use std::ffi::{c_char, c_int};

use crate::error::{Error, Result};
use crate::ffi::python::{self, Py_buffer, PyObject};
use crate::tensor::{Device, Tensor};

/// How a view request is served.
pub enum Lend {
    /// The tensor's own memory.
    InPlace,
    /// A read-only C-ordered copy, for this reason.
    Copy(&'static str),
}

/// Whether `flags` (a consumer's `PyBUF_*` request) can be served from `tensor` in place, by a
/// copy, or not at all.
#[inline(always)]
pub fn lend(tensor: &Tensor, flags: c_int) -> Result<Lend> {
    match tensor.device() {
        Device::Known(device) if device.is_host() => {}
        Device::Known(device) => {
            return Err(Error::buffer(format!(
                "{} memory can't be lent through the buffer protocol, which is for host \
                 memory: use DLPack or __cuda_array_interface__, or copy it to the host with \
                 __dlpack__(dl_device=(1, 0))",
                device.name()
            )));
        }
        Device::Unresolved { .. } => {
            return Err(Error::buffer(
                "CUDA memory can't be lent through the buffer protocol, which is for host memory",
            ));
        }
    }
    if flags & python::PyBUF_FORMAT != 0 && tensor.dtype().buffer_format(false).is_none() {
        return Err(Error::buffer(format!(
            "{} has no buffer protocol (PEP 3118) format, so a consumer reading the format \
             would misread its bytes: use DLPack (torch.from_dlpack, jax.numpy.from_dlpack) or \
             __array_interface__",
            tensor.dtype().name()
        )));
    }
    let writable = flags & python::PyBUF_WRITABLE != 0;
    if writable && tensor.readonly() {
        return Err(Error::buffer(
            "the memory is read-only: a writable buffer of it can't be lent",
        ));
    }
    let reason = if tensor.indirect() {
        Some("memory reached through suboffsets is lent as a copy")
    } else {
        contiguity_missing(tensor, flags)
    };
    match reason {
        None => Ok(Lend::InPlace),
        Some(reason) if writable => Err(Error::buffer(format!(
            "{reason}, and a writable buffer can't be a copy"
        ))),
        Some(reason) => Ok(Lend::Copy(reason)),
    }
}

/// Why the layout doesn't give what `flags` ask, if it doesn't.
fn contiguity_missing(tensor: &Tensor, flags: c_int) -> Option<&'static str> {
    let layout = tensor.layout();
    let asks = |bits: c_int| flags & bits == bits;
    // Without strides, or asking for C order, the consumer reads the elements in C order.
    let c_order = !asks(python::PyBUF_STRIDES) || asks(python::PyBUF_C_CONTIGUOUS);
    if c_order && !layout.is_c_contiguous() {
        return Some("the memory is not C-contiguous, as the consumer asked");
    }
    if asks(python::PyBUF_F_CONTIGUOUS) && !layout.is_f_contiguous() {
        return Some("the memory is not Fortran-contiguous, as the consumer asked");
    }
    if asks(python::PyBUF_ANY_CONTIGUOUS) && !layout.is_c_contiguous() && !layout.is_f_contiguous()
    {
        return Some("the memory is not contiguous, as the consumer asked");
    }
    None
}

/// Fill `view` with `tensor`'s memory as `flags` ask (`lend` said `InPlace`), for `owner`, which
/// holds the tensor: the view takes a reference to it.
///
/// # Safety
/// `view` is writable; `owner` is a live object keeping `tensor` alive and unchanged; the
/// calling thread holds the GIL.
pub unsafe fn fill(view: *mut Py_buffer, owner: *mut PyObject, tensor: &Tensor, flags: c_int) {
    let asks = |bits: c_int| flags & bits == bits;
    let layout = tensor.layout();
    let ndim = layout.ndim();
    let itemsize = tensor.dtype().itemsize();
    // An empty tensor may have no address; a buffer should, aligned for its items (consumers
    // may check).
    let buf = if tensor.data().is_null() {
        empty_elements().as_ptr().cast()
    } else {
        tensor.data()
    };
    // The layout keeps shape and byte strides as i64, which is Py_ssize_t on the 64-bit
    // platforms we build for (checked below), so the view points into it.
    let (shape, strides) = if ndim == 0 {
        (std::ptr::null_mut(), std::ptr::null_mut())
    } else {
        (
            layout.shape().as_ptr().cast_mut().cast::<isize>(),
            layout.byte_strides().as_ptr().cast_mut().cast::<isize>(),
        )
    };
    // SAFETY: per the contract; this reference is the one `PyBuffer_Release` gives back.
    unsafe { python::incref(owner) };
    let filled = Py_buffer {
        buf,
        obj: owner,
        len: tensor.nbytes() as isize,
        itemsize: itemsize as isize,
        readonly: c_int::from(tensor.readonly()),
        // Without a shape the consumer sees one run of bytes (as CPython's memoryview
        // says: one dimension, `len` bytes).
        ndim: if asks(python::PyBUF_ND) {
            ndim as c_int
        } else {
            1
        },
        // `lend` refused a format request of a type that has none.
        format: match tensor.dtype().buffer_format(tensor.swapped()) {
            Some(format) if asks(python::PyBUF_FORMAT) => format.as_ptr().cast_mut(),
            _ => std::ptr::null_mut::<c_char>(),
        },
        shape: if asks(python::PyBUF_ND) {
            shape
        } else {
            std::ptr::null_mut()
        },
        strides: if asks(python::PyBUF_STRIDES) {
            strides
        } else {
            std::ptr::null_mut()
        },
        suboffsets: std::ptr::null_mut(),
        internal: std::ptr::null_mut(),
    };
    // SAFETY: per the contract, `view` is writable.
    unsafe { view.write(filled) };
}

const _: () = assert!(
    size_of::<isize>() == size_of::<i64>(),
    "buffer views point into i64 layouts: a 64-bit target is needed"
);

/// Where an empty export's elements are, for consumers that want an address whatever the size
/// (Arrow's check a buffer's alignment even when it is empty): aligned for every element type
/// (Arrow asks 64 bytes at most), never read or written (there are no elements).
pub fn empty_elements() -> std::ptr::NonNull<u8> {
    std::ptr::NonNull::from(&EMPTY).cast()
}

#[repr(C, align(64))]
struct Empty([u8; 64]);

static EMPTY: Empty = Empty([0; 64]);
