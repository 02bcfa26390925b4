//! What the importers' unit tests share: an embedded interpreter to run in, and an error as
//! Python would raise it.

use dlpack_core::error::Error as CoreError;
use pyo3::prelude::*;

use crate::error::{Error, Result};

/// Run `body` attached to the embedded interpreter (started on first use).
pub fn attached<R>(body: impl for<'py> FnOnce(Python<'py>) -> R) -> R {
    Python::initialize();
    Python::attach(body)
}

/// The exception an error is raised as, and its message (an error Python raised: "Python", and
/// its text).
pub fn refusal<T>(result: Result<T>) -> (&'static str, String) {
    match result {
        Err(Error::Core(CoreError::Buffer(msg))) => ("BufferError", msg),
        Err(Error::Core(CoreError::Type(msg))) => ("TypeError", msg),
        Err(Error::Core(CoreError::Value(msg))) => ("ValueError", msg),
        Err(Error::Python(err)) => ("Python", err.to_string()),
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("accepted"),
    }
}
