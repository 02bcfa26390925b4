//! One error type for the extension and its one mapping to Python exceptions.
//!
//! Our own errors are the core's (`dlpack_core::error::Error`: a kind and a message), raised as the
//! Python exception their kind names: `Buffer` means "this memory can't be DLPack" (consumers
//! may fall back on another path), `Type` a wrong argument type, `Value` a wrong value. Errors
//! raised by Python code we call pass through unchanged.

use pyo3::exceptions::{
    PyBufferError, PyMemoryError, PyOSError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::types::PyTypeMethods;
use std::borrow::Cow;

use pyo3::{PyErr, Python};

// The core's error, named here beside the extension's own `Error` that wraps it.
use dlpack_core::error::Error as CoreError;

#[derive(Debug)]
pub enum Error {
    /// One of ours: a kind and a message.
    Core(CoreError),
    /// An exception raised by Python code we called.
    Python(PyErr),
}

pub type Result<T> = std::result::Result<T, Error>;

/// Makes the Python exception of one of our kinds from the error and its message.
type NewException = fn(&CoreError, String) -> PyErr;

// The constructors and conversions are `#[cold]`: the optimiser then moves every error path out
// of line, keeping the exchange's hot code compact (instruction-cache misses, not instruction
// counts, set much of its price).

impl Error {
    #[cold]
    pub fn buffer(msg: impl Into<String>) -> Self {
        Error::Core(CoreError::buffer(msg))
    }
    #[cold]
    pub fn type_(msg: impl Into<String>) -> Self {
        Error::Core(CoreError::type_(msg))
    }
    #[cold]
    pub fn value(msg: impl Into<String>) -> Self {
        Error::Core(CoreError::value(msg))
    }
    #[cold]
    pub fn runtime(msg: impl Into<String>) -> Self {
        Error::Core(CoreError::runtime(msg))
    }

    /// The Python exception type of each of our kinds, by name and constructor, with the
    /// message: the one mapping, which both Python callers (`From<Error> for PyErr`) and C
    /// callers (the exchange API's error callback, `python_type_name_and_message`) see. `None`
    /// for an exception Python raised.
    fn ours(&self) -> Option<(&'static str, NewException, Cow<'_, str>)> {
        let Error::Core(err) = self else {
            return None;
        };
        let (name, make): (_, NewException) = match err {
            CoreError::Buffer(_) => ("BufferError", |_, msg| PyBufferError::new_err(msg)),
            CoreError::Type(_) => ("TypeError", |_, msg| PyTypeError::new_err(msg)),
            CoreError::Value(_) => ("ValueError", |_, msg| PyValueError::new_err(msg)),
            CoreError::Runtime(_) => ("RuntimeError", |_, msg| PyRuntimeError::new_err(msg)),
            CoreError::Memory(_) => ("MemoryError", |_, msg| PyMemoryError::new_err(msg)),
            // `OSError(errno, text)`: Python picks the subclass (`FileNotFoundError`, ...).
            CoreError::Os { .. } | CoreError::Limit { .. } => ("OSError", |err, msg| {
                let errno = err.errno().map_or(0, |errno| errno.raw_os_error());
                PyOSError::new_err((errno, msg))
            }),
        };
        Some((name, make, err.message()))
    }

    /// The name of the Python exception type this error is raised as, and its message, for C
    /// callers that take errors as text. An exception Python raised is read while attached.
    #[cold]
    pub fn python_type_name_and_message(&self) -> (String, String) {
        if let Some((name, _, msg)) = self.ours() {
            return (name.to_owned(), msg.into_owned());
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
            Error::Core(CoreError::Buffer(_)) => true,
            Error::Python(err) => err.is_instance_of::<PyBufferError>(py),
            Error::Core(_) => false,
        }
    }
}

impl From<CoreError> for Error {
    #[cold]
    fn from(err: CoreError) -> Self {
        Error::Core(err)
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
        if let (Some((_, make, msg)), Error::Core(core)) = (err.ours(), &err) {
            return make(core, msg.into_owned());
        }
        match err {
            Error::Python(err) => err,
            Error::Core(_) => unreachable!("every core error is ours"),
        }
    }
}

/// A caught panic's message, for the `RuntimeError` (or a consumer's error callback) that
/// reports it.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let message = payload
        .downcast_ref::<&str>()
        .map(|m| m.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned());
    format!("dlpack: internal error (a Rust panic, a bug): {message}")
}

/// Run a C entry point's `body` attached (`py`): its value; or `failed`, with its error raised,
/// or a panic raised as a `RuntimeError` naming it (not PyO3's `PanicException`, a
/// BaseException that `except Exception` misses). Nothing unwinds into C.
///
/// The error is raised through PyO3's `Python::attach`: a C caller holds the GIL without PyO3
/// knowing (`Python::assume_attached` doesn't tell it), so the references an error drops as it
/// is raised (the exception's type and arguments), and any its body dropped, would wait in PyO3's
/// queue until this extension next attaches, which a caller of the C API alone never makes
/// happen. Attaching releases those, and the queue, at once.
pub fn at_c_boundary<T, E: Into<PyErr>>(
    py: Python<'_>,
    failed: T,
    body: impl FnOnce(Python<'_>) -> std::result::Result<T, E>,
) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(py))) {
        Ok(Ok(value)) => value,
        Ok(Err(err)) => {
            raise_attached(|| err.into());
            failed
        }
        Err(payload) => {
            raise_attached(|| PyRuntimeError::new_err(panic_message(&*payload)));
            failed
        }
    }
}

/// Raise the error `make` gives, attached through PyO3 (see `at_c_boundary`).
#[cold]
fn raise_attached(make: impl FnOnce() -> PyErr) {
    Python::attach(|py| make().restore(py));
}
