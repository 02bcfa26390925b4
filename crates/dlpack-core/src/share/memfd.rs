//! Memory files: anonymous files in memory (`memfd_create`), never named in /dev/shm, whose
//! memory lives while some process maps them or holds a descriptor of them. Sealed against
//! shrinking and growing, a file's size is fixed for good, so no holder can truncate it under
//! another's mapping (reads there would fault).

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use rustix::fs::{self, CWD, FileType, MemfdFlags, Mode, OFlags, SealFlags};

use crate::error::{Error, Result};

/// A file's identity, the same in every process: its device and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

/// A descriptor of a memory file sealed against shrinking, with the size it has for good, so
/// that a mapping of its `size` bytes can never fault. Only `create` and `check` make one.
#[derive(Debug)]
pub struct SealedFile {
    fd: OwnedFd,
    id: FileId,
    size: u64,
    writable: bool,
}

impl SealedFile {
    /// A new zero-filled memory file of `size` bytes (readable and writable, closed on exec),
    /// sealed against shrinking, growing and further seals.
    pub fn create(name: &CStr, size: u64) -> Result<SealedFile> {
        SealedFile::new(name, size, true)
    }

    /// `create`, but open to one more seal: `freeze`.
    pub fn create_freezable(name: &CStr, size: u64) -> Result<SealedFile> {
        SealedFile::new(name, size, false)
    }

    fn new(name: &CStr, size: u64, last_seal: bool) -> Result<SealedFile> {
        let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        let fd = fs::memfd_create(name, flags).map_err(Error::os("memfd_create"))?;
        fs::ftruncate(&fd, size).map_err(Error::os("ftruncate"))?;
        let mut seals = SealFlags::SHRINK | SealFlags::GROW;
        if last_seal {
            seals |= SealFlags::SEAL;
        }
        fs::fcntl_add_seals(&fd, seals).map_err(Error::os("fcntl(F_ADD_SEALS)"))?;
        let id = identity(&fd)?.0;
        Ok(SealedFile {
            fd,
            id,
            size,
            writable: true,
        })
    }

    /// `fd`, checked to be a memory file (`expected`, if given) of `size` bytes, sealed against
    /// shrinking, and open for writing if `writable`; `fd` is closed when it is not.
    pub fn check(
        fd: OwnedFd,
        expected: Option<FileId>,
        size: u64,
        writable: bool,
    ) -> Result<SealedFile> {
        let (id, actual, regular) = identity(&fd)?;
        if !regular || expected.is_some_and(|expected| id != expected) {
            return Err(Error::buffer(
                "the descriptor received is not the segment the handle names",
            ));
        }
        if actual != size {
            return Err(size_mismatch(size, actual));
        }
        let seals = fs::fcntl_get_seals(&fd).map_err(Error::os("fcntl(F_GET_SEALS)"))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(Error::buffer(
                "the segment received is not sealed against shrinking, so a mapping of it could \
                 fault: not a dlpack segment",
            ));
        }
        let access = fs::fcntl_getfl(&fd).map_err(Error::os("fcntl(F_GETFL)"))? & OFlags::RWMODE;
        let read_write = access == OFlags::RDWR;
        if writable && !read_write {
            return Err(Error::buffer(
                "the segment received for a writable handle is read-only",
            ));
        }
        Ok(SealedFile {
            fd,
            id,
            size,
            writable: read_write,
        })
    }

    /// Another open of the same file, through /proc: a new open file description, with locks
    /// of its own; read-only unless `writable` (which needs this one writable).
    pub fn reopen(&self, writable: bool) -> Result<SealedFile> {
        let fd = open_path(
            &format!("/proc/self/fd/{}", self.fd.as_raw_fd()),
            writable && self.writable,
        )?;
        Ok(SealedFile {
            fd,
            id: self.id,
            size: self.size,
            writable: writable && self.writable,
        })
    }

    /// Seal a `create_freezable` file against writes from now on (`F_SEAL_FUTURE_WRITE`, and
    /// against further seals): mappings made writable before keep writing, but no process can
    /// map it writable any more, nor `write` to it, whatever mode it opens it in. False where the
    /// kernel has no such seal (before 5.1): then nothing changes.
    pub fn freeze(&self) -> Result<bool> {
        match fs::fcntl_add_seals(&self.fd, SealFlags::FUTURE_WRITE | SealFlags::SEAL) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::INVAL) => Ok(false),
            Err(errno) => Err(Error::os("fcntl(F_ADD_SEALS)")(errno)),
        }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn id(&self) -> FileId {
        self.id
    }

    /// Bytes in the file, for good.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether the descriptor is open for writing (a shared mapping of it may be writable).
    pub fn writable(&self) -> bool {
        self.writable
    }
}

/// The error of a handle whose size is not its segment's.
pub fn size_mismatch(named: u64, actual: u64) -> Error {
    Error::value(format!(
        "the handle says its segment holds {named} bytes, but it holds {actual} (a forged or \
         corrupted handle)"
    ))
}

/// A new open of the file behind descriptor `fd` of process `pid` (its /proc entry), read-only
/// unless `writable`. The kernel lets only processes that may trace `pid` open it; what it opens
/// can be any file, to be checked (`SealedFile::check`).
pub fn open_peer(pid: i32, fd: i32, writable: bool) -> Result<OwnedFd> {
    open_path(&format!("/proc/{pid}/fd/{fd}"), writable)
}

fn open_path(path: &str, writable: bool) -> Result<OwnedFd> {
    let access = if writable {
        OFlags::RDWR
    } else {
        OFlags::RDONLY
    };
    fs::openat(CWD, path, access | OFlags::CLOEXEC, Mode::empty()).map_err(Error::os("open"))
}

/// A descriptor's file identity, size, and whether it is a regular file.
fn identity(fd: &OwnedFd) -> Result<(FileId, u64, bool)> {
    let stat = fs::fstat(fd).map_err(Error::os("fstat"))?;
    let id = FileId {
        dev: stat.st_dev,
        ino: stat.st_ino,
    };
    let regular = FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile;
    Ok((id, u64::try_from(stat.st_size).unwrap_or(0), regular))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_file_is_sealed_and_checks() {
        let file = SealedFile::create(c"test", 4096).unwrap();
        assert!(file.writable());
        let seals = fs::fcntl_get_seals(file.fd()).unwrap();
        assert!(seals.contains(SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL));
        assert_eq!(fs::ftruncate(file.fd(), 100), Err(rustix::io::Errno::PERM));

        let again = open_peer(super::super::system::pid(), file.fd().as_raw_fd(), true).unwrap();
        let checked = SealedFile::check(again, Some(file.id()), 4096, true).unwrap();
        assert_eq!(checked.id(), file.id());
        assert!(checked.writable());
    }

    #[test]
    fn check_refuses_what_is_not_the_segment() {
        let file = SealedFile::create(c"test", 4096).unwrap();
        let other = SealedFile::create(c"test", 4096).unwrap();
        let reopen = |writable| file.reopen(writable).unwrap().fd;

        let err = SealedFile::check(reopen(false), Some(other.id()), 4096, false).unwrap_err();
        assert!(matches!(err, Error::Buffer(m) if m.contains("not the segment")));
        let err = SealedFile::check(reopen(false), Some(file.id()), 8192, false).unwrap_err();
        assert!(matches!(err, Error::Value(m) if m.contains("forged or corrupted")));
        let err = SealedFile::check(reopen(false), Some(file.id()), 4096, true).unwrap_err();
        assert!(matches!(err, Error::Buffer(m) if m.contains("read-only")));
        let read_only = SealedFile::check(reopen(false), Some(file.id()), 4096, false).unwrap();
        assert!(!read_only.writable());
        assert!(!read_only.reopen(true).unwrap().writable());

        // A memory file nobody sealed.
        let unsealed = fs::memfd_create(c"test", MemfdFlags::CLOEXEC).unwrap();
        fs::ftruncate(&unsealed, 4096).unwrap();
        let id = identity(&unsealed).unwrap().0;
        let err = SealedFile::check(unsealed, Some(id), 4096, false).unwrap_err();
        assert!(matches!(err, Error::Buffer(m) if m.contains("not sealed")));

        // Not a regular file.
        let dir = open_path("/proc/self", false);
        assert!(dir.is_err() || SealedFile::check(dir.unwrap(), None, 0, false).is_err());
    }

    #[test]
    fn peers_descriptors_that_are_not_there_fail_to_open() {
        let err = open_peer(super::super::system::pid(), 1 << 20, false).unwrap_err();
        assert!(err.errno().is_some());
    }
}
