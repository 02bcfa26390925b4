//! `copyto`: copy a source into an existing, writable destination (numpy's broadcasting, equal
//! dtypes), after the checks both engines share: host memory on both sides goes to `host`,
//! CUDA memory on either side to `cuda`. Host memory a view of the C API holds (a Rust or C
//! extension's, in the runtime's registry of borrowed memory) is not written.

use dlpack_core::layout::{SelfOverlap, broadcast_strides, self_overlap};
use pyo3::prelude::*;

use super::{cuda, host};
use crate::api::borrows;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// `copyto`: copy `src` into the existing, writable `dst` (numpy's broadcasting; same dtype).
/// Copies with CUDA memory on either side go to the CUDA engine, on `stream` if given.
pub fn copy_into(py: Python<'_>, dst: &Tensor, src: &Tensor, stream: Option<i64>) -> Result<()> {
    if dst.readonly() {
        return Err(Error::value("the destination is read-only"));
    }
    if dst.indirect() {
        return Err(Error::value(
            "can't write into a buffer with suboffsets (indirect memory)",
        ));
    }
    if dst.dtype() != src.dtype() {
        return Err(Error::type_(format!(
            "copyto needs equal dtypes: the destination holds {}, the source {}",
            dst.dtype().name(),
            src.dtype().name()
        )));
    }
    let shape = dst.layout().shape();
    if dst.numel() == 0 {
        broadcast_strides(src.layout(), shape)?;
        return Ok(());
    }
    // Elements that share bytes would be written more than once, in an order nothing defines
    // (and by several threads at once): refused, as torch refuses them. A layout too large to
    // check exactly is copied by one thread (see `copy_strided`). A C-contiguous one's
    // elements are one after another.
    let dims = shape.iter().zip(dst.layout().byte_strides());
    let itemsize = dst.dtype().itemsize() as u64;
    let contiguous = dst.layout().is_c_contiguous();
    if !contiguous
        && self_overlap(dims.map(|(&n, &s)| (n as u64, s)), itemsize) == SelfOverlap::Overlapping
    {
        return Err(Error::value(
            "more than one element of the destination refers to the same memory (a broadcast \
             or overlapping view): copyto can't write into it",
        ));
    }
    let dst_on_host = on_host(dst)?;
    // A view reading this memory must not see it change, one writing it holds it alone; and no
    // view is taken of it until the copy is done (`_writing`, given back on return).
    let _writing = if dst_on_host {
        let (start, end) = borrows::range_of(dst)?;
        borrows::Writing::take(start, end, "copyto")?
    } else {
        None
    };
    if !dst_on_host || !on_host(src)? {
        return cuda::copy_into(py, dst, src, stream);
    }
    if let Some(stream) = stream {
        return Err(Error::value(format!(
            "stream must be None when both arrays are in host memory, not {stream}"
        )));
    }
    host::copy_into(py, dst, src)
}

fn on_host(tensor: &Tensor) -> Result<bool> {
    Ok(tensor.device().get()?.is_host())
}
