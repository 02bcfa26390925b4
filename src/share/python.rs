//! What `dlpack._sharing` calls: `SharedHandle` and its reconstructor (`handle`), making
//! handles of host memory (`_share`) and shared arrays (`_share_empty`), the per-process
//! state's upkeep after a fork, and what it holds (`counts`, for tests).

use pyo3::prelude::*;
use pyo3::types::PyBool;

use super::handle::{self, SharedHandle};
use super::limits::explained;
use super::mapped::{self, Mapped};
use super::views;
use super::{client, lender, pool, tree};
use crate::error::{Error, Result};
use crate::object;
use dlpack_core::abi::device_type;

/// Adds sharing's functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_share, m)?)?;
    m.add_function(wrap_pyfunction!(_share_empty, m)?)?;
    handle::register(m)?;
    tree::register(m)?;
    m.add_function(wrap_pyfunction!(_share_after_fork, m)?)?;
    m.add_function(wrap_pyfunction!(_share_clear_pool, m)?)?;
    m.add("_SHARE_POOL_SEGMENTS", pool::POOL_SEGMENTS)?;
    Ok(())
}

/// ``dlpack.share(obj, writable=writable)`` (see its docstring): a handle to the memory of
/// ``obj`` (anything ``asdlpack`` reads), if it is host memory.
#[pyfunction]
fn _share<'py>(
    obj: &Bound<'py, PyAny>,
    writable: &Bound<'py, PyAny>,
) -> Result<Bound<'py, SharedHandle>> {
    let py = obj.py();
    if !writable.is_exact_instance_of::<PyBool>() {
        return Err(Error::type_(format!(
            "writable must be True or False, not {}",
            writable.get_type().name()?
        )));
    }
    let writable = writable.is_truthy()?;
    // The memory as `asdlpack` would see it, without making the object.
    let read = object::read(obj)?;
    let tensor = read.tensor();
    let shared = views::share_host(py, tensor, writable);
    if let Some(view) = shared.map_err(|err| explained(err, "share this memory"))? {
        return SharedHandle::new(view, writable);
    }
    let device = tensor.device().get()?;
    Err(Error::buffer(match device.device_type {
        device_type::CUDA => {
            "sharing CUDA memory between processes (CUDA IPC) is not available yet: copy it to \
             host memory first (e.g. tensor.cpu()) and share that, or use torch.multiprocessing \
             or CuPy's IPC calls"
                .to_owned()
        }
        device_type::CUDA_MANAGED => "CUDA managed memory can't be shared between processes \
                                       (CUDA IPC serves only device memory from cudaMalloc); \
                                       copy it to device or host memory first"
            .to_owned(),
        other => format!("memory of DLPack device type {other} can't be shared (host memory can)"),
    }))
}

/// A writable, zero-filled, C-ordered array in new shared memory.
#[pyfunction]
fn _share_empty<'py>(py: Python<'py>, shape: Vec<i64>, dtype: &str) -> Result<Bound<'py, PyAny>> {
    views::empty(py, &shape, dtype).map_err(|err| explained(err, "allocate shared memory"))
}

/// In a forked child: sharing's per-process state starts afresh (the parent's lender, pool and
/// connections are the parent's), and the mappings inherited get locks of the child's own.
#[pyfunction]
fn _share_after_fork() {
    // The registry first: segments dying below (the parent's pins) forget themselves there.
    let inherited = mapped::renew_in_child();
    lender::renew_in_child();
    client::renew_in_child();
    pool::renew_in_child();
    mapped::hold_in_child(inherited);
}

/// ``(segments mapped, segments kept for reuse, tokens pinned, times the lender's thread woke)``
/// in this process.
pub fn counts() -> (usize, usize, usize, u64) {
    let pinned = lender::pinned(); // first: it lets go of what was released
    (Mapped::live(), pool::kept(), pinned, lender::wakeups())
}

/// Close the segments kept for reuse, returning their memory.
#[pyfunction]
fn _share_clear_pool() {
    lender::sweep(); // first: segments of handles released since go to the pool
    pool::clear();
}
