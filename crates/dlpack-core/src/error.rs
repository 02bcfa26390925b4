//! The core's error: a kind and a message. The kinds follow the array API's `__dlpack__` rules,
//! and the extension raises each as the Python exception named on it (its one mapping, in its
//! `error.rs`): `Buffer` means "this memory can't be DLPack" (consumers may fall back on another
//! path), `Type` a wrong argument type, `Value` a wrong value.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
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
}

pub type Result<T> = std::result::Result<T, Error>;

// The constructors are `#[cold]`: the optimiser then moves every error path out of line,
// keeping the exchange's hot code compact (instruction-cache misses, not instruction counts, set
// much of its price).

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
    #[cold]
    pub fn runtime(msg: impl Into<String>) -> Self {
        Error::Runtime(msg.into())
    }
    #[cold]
    pub fn memory(msg: impl Into<String>) -> Self {
        Error::Memory(msg.into())
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        match self {
            Error::Buffer(msg)
            | Error::Type(msg)
            | Error::Value(msg)
            | Error::Runtime(msg)
            | Error::Memory(msg) => msg,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Error {}
