//! One error type for the whole crate and its one mapping to Python exceptions.
//!
//! The kinds follow the array API's `__dlpack__` rules: `Buffer` means "this memory can't be
//! DLPack" (consumers may fall back on another path), `Type` a wrong argument type, `Value` a
//! wrong value. Errors raised by Python code we call pass through unchanged.

use pyo3::PyErr;
use pyo3::exceptions::{PyBufferError, PyRuntimeError, PyTypeError, PyValueError};

#[derive(Debug)]
pub enum Error {
    /// The memory can't be expressed as (or served through) DLPack: `BufferError`.
    Buffer(String),
    /// An argument or interface field has the wrong type: `TypeError`.
    Type(String),
    /// An argument or interface field has a wrong value: `ValueError`.
    Value(String),
    /// The environment can't do what was asked (e.g. no CUDA driver): `RuntimeError`.
    Runtime(String),
    /// An exception raised by Python code we called.
    Python(PyErr),
}

pub type Result<T> = std::result::Result<T, Error>;

// The constructors and conversions are `#[cold]`: the optimiser then moves every error path out
// of line, keeping the exchange's hot code compact (instruction-cache misses, not instruction
// counts, set much of its price).

impl Error {
    #[cold]
    pub fn buffer(msg: impl Into<String>) -> Self {
        Error::Buffer(msg.into())
    }
    #[cold]
    pub fn type_(msg: impl Into<String>) -> Self {
        Error::Type(msg.into())
    }
    #[cold]
    pub fn value(msg: impl Into<String>) -> Self {
        Error::Value(msg.into())
    }

    /// Whether this is "the memory can't be DLPack" (so another protocol may still serve it).
    pub fn is_buffer_error(&self, py: pyo3::Python<'_>) -> bool {
        match self {
            Error::Buffer(_) => true,
            Error::Python(err) => err.is_instance_of::<PyBufferError>(py),
            _ => false,
        }
    }
}

impl From<PyErr> for Error {
    #[cold]
    fn from(err: PyErr) -> Self {
        Error::Python(err)
    }
}

impl From<Error> for PyErr {
    #[cold]
    fn from(err: Error) -> PyErr {
        match err {
            Error::Buffer(msg) => PyBufferError::new_err(msg),
            Error::Type(msg) => PyTypeError::new_err(msg),
            Error::Value(msg) => PyValueError::new_err(msg),
            Error::Runtime(msg) => PyRuntimeError::new_err(msg),
            Error::Python(err) => err,
        }
    }
}
