//! One error type for the whole crate and its one mapping to Python exceptions.
//!
//! The kinds follow the array API's `__dlpack__` rules: `Buffer` means "this memory can't be
//! DLPack" (consumers may fall back on another path), `Type` a wrong argument type, `Value` a
//! wrong value. Errors raised by Python code we call pass through unchanged.

use pyo3::exceptions::{PyBufferError, PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::types::PyTypeMethods;
use pyo3::{PyErr, Python};

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
    /// Memory for a copy or an allocation could not be had: `MemoryError`.
    Memory(String),
    /// An exception raised by Python code we called.
    Python(PyErr),
}

pub type Result<T> = std::result::Result<T, Error>;

/// Makes a Python exception of one type from its message.
type NewException = fn(String) -> PyErr;

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

    /// The Python exception type of each of our kinds, by name and constructor, with the
    /// message: the one mapping, which both Python callers (`From<Error> for PyErr`) and C
    /// callers (the exchange API's error callback, `python_type_name_and_message`) see. `None`
    /// for an exception Python raised.
    fn ours(&self) -> Option<(&'static str, NewException, &str)> {
        Some(match self {
            Error::Buffer(msg) => ("BufferError", PyBufferError::new_err::<String>, msg),
            Error::Type(msg) => ("TypeError", PyTypeError::new_err::<String>, msg),
            Error::Value(msg) => ("ValueError", PyValueError::new_err::<String>, msg),
            Error::Runtime(msg) => ("RuntimeError", PyRuntimeError::new_err::<String>, msg),
            Error::Memory(msg) => ("MemoryError", PyMemoryError::new_err::<String>, msg),
            Error::Python(_) => return None,
        })
    }

    /// The name of the Python exception type this error is raised as, and its message, for C
    /// callers that take errors as text. An exception Python raised is read while attached.
    #[cold]
    pub fn python_type_name_and_message(&self) -> (String, String) {
        if let Some((name, _, msg)) = self.ours() {
            return (name.to_owned(), msg.to_owned());
        }
        let Error::Python(err) = self else {
            unreachable!("only exceptions Python raised are not ours")
        };
        Python::try_attach(|py| {
            let ty = err.get_type(py);
            let name = ty.name().map(|n| n.to_string());
            let name = name.unwrap_or_else(|_| "RuntimeError".to_owned());
            (name, err.value(py).to_string())
        })
        .unwrap_or_else(|| {
            (
                "RuntimeError".to_owned(),
                "(the interpreter is gone)".to_owned(),
            )
        })
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
        if let Some((_, make, msg)) = err.ours() {
            return make(msg.to_owned());
        }
        match err {
            Error::Python(err) => err,
            _ => unreachable!("only exceptions Python raised are not ours"),
        }
    }
}
