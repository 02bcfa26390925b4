//! Copies between tensors in host memory: turns `Tensor` descriptions into the strided engine's
//! work (byte strides, byte swapping, broadcasting, overlap staging) and runs it without the GIL.

use std::ffi::c_void;

use pyo3::prelude::*;

use super::cpu::{Strided, copy_strided, may_overlap};
use crate::error::{Error, Result};
use crate::ffi::python;
use crate::tensor::layout::{SelfOverlap, self_overlap};
use crate::tensor::{AlignedBuffer, Layout, Owner, Tensor};

/// Below this many bytes, releasing and retaking the GIL costs more than the copy.
const DETACH_THRESHOLD: usize = 64 * 1024;

fn check_host(tensor: &Tensor) -> Result<()> {
    let device = tensor.device.get()?;
    if !device.is_host() {
        return Err(Error::Runtime(format!(
            "internal error: device memory (DLPack device type {}) was sent to the CPU engine",
            device.device_type
        )));
    }
    Ok(())
}

fn on_host(tensor: &Tensor) -> Result<bool> {
    Ok(tensor.device.get()?.is_host())
}

fn strided(ptr: *mut c_void, shape: &[i64], byte_strides: &[i64]) -> Strided {
    Strided {
        ptr: ptr.cast(),
        shape: shape.iter().map(|&n| n as usize).collect(),
        strides: byte_strides.iter().map(|&s| s as isize).collect(),
    }
}

fn run(py: Python<'_>, dst: &Strided, src: &Strided, itemsize: usize, swap: Option<usize>) {
    let bytes = dst.shape.iter().product::<usize>() * itemsize;
    // The callers pass views whose every addressed byte lies in memory kept alive for the call
    // (a tensor's owner, or a buffer we allocated) and that do not overlap.
    if bytes < DETACH_THRESHOLD {
        // SAFETY: as just said.
        unsafe { copy_strided(dst, src, itemsize, swap) }
    } else {
        let job = SendJob { dst, src };
        py.detach(move || {
            let job = job;
            // SAFETY: as just said; the memory is not Python's to move while detached.
            unsafe { copy_strided(job.dst, job.src, itemsize, swap) }
        })
    }
}

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
    let itemsize = tensor.dtype.itemsize();
    let nbytes = usize::try_from(tensor.nbytes()).map_err(|_| Error::value("tensor too large"))?;
    let buffer = AlignedBuffer::new(nbytes)?;
    let layout = Layout::c_order(tensor.layout.shape(), itemsize)?;
    let dst = strided(
        buffer.as_ptr().cast(),
        layout.shape(),
        layout.byte_strides(),
    );
    if tensor.indirect {
        gather_indirect(py, tensor, &buffer, nbytes)?;
        if tensor.swapped {
            // Swap in place: the engine reads each element before writing it back.
            run(py, &dst, &dst, itemsize, Some(tensor.dtype.swap_unit()));
        }
    } else {
        let src = strided(
            tensor.data,
            tensor.layout.shape(),
            tensor.layout.byte_strides(),
        );
        let swap = tensor.swapped.then(|| tensor.dtype.swap_unit());
        run(py, &dst, &src, itemsize, swap);
    }
    Ok(Tensor::host_allocation(buffer, tensor.dtype, layout))
}

/// Follow a buffer's suboffsets with CPython's own gatherer (it knows the PIL-style rules).
fn gather_indirect(
    py: Python<'_>,
    tensor: &Tensor,
    buffer: &AlignedBuffer,
    nbytes: usize,
) -> Result<()> {
    let Owner::Buffer { view, .. } = &tensor.owner else {
        return Err(Error::buffer("indirect memory without a buffer view"));
    };
    let len = isize::try_from(nbytes).map_err(|_| Error::value("tensor too large"))?;
    // SAFETY: `view` is a live Py_buffer (the tensor's owner holds it), `buffer` has `nbytes`
    // bytes, which is exactly the view's element count times its item size; we hold the GIL.
    if !unsafe { python::buffer_to_c_order(buffer.as_ptr(), &**view, len) } {
        return Err(PyErr::fetch(py).into());
    }
    Ok(())
}

/// Swap the bytes of a host tensor's elements where they are (native <-> non-native order).
pub fn swap_in_place(py: Python<'_>, tensor: &Tensor) {
    let view = strided(
        tensor.data,
        tensor.layout.shape(),
        tensor.layout.byte_strides(),
    );
    // The engine reads each element before writing it back.
    run(
        py,
        &view,
        &view,
        tensor.dtype.itemsize(),
        Some(tensor.dtype.swap_unit()),
    );
}

/// Numpy's broadcasting of `src` to `shape`: byte strides for `src` viewed with `shape`.
pub fn broadcast_strides(src: &Layout, shape: &[i64]) -> Result<Vec<i64>> {
    let mismatch = || {
        Error::value(format!(
            "could not broadcast source of shape {:?} into destination of shape {shape:?}",
            src.shape()
        ))
    };
    // Like numpy, leading source dimensions of extent 1 beyond the destination's are dropped.
    let extra = src.shape().len().saturating_sub(shape.len());
    if src.shape()[..extra].iter().any(|&n| n != 1) {
        return Err(mismatch());
    }
    let (src_shape, src_strides) = (&src.shape()[extra..], &src.byte_strides()[extra..]);
    let lead = shape.len() - src_shape.len();
    let mut strides = vec![0i64; shape.len()];
    for (k, (&n, &s)) in src_shape.iter().zip(src_strides.iter()).enumerate() {
        let target = shape[lead + k];
        strides[lead + k] = if n == target {
            s
        } else if n == 1 {
            0
        } else {
            return Err(mismatch());
        };
    }
    Ok(strides)
}

/// `copyto`: copy `src` into the existing, writable `dst` (numpy's broadcasting; same dtype).
/// Copies with CUDA memory on either side go to the CUDA engine, on `stream` if given.
pub fn copy_into(py: Python<'_>, dst: &Tensor, src: &Tensor, stream: Option<i64>) -> Result<()> {
    if dst.readonly {
        return Err(Error::value("the destination is read-only"));
    }
    if dst.indirect {
        return Err(Error::value(
            "can't write into a buffer with suboffsets (indirect memory)",
        ));
    }
    if dst.dtype != src.dtype {
        return Err(Error::type_(format!(
            "copyto needs equal dtypes: the destination holds {}, the source {}",
            dst.dtype.name(),
            src.dtype.name()
        )));
    }
    let shape = dst.layout.shape();
    if dst.numel() == 0 {
        broadcast_strides(&src.layout, shape)?;
        return Ok(());
    }
    // Elements that share bytes would be written more than once, in an order nothing defines
    // (and by several threads at once): refused, as torch refuses them. A layout too large to
    // check exactly is copied by one thread (see `copy_strided`).
    let dims = shape.iter().zip(dst.layout.byte_strides());
    let itemsize = dst.dtype.itemsize() as u64;
    if self_overlap(dims.map(|(&n, &s)| (n as u64, s)), itemsize) == SelfOverlap::Overlapping {
        return Err(Error::value(
            "more than one element of the destination refers to the same memory (a broadcast \
             or overlapping view): copyto can't write into it",
        ));
    }
    if !on_host(dst)? || !on_host(src)? {
        return super::cuda::copy_into(py, dst, src, stream);
    }
    if let Some(stream) = stream {
        return Err(Error::value(format!(
            "stream must be None when both arrays are in host memory, not {stream}"
        )));
    }
    let itemsize = dst.dtype.itemsize();
    let to = strided(dst.data, shape, dst.layout.byte_strides());
    let from = strided(src.data, shape, &broadcast_strides(&src.layout, shape)?);
    // Sources the engine can't read directly, or that share bytes with the destination, are
    // first copied whole into a buffer of our own.
    let staged;
    let (from, from_swapped) = if src.indirect || may_overlap(&to, &from, itemsize) {
        staged = to_c_order(py, src)?;
        (
            strided(
                staged.data,
                shape,
                &broadcast_strides(&staged.layout, shape)?,
            ),
            staged.swapped,
        )
    } else {
        (from, src.swapped)
    };
    let swap = (dst.swapped != from_swapped).then(|| dst.dtype.swap_unit());
    run(py, &to, &from, itemsize, swap);
    Ok(())
}
