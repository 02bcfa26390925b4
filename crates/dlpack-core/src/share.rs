//! The operating-system calls that sharing host memory between processes makes on Linux: whole
//! file locks on a segment, held by open file descriptions, faulting a new segment's pages in from several threads,
//! and reading which user is at the other end of a Unix socket.

use std::io;
use std::os::fd::BorrowedFd;

use rustix::fs::{FlockOperation, flock};
use rustix::io::Errno;

/// A lock on a whole file, held by an open file description: shared, exclusive, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lock {
    Read,
    Write,
    Unlock,
}

/// Set (or clear) a lock on the whole file `fd` refers to, without waiting: `Ok(false)` when
/// another holder's lock is in the way. The lock (`flock`'s) belongs to the open file
/// description: descriptors duplicated from one another (inherited by a forked child, passed over
/// a socket) share it, another open of the same file is another holder, and the kernel drops it
/// when the last descriptor of the description closes, or its process dies.
pub fn lock(fd: BorrowedFd<'_>, lock: Lock) -> io::Result<bool> {
    let operation = match lock {
        Lock::Read => FlockOperation::NonBlockingLockShared,
        Lock::Write => FlockOperation::NonBlockingLockExclusive,
        Lock::Unlock => FlockOperation::NonBlockingUnlock,
    };
    loop {
        return match flock(fd, operation) {
            Ok(()) => Ok(true),
            Err(Errno::WOULDBLOCK) => Ok(false),
            Err(Errno::INTR) => continue,
            Err(errno) => Err(errno.into()),
        };
    }
}

/// Fault in (for writing) the pages of `len` bytes at `addr`, cut between up to `threads`
/// threads: on a virtual machine each fault is dear, and a copy that faults as it writes runs
/// slower than one into pages already there. An `ErrorKind::OutOfMemory` error when the memory
/// can't be had; on kernels without `MADV_POPULATE_WRITE` (before 5.14), nothing.
///
/// # Safety
/// `addr..addr + len` is a writable mapping of this process that stays mapped during the call.
pub unsafe fn populate_write(addr: *mut u8, len: usize, threads: usize) -> io::Result<()> {
    let page = rustix::param::page_size();
    let threads = threads.clamp(1, len.div_ceil(page).max(1));
    let chunk = len.div_ceil(threads).div_ceil(page) * page;
    let base = addr as usize;
    let fault = |start: usize| -> io::Result<()> {
        let size = chunk.min(len - start);
        if size == 0 {
            return Ok(());
        }
        let at = (base + start) as *mut std::ffi::c_void;
        // SAFETY: the range lies in the mapping the caller vouches for; populating only faults
        // pages in, it changes no contents.
        match unsafe { rustix::mm::madvise(at, size, rustix::mm::Advice::LinuxPopulateWrite) } {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::INVAL) => Ok(()), // an older kernel: faults happen on write
            Err(rustix::io::Errno::NOMEM) => Err(io::ErrorKind::OutOfMemory.into()),
            Err(other) => Err(other.into()),
        }
    };
    std::thread::scope(|scope| {
        let workers: Vec<_> = (1..threads)
            .map(|k| k * chunk)
            .filter(|&start| start < len)
            .map(|start| scope.spawn(move || fault(start)))
            .collect();
        let first = fault(0);
        workers
            .into_iter()
            .map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|_| Err(io::Error::other("panicked")))
            })
            .fold(first, |all, one| all.and(one))
    })
}

/// The user id of the process at the other end of the connected Unix socket `fd`.
pub fn peer_uid(fd: BorrowedFd<'_>) -> io::Result<u32> {
    Ok(rustix::net::sockopt::socket_peercred(fd)?.uid.as_raw())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

    fn memfd() -> File {
        let fd = rustix::fs::memfd_create("dlpack-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        File::from(fd)
    }

    fn reopen(file: &File) -> File {
        let path = format!("/proc/self/fd/{}", file.as_raw_fd());
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap()
    }

    #[test]
    fn locks_belong_to_open_file_descriptions() {
        let first = memfd();
        let second = reopen(&first);
        assert!(lock(first.as_fd(), Lock::Read).unwrap());
        assert!(lock(second.as_fd(), Lock::Read).unwrap());
        // a write lock waits for every other description's read lock to go
        assert!(!lock(second.as_fd(), Lock::Write).unwrap());
        assert!(lock(first.as_fd(), Lock::Unlock).unwrap());
        assert!(lock(second.as_fd(), Lock::Write).unwrap());
        assert!(!lock(first.as_fd(), Lock::Read).unwrap());
        drop(second); // closing the description drops its lock
        assert!(lock(first.as_fd(), Lock::Write).unwrap());
    }

    #[test]
    fn lock_of_a_closed_descriptor_is_an_error() {
        let file = memfd();
        let raw = file.as_raw_fd();
        drop(file);
        // SAFETY: the number is not open now; fcntl on it fails with EBADF and touches nothing.
        let dangling = unsafe { OwnedFd::from_raw_fd(raw) };
        let result = lock(dangling.as_fd(), Lock::Read);
        std::mem::forget(dangling);
        assert!(result.is_err());
    }

    #[test]
    fn populates_a_mapping() {
        let len = 3 << 20;
        let mut memory = vec![7u8; len];
        for threads in [1, 2, 5] {
            // SAFETY: the vector's memory is a writable mapping that outlives the call.
            unsafe { populate_write(memory.as_mut_ptr(), len, threads) }.unwrap();
            // SAFETY: as above, for an odd length.
            unsafe { populate_write(memory.as_mut_ptr(), len - 1, threads) }.unwrap();
        }
        assert!(memory.iter().all(|&b| b == 7));
    }

    #[test]
    fn peer_of_a_socket_pair_is_this_user() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(
            peer_uid(a.as_fd()).unwrap(),
            rustix::process::getuid().as_raw()
        );
    }
}
