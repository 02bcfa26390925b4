//! Whole-file locks held by an open file description (`flock`): descriptors duplicated from one
//! another (inherited by a forked child, passed over a socket) share one lock, another open of
//! the same file is another holder, and the kernel drops a lock when the last descriptor of its
//! description closes, or its process dies. A process that maps a segment it did not make holds
//! a shared lock on it; its maker takes the exclusive one to learn that nobody else does.

use std::os::fd::AsFd;

use rustix::fs::{FlockOperation, flock};
use rustix::io::Errno;

use crate::error::{Error, Result};

/// Take a shared lock without waiting: false when an exclusive one is in the way.
pub fn try_shared(fd: impl AsFd) -> Result<bool> {
    attempt(fd, FlockOperation::NonBlockingLockShared)
}

/// Take the exclusive lock without waiting: false when another description holds a lock.
pub fn try_exclusive(fd: impl AsFd) -> Result<bool> {
    attempt(fd, FlockOperation::NonBlockingLockExclusive)
}

/// Drop this description's lock.
pub fn unlock(fd: impl AsFd) -> Result<()> {
    flock(fd, FlockOperation::NonBlockingUnlock).map_err(Error::os("flock"))
}

fn attempt(fd: impl AsFd, operation: FlockOperation) -> Result<bool> {
    loop {
        return match flock(&fd, operation) {
            Ok(()) => Ok(true),
            Err(Errno::WOULDBLOCK) => Ok(false),
            Err(Errno::INTR) => continue,
            Err(errno) => Err(Error::os("flock")(errno)),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::super::memfd::SealedFile;
    use super::*;

    #[test]
    fn descriptions_hold_locks_of_their_own() {
        let file = SealedFile::create(c"test", 4096).unwrap();
        let reader = file.reopen(false).unwrap();
        let duplicate = rustix::io::dup(file.fd()).unwrap();

        assert!(try_exclusive(file.fd()).unwrap());
        assert!(!try_shared(reader.fd()).unwrap());
        // A duplicate is the same description: its lock is the one already held.
        assert!(try_exclusive(&duplicate).unwrap());
        unlock(file.fd()).unwrap();

        assert!(try_shared(reader.fd()).unwrap());
        assert!(!try_exclusive(file.fd()).unwrap());
        let second = file.reopen(false).unwrap();
        assert!(try_shared(second.fd()).unwrap());
        drop(reader);
        assert!(!try_exclusive(file.fd()).unwrap());
        drop(second); // the last shared holder closes: its lock goes with it
        assert!(try_exclusive(file.fd()).unwrap());
    }
}
