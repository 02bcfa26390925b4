//! The error of the operating-system layer: a system call that failed (its name and errno), a
//! limit reached (what it is), or a file, a peer or memory that is not what sharing needs. Each
//! kind names the Python exception it is raised as.

use std::fmt;

use rustix::io::Errno;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A system call failed: `OSError` with its errno.
    Os { call: &'static str, errno: Errno },
    /// A system call failed for want of a resource that has a limit (open files): `OSError`
    /// with its errno, the message naming the limit and what holds the resource.
    Limit { errno: Errno, msg: String },
    /// Memory (or the file or peer holding it) that can't be shared as asked: `BufferError`.
    Buffer(String),
    /// A value that contradicts what it describes (a forged or corrupted handle): `ValueError`.
    Value(String),
    /// Memory that could not be had: `MemoryError`.
    Memory(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A mapper from the errno of the system call `call` to an error.
    pub fn os(call: &'static str) -> impl FnOnce(Errno) -> Error {
        move |errno| Error::Os { call, errno }
    }

    #[cold]
    pub fn buffer(msg: impl Into<String>) -> Self {
        Error::Buffer(msg.into())
    }

    #[cold]
    pub fn value(msg: impl Into<String>) -> Self {
        Error::Value(msg.into())
    }

    /// The errno of a failed system call.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Error::Os { errno, .. } | Error::Limit { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// What the C library says about `errno` ("Connection refused"), as Python's `strerror`.
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
        match self {
            Error::Os { call, errno } => write!(f, "{call}: {}", describe(*errno)),
            Error::Limit { msg, .. }
            | Error::Buffer(msg)
            | Error::Value(msg)
            | Error::Memory(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
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
