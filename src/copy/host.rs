//! Copies between tensors in host memory: turns `Tensor` descriptions into the core's strided
//! engine's work (byte strides, byte swapping, broadcasting, overlap staging) and runs it
//! without the GIL.

use std::ffi::c_void;

use dlpack_core::copy::cpu::{PARALLEL_THRESHOLD, Strided, copy_strided, may_overlap};
use dlpack_core::layout::broadcast_strides;
use pyo3::prelude::*;

use crate::error::{Error, Result};
use crate::ffi::python;
use crate::tensor::{Owner, Tensor};
use dlpack_core::layout::Layout;
use dlpack_core::memory::AlignedBuffer;

/// Below this many bytes, releasing and retaking the GIL costs more than the copy.
const DETACH_THRESHOLD: usize = 64 * 1024;

fn check_host(tensor: &Tensor) -> Result<()> {
    let device = tensor.device().get()?;
    if !device.is_host() {
        return Err(Error::runtime(format!(
            "internal error: device memory (DLPack device type {}) was sent to the CPU engine",
            device.device_type
        )));
    }
    Ok(())
}

fn strided(ptr: *mut c_void, shape: &[i64], byte_strides: &[i64]) -> Strided {
    Strided {
        ptr: ptr.cast(),
        shape: shape.iter().map(|&n| n as usize).collect(),
        strides: byte_strides.iter().map(|&s| s as isize).collect(),
    }
}

/// Copy `src` into `dst` with the strided engine, without the GIL when it is worth it.
///
/// # Safety
/// As `copy_strided` requires: every byte the views address is readable (`src`) or writable
/// (`dst`) host memory for the call, and the two share no bytes (or are the same view, for a
/// byte swap in place).
unsafe fn run(py: Python<'_>, dst: &Strided, src: &Strided, itemsize: usize, swap: Option<usize>) {
    let bytes = dst.shape.iter().product::<usize>() * itemsize;
    if bytes < DETACH_THRESHOLD {
        // SAFETY: what the views address is readable (`src`) or writable (`dst`) host memory
        // for the call (this function's contract), all `copy_strided` asks.
        unsafe { copy_strided(dst, src, itemsize, swap) }
    } else {
        let job = SendJob { dst, src };
        py.detach(move || {
            let job = job;
            // SAFETY: per the contract; the memory is not Python's to move while detached.
            unsafe { copy_strided(job.dst, job.src, itemsize, swap) }
        })
    }
}

/// The bytes of a copy that is one `memmove`: both sides C-contiguous with the same shape, in
/// the same byte order, read directly, and small enough that the engine would copy them with
/// one thread and ordinary stores anyway (below its parallel threshold); `None` otherwise.
fn same_dense_layout(dst: &Tensor, src: &Tensor) -> Option<usize> {
    let (d, s) = (dst.layout(), src.layout());
    let plain = d.is_c_contiguous() && s.is_c_contiguous() && !src.indirect();
    if !plain || dst.swapped() != src.swapped() || d.shape() != s.shape() {
        return None;
    }
    let bytes = usize::try_from(dst.nbytes()).ok()?;
    (bytes < PARALLEL_THRESHOLD).then_some(bytes)
}

/// An address handed to the thread that copies without the GIL.
#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: it only carries the address of memory that outlives the copy, which the caller
// guarantees no one else writes meanwhile.
unsafe impl Send for SendPtr {}

/// The two views of one copy, handed to the thread that runs it without the GIL.
struct SendJob<'a> {
    dst: &'a Strided,
    src: &'a Strided,
}
// SAFETY: the views only carry addresses of memory that outlives the call; the engine reads
// `src` and writes `dst`, which the caller guarantees do not overlap.
unsafe impl Send for SendJob<'_> {}

/// A fresh, writable, C-ordered, native-byte-order copy of a host tensor in memory we own.
pub fn to_c_order(py: Python<'_>, tensor: &Tensor) -> Result<Tensor> {
    check_host(tensor)?;
    let nbytes = tensor.dense_bytes()?;
    let buffer = AlignedBuffer::new(nbytes)?;
    let layout = tensor.c_order_layout()?;
    // SAFETY: the buffer we just allocated holds `nbytes` bytes, the tensor's elements in C
    // order (`layout`, from the tensor's shape and item size), and nothing else uses it; the
    // tensor is host memory (checked above).
    unsafe { write_in_layout(py, tensor, buffer.as_ptr().cast(), nbytes, &layout)? };
    Tensor::host_allocation(buffer, tensor.dtype(), layout)
}

/// Write a host tensor's elements to `dst` in C order and native byte order, as if all were read
/// before any is written: `dst` may overlap the tensor's memory (the elements are then copied
/// into a buffer of our own first).
///
/// # Safety
/// `dst` is writable memory of `nbytes` bytes, the tensor's element count times its item size,
/// which no one else reads or writes during the call (it may share bytes with the tensor's).
pub unsafe fn write_c_order(
    py: Python<'_>,
    tensor: &Tensor,
    dst: *mut u8,
    nbytes: usize,
) -> Result<()> {
    check_host(tensor)?;
    let layout = c_order_in(tensor, nbytes, "destination")?;
    let itemsize = tensor.dtype().itemsize();
    let to = strided(dst.cast(), layout.shape(), layout.byte_strides());
    // Rows behind pointers may lie anywhere, so an indirect buffer is always staged.
    if tensor.indirect() || may_overlap(&to, &own_memory(tensor).0, itemsize) {
        let staged = to_c_order(py, tensor)?;
        let from = strided(staged.data(), layout.shape(), layout.byte_strides());
        // SAFETY: `dst` holds `layout`'s elements, writable and ours for the call (our
        // contract); `staged` is our own buffer of the same elements, apart from `dst`.
        unsafe { run(py, &to, &from, itemsize, None) };
        return Ok(());
    }
    // SAFETY: our contract gives `dst`'s `nbytes` writable bytes to this call alone, and they
    // share none with the tensor's (checked just above); `c_order_in` checked they are exactly
    // its elements in C order; the tensor is host memory (checked above).
    unsafe { write_in_layout(py, tensor, dst, nbytes, &layout) }
}

/// `write_c_order` once the C-ordered layout is known (a fresh copy has it already).
///
/// # Safety
/// The tensor is host memory; `layout` is its elements in C order (`Tensor::c_order_layout`);
/// `dst` is writable memory of `nbytes` bytes, exactly that layout's extent, which no one else
/// reads or writes during the call and which shares no bytes with the tensor's.
unsafe fn write_in_layout(
    py: Python<'_>,
    tensor: &Tensor,
    dst: *mut u8,
    nbytes: usize,
    layout: &Layout,
) -> Result<()> {
    let itemsize = tensor.dtype().itemsize();
    let to = strided(dst.cast(), layout.shape(), layout.byte_strides());
    if tensor.indirect() {
        // SAFETY: our contract: `dst` holds `nbytes` writable bytes, ours for the call.
        unsafe { gather_indirect(py, tensor, dst, nbytes)? };
        if tensor.swapped() {
            // Swap in place: the engine reads each element before writing it back.
            // SAFETY: `dst` is ours for the call (our contract), and now filled.
            unsafe { run(py, &to, &to, itemsize, Some(tensor.dtype().swap_unit())) };
        }
    } else {
        let (src, swap) = own_memory(tensor);
        // SAFETY: `dst` holds `layout`'s elements, as many as `src`'s, and is ours for the
        // call (our contract); `src` is the tensor's host memory (our contract), live while its
        // owner is.
        unsafe { run(py, &to, &src, itemsize, swap) };
    }
    Ok(())
}

/// Write C-ordered, native-order elements from `src` into a host tensor's memory, wherever its
/// layout puts them (in its byte order), as if all were read before any is written: `src` may
/// overlap the tensor's memory (it is then copied into a buffer of our own first).
///
/// # Safety
/// `src` holds `nbytes` readable bytes, the tensor's element count times its item size; the
/// tensor's memory is writable and nobody else reads or writes it during the call (`src` may
/// share bytes with it); no two of its elements share bytes.
pub unsafe fn read_c_order(
    py: Python<'_>,
    tensor: &Tensor,
    src: *const u8,
    nbytes: usize,
) -> Result<()> {
    check_host(tensor)?;
    if tensor.indirect() || tensor.readonly() {
        return Err(Error::runtime(
            "internal error: writing into memory that can't take it",
        ));
    }
    let itemsize = tensor.dtype().itemsize();
    let layout = c_order_in(tensor, nbytes, "source")?;
    let from = strided(src.cast_mut().cast(), layout.shape(), layout.byte_strides());
    let (to, swap) = own_memory(tensor);
    let staged;
    let from = if may_overlap(&to, &from, itemsize) {
        staged = AlignedBuffer::new(nbytes)?;
        let copy = strided(
            staged.as_ptr().cast(),
            layout.shape(),
            layout.byte_strides(),
        );
        // SAFETY: `src` is readable for its `nbytes` (our contract); `staged` is a buffer of
        // ours of as many bytes, apart from it.
        unsafe { run(py, &copy, &from, itemsize, None) };
        copy
    } else {
        from
    };
    // SAFETY: per the contract: `from` readable and as large as the tensor's elements (the
    // caller's `src`, or our copy of it where the two overlapped), the tensor's memory writable
    // host memory (checked above) sharing no bytes with `from`.
    unsafe { run(py, &to, &from, itemsize, swap) };
    Ok(())
}

/// The C-ordered layout of the tensor's elements in a buffer of `nbytes` bytes (the caller's
/// `what`, the copy's other side), which must be exactly their size.
fn c_order_in(tensor: &Tensor, nbytes: usize, what: &str) -> Result<Layout> {
    if usize::try_from(tensor.nbytes()).ok() != Some(nbytes) {
        return Err(Error::runtime(format!(
            "internal error: a copy's {what} has the wrong size"
        )));
    }
    tensor.c_order_layout()
}

/// The tensor's own memory as the engine walks it, and the byte swap its elements need.
fn own_memory(tensor: &Tensor) -> (Strided, Option<usize>) {
    let view = strided(
        tensor.data(),
        tensor.layout().shape(),
        tensor.layout().byte_strides(),
    );
    (view, tensor.swapped().then(|| tensor.dtype().swap_unit()))
}

/// Follow a buffer's suboffsets with CPython's own gatherer (it knows the PIL-style rules).
///
/// # Safety
/// `dst` is writable memory of `nbytes` bytes, ours for the call.
unsafe fn gather_indirect(
    py: Python<'_>,
    tensor: &Tensor,
    dst: *mut u8,
    nbytes: usize,
) -> Result<()> {
    let Owner::Buffer { view, .. } = tensor.owner() else {
        return Err(Error::buffer("indirect memory without a buffer view"));
    };
    let len = isize::try_from(nbytes).map_err(|_| Error::value("tensor too large"))?;
    // SAFETY: `view` is a live Py_buffer (the tensor's owner holds it), `dst` has `nbytes`
    // bytes (the contract), which is exactly the view's element count times its item size
    // (checked by the caller); we hold the GIL.
    if !unsafe { python::buffer_to_c_order(dst, &**view, len) } {
        return Err(PyErr::fetch(py).into());
    }
    Ok(())
}

/// Swap the bytes of a host tensor's elements where they are (native <-> non-native order).
///
/// # Safety
/// The tensor's memory is writable host memory nobody else reads or writes meanwhile (a copy
/// of our own).
pub unsafe fn swap_in_place(py: Python<'_>, tensor: &Tensor) {
    let view = strided(
        tensor.data(),
        tensor.layout().shape(),
        tensor.layout().byte_strides(),
    );
    // The engine reads each element before writing it back.
    // SAFETY: `view` addresses the tensor's memory, writable host memory nobody else reads or
    // writes meanwhile (this function's contract); source and destination are the same view.
    unsafe {
        run(
            py,
            &view,
            &view,
            tensor.dtype().itemsize(),
            Some(tensor.dtype().swap_unit()),
        )
    };
}

/// `copyto` between host tensors: checked by `super::copyto` (writable, direct destination,
/// equal dtypes, `src` broadcasts to `dst`'s shape, no element of `dst` shares bytes with
/// another).
pub fn copy_into(py: Python<'_>, dst: &Tensor, src: &Tensor) -> Result<()> {
    if dst.readonly() || dst.indirect() {
        return Err(Error::runtime(
            "internal error: writing into memory that can't take it",
        ));
    }
    if let Some(bytes) = same_dense_layout(dst, src) {
        let (to, from) = (SendPtr(dst.data().cast()), SendPtr(src.data().cast()));
        let copy = move || {
            let (to, from) = (to, from);
            // SAFETY: both tensors' elements are their `bytes` bytes from `data()`, in the same
            // order (C-contiguous, one shape), host memory live while their owners are; `dst`
            // is writable (checked above). `copy` is memmove: where the two share bytes, each
            // element still gets the value it had in `src` before the call.
            unsafe { std::ptr::copy(from.0.cast_const(), to.0, bytes) }
        };
        if bytes < DETACH_THRESHOLD {
            copy();
        } else {
            py.detach(copy);
        }
        return Ok(());
    }
    let shape = dst.layout().shape();
    let itemsize = dst.dtype().itemsize();
    let to = strided(dst.data(), shape, dst.layout().byte_strides());
    let from = strided(src.data(), shape, &broadcast_strides(src.layout(), shape)?);
    // Sources the engine can't read directly, or that share bytes with the destination, are
    // first copied whole into a buffer of our own.
    let staged;
    let (from, from_swapped) = if src.indirect() || may_overlap(&to, &from, itemsize) {
        staged = to_c_order(py, src)?;
        (
            strided(
                staged.data(),
                shape,
                &broadcast_strides(staged.layout(), shape)?,
            ),
            staged.swapped(),
        )
    } else {
        (from, src.swapped())
    };
    let swap = (dst.swapped() != from_swapped).then(|| dst.dtype().swap_unit());
    // SAFETY: both are the tensors' host memory, live while their owners are; `dst` is writable
    // (`super::copyto` checked) and shares no bytes with `from` (a source that might was staged
    // into our own buffer).
    unsafe { run(py, &to, &from, itemsize, swap) };
    Ok(())
}
