//! The core's error: a kind and a message. The kinds follow the array API's `__dlpack__` rules,
//! and the extension raises each as the Python exception named on it (its one mapping, in its
//! `error.rs`): `Buffer` means "this memory can't be DLPack" (consumers may fall back on another
//! path), `Type` a wrong argument type, `Value` a wrong value. With the runtime, a failed system
//! call (sharing's) is one too: `Os` and `Limit`, raised as `OSError` with its errno.

use std::borrow::Cow;
use std::fmt;

#[cfg(feature = "runtime")]
use rustix::io::Errno;

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
    /// A system call failed: `OSError` with its errno.
    #[cfg(feature = "runtime")]
    Os { call: &'static str, errno: Errno },
    /// A system call failed for want of a resource that has a limit (open files): `OSError`
    /// with its errno, the message naming the limit and what holds the resource.
    #[cfg(feature = "runtime")]
    Limit { errno: Errno, msg: String },
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

    /// A mapper from the errno of the system call `call` to an error.
    #[cfg(feature = "runtime")]
    pub fn os(call: &'static str) -> impl FnOnce(Errno) -> Error {
        move |errno| Error::Os { call, errno }
    }

    /// The errno of a failed system call.
    #[cfg(feature = "runtime")]
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Error::Os { errno, .. } | Error::Limit { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// The message, without the kind (a failed call's names the call and what the C library
    /// says of its errno).
    pub fn message(&self) -> Cow<'_, str> {
        match self {
            Error::Buffer(msg)
            | Error::Type(msg)
            | Error::Value(msg)
            | Error::Runtime(msg)
            | Error::Memory(msg) => Cow::Borrowed(msg),
            #[cfg(feature = "runtime")]
            Error::Limit { msg, .. } => Cow::Borrowed(msg),
            #[cfg(feature = "runtime")]
            Error::Os { call, errno } => Cow::Owned(format!("{call}: {}", describe(*errno))),
        }
    }
}

/// What the C library says about `errno` ("Connection refused"), as Python's `strerror`.
#[cfg(feature = "runtime")]
pub fn describe(errno: Errno) -> String {
    let text = std::io::Error::from_raw_os_error(errno.raw_os_error()).to_string();
    // std writes "<description> (os error <n>)".
    match text.rsplit_once(" (os error ") {
        Some((description, _)) => description.to_owned(),
        None => text,
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for Error {}

#[cfg(all(test, feature = "runtime"))]
mod tests {
    use super::*;

    #[test]
    fn describes_errors_as_the_c_library_does() {
        assert_eq!(describe(Errno::NOENT), "No such file or directory");
        let err = Error::os("open")(Errno::ACCESS);
        assert_eq!(err.to_string(), "open: Permission denied");
        assert_eq!(err.errno(), Some(Errno::ACCESS));
        assert_eq!(Error::value("bad").errno(), None);
    }
}
