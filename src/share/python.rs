//! What `dlpack._sharing` calls: making handles' views (`_share_find`, `_share_copy`,
//! `_share_empty`), their pickled state (`_share_state`) and opening one (`_share_open`), the
//! per-process state's upkeep after a fork, and what tests count.

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::os::{self, error::describe};
use super::views::{self, Shared};
use super::{client, handle, lender, pool, registry};
use crate::error::{CoreError, Error, Result};

impl From<os::Error> for Error {
    #[cold]
    fn from(err: os::Error) -> Self {
        match err {
            os::Error::Os { call, errno } => {
                let text = format!("{call}: {}", describe(errno));
                Error::Python(PyOSError::new_err((errno.raw_os_error(), text)))
            }
            os::Error::Buffer(msg) => Error::buffer(msg),
            os::Error::Value(msg) => Error::value(msg),
            os::Error::Memory(msg) => Error::Core(CoreError::Memory(msg)),
        }
    }
}

impl From<os::Error> for PyErr {
    #[cold]
    fn from(err: os::Error) -> Self {
        Error::from(err).into()
    }
}

/// Adds sharing's functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_share_find, m)?)?;
    m.add_function(wrap_pyfunction!(_share_copy, m)?)?;
    m.add_function(wrap_pyfunction!(_share_empty, m)?)?;
    m.add_function(wrap_pyfunction!(_share_state, m)?)?;
    m.add_function(wrap_pyfunction!(_share_open, m)?)?;
    m.add_function(wrap_pyfunction!(_share_after_fork, m)?)?;
    m.add_function(wrap_pyfunction!(_share_counts, m)?)?;
    m.add_function(wrap_pyfunction!(_share_clear_pool, m)?)?;
    m.add("_SHARE_POOL_SEGMENTS", pool::POOL_SEGMENTS)?;
    Ok(())
}

/// ``(view, layout, memory)`` of a handle to ``source`` (a host ``DLPackObject``) if it has no
/// elements or lies in shared memory already; None when it needs a copy.
#[pyfunction]
fn _share_find<'py>(source: &Bound<'py, PyAny>, writable: bool) -> Result<Option<Shared<'py>>> {
    views::find(source, writable)
}

/// ``(view, layout, memory)`` of a read-only handle to a copy of ``source`` in shared memory.
#[pyfunction]
fn _share_copy<'py>(source: &Bound<'py, PyAny>) -> Result<Shared<'py>> {
    views::copy(source)
}

/// A writable, zero-filled, C-ordered array in new shared memory.
#[pyfunction]
fn _share_empty<'py>(py: Python<'py>, shape: Vec<i64>, dtype: &str) -> Result<Bound<'py, PyAny>> {
    views::empty(py, &shape, dtype)
}

/// The state a handle's pickle carries (its memory lent to receivers until they have it).
#[pyfunction]
fn _share_state<'py>(
    view: &Bound<'py, PyAny>,
    writable: bool,
    layout: &Bound<'py, PyAny>,
) -> Result<Bound<'py, PyTuple>> {
    handle::state(view, writable, layout)
}

/// Check a handle's state and open what it names here: the view of its elements.
#[pyfunction]
fn _share_open<'py>(state: &Bound<'py, PyAny>) -> Result<Bound<'py, PyAny>> {
    handle::open(state)
}

/// In a forked child: sharing's per-process state starts afresh (the parent's lender, pool and
/// connections are the parent's), and the mappings inherited get locks of the child's own.
#[pyfunction]
fn _share_after_fork() {
    // The registry first: segments dying below (the parent's pins) forget themselves there.
    let inherited = registry::renew_in_child();
    lender::renew_in_child();
    client::renew_in_child();
    pool::renew_in_child();
    registry::hold_in_child(inherited);
}

/// ``(segments mapped, segments kept for reuse, tokens pinned)`` in this process.
#[pyfunction]
fn _share_counts() -> (usize, usize, usize) {
    (registry::live(), pool::kept(), lender::pinned())
}

/// Close the segments kept for reuse, returning their memory.
#[pyfunction]
fn _share_clear_pool() {
    pool::clear();
}
