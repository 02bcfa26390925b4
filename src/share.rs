//! What `dlpack._sharing` asks of the operating system, from the core's Linux calls: a whole
//! file lock on a segment (held by the open file description), faulting a new segment's pages in with the GIL released,
//! and the user at the other end of a lender's connection.

use std::os::fd::BorrowedFd;

use dlpack_core::share::{self, Lock};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyMemoryError, PyValueError};
use pyo3::prelude::*;

/// Adds `_lock_file`, `_populate_write` and `_peer_uid` to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_lock_file, m)?)?;
    m.add_function(wrap_pyfunction!(_populate_write, m)?)?;
    m.add_function(wrap_pyfunction!(_peer_uid, m)?)?;
    Ok(())
}

/// The descriptor number `fd`, checked to be one a process can have.
fn descriptor(fd: i32) -> PyResult<BorrowedFd<'static>> {
    if fd < 0 {
        return Err(PyValueError::new_err(format!(
            "{fd} is not a file descriptor"
        )));
    }
    // SAFETY: the number is only passed to fcntl/getsockopt during this call: one that isn't
    // open fails with EBADF, and the caller (the sharing module) owns the descriptors it names.
    Ok(unsafe { BorrowedFd::borrow_raw(fd) })
}

/// Set (``"read"``: shared, ``"write"``: exclusive) or clear (``"unlock"``) this open file
/// description's lock on the whole file, without waiting: False when another's is in the way.
#[pyfunction]
fn _lock_file(fd: i32, kind: &str) -> PyResult<bool> {
    let lock = match kind {
        "read" => Lock::Read,
        "write" => Lock::Write,
        "unlock" => Lock::Unlock,
        _ => {
            return Err(PyValueError::new_err(format!(
                "lock kind must be 'read', 'write' or 'unlock', not {kind:?}"
            )));
        }
    };
    Ok(share::lock(descriptor(fd)?, lock)?)
}

/// Fault in the first ``length`` bytes of the writable buffer ``memory`` (a new segment's
/// mapping) from several threads, without the GIL; MemoryError when the memory can't be had.
#[pyfunction]
fn _populate_write(py: Python<'_>, memory: &Bound<'_, PyAny>, length: usize) -> PyResult<()> {
    let buffer = PyBuffer::<u8>::get(memory)?;
    if buffer.readonly() || length > buffer.len_bytes() {
        return Err(PyValueError::new_err(format!(
            "can only populate a writable buffer's own bytes (asked for {length} of {}{})",
            buffer.len_bytes(),
            if buffer.readonly() { ", read-only" } else { "" }
        )));
    }
    let address = buffer.buf_ptr() as usize;
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4)
        .min(length / (2 << 20))
        .max(1);
    let result = py.detach(|| {
        // SAFETY: the range is inside the writable buffer, which `buffer` keeps exported (and so
        // mapped) until it is released after this call.
        unsafe { share::populate_write(address as *mut u8, length, threads) }
    });
    match result {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::OutOfMemory => Err(
            PyMemoryError::new_err(format!("can't allocate {length} bytes of shared memory")),
        ),
        Err(error) => Err(error.into()),
    }
}

/// The user id of the process at the other end of the connected Unix socket ``fd``.
#[pyfunction]
fn _peer_uid(fd: i32) -> PyResult<u32> {
    Ok(share::peer_uid(descriptor(fd)?)?)
}
