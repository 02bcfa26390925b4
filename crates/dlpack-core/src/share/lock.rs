//! Whole-file locks held by an open file description (`flock`): descriptors duplicated from one
//! another (inherited by a forked child, passed over a socket) share one lock, another open of
//! the same file is another holder, and the kernel drops a lock when the last descriptor of its
//! description closes, or its process dies. A process that maps a segment it did not make holds
//! a shared lock on it; its maker takes the exclusive one to learn that nobody else does.
//!
//! A shared tree's writers hold another lock (`WriteLock`): a write lock of an open file
//! description on the whole file (`F_OFD_SETLK`). Linux keeps these apart from `flock`'s, so
//! the readers' shared `flock`s don't stand in its way; it too goes when its description's
//! last descriptor closes or its process dies, and readers see whether it is held without
//! taking anything (`write_locked`). This process's own threads share its descriptions, and so
//! the lock: they take turns first (`Writers`), and a writer's word that it writes alone
//! (`WriteLock::exclusive`) asks for both.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Instant;

use rustix::fs::{FlockOperation, flock};
use rustix::io::Errno;

use super::seqlock::Exclusive;
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

/// The writers' lock of a file, held by this open file description until dropped: while it is
/// held no other description's holder writes (this process's other threads share the
/// description: their turns, `Writers`, keep them out).
#[derive(Debug)]
pub struct WriteLock<'a> {
    fd: BorrowedFd<'a>,
}

impl<'a> WriteLock<'a> {
    /// Take the lock without waiting through `fd` (open for writing): `None` while another
    /// description holds it (or a reader looks, see `write_locked`).
    pub fn try_take(fd: BorrowedFd<'a>) -> Result<Option<WriteLock<'a>>> {
        match ofd_lock(fd, libc::F_OFD_SETLK, libc::F_WRLCK) {
            Ok(_) => Ok(Some(WriteLock { fd })),
            Err(Errno::AGAIN | Errno::ACCESS) => Ok(None),
            Err(errno) => Err(Error::os("fcntl(F_OFD_SETLK)")(errno)),
        }
    }

    /// The writer's word that it writes alone: the lock keeps other descriptions' writers out,
    /// `turn` this process's other threads (which may hold the lock through the same
    /// description).
    pub fn exclusive(&self, _turn: &Turn<'_>) -> Exclusive<'_> {
        Exclusive::held()
    }
}

/// This process's writers of one file, one at a time: the writers' lock belongs to an open file
/// description, which a process's threads share (a second `WriteLock::try_take` through it
/// succeeds, and either's drop lets go of both). Threads wait for their turn here first.
#[derive(Debug, Default)]
pub struct Writers {
    /// The process whose thread has the turn: a child forked meanwhile finds its parent's
    /// there, which no thread of its own will give back (nor is writing).
    holder: Mutex<Option<u32>>,
    free: Condvar,
}

/// A thread's turn to write (see `Writers`), until dropped.
#[derive(Debug)]
#[must_use = "the turn ends when dropped"]
pub struct Turn<'a> {
    writers: &'a Writers,
}

impl Writers {
    pub const fn new() -> Writers {
        Writers {
            holder: Mutex::new(None),
            free: Condvar::new(),
        }
    }

    /// The turn, if no other thread has it.
    pub fn try_turn(&self) -> Option<Turn<'_>> {
        let me = std::process::id();
        let mut holder = self.holder.lock().unwrap_or_else(PoisonError::into_inner);
        if *holder == Some(me) {
            return None;
        }
        *holder = Some(me);
        Some(Turn { writers: self })
    }

    /// The turn, once the thread that has it is done, or `None` at `deadline` (blocking: a
    /// caller holding anything that thread may need, such as the GIL, lets go of it first).
    pub fn turn(&self, deadline: Option<Instant>) -> Option<Turn<'_>> {
        let me = std::process::id();
        let mut holder = self.holder.lock().unwrap_or_else(PoisonError::into_inner);
        while *holder == Some(me) {
            holder = match deadline {
                None => self
                    .free
                    .wait(holder)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let left = deadline.checked_duration_since(Instant::now())?;
                    let (holder, _) = (self.free.wait_timeout(holder, left))
                        .unwrap_or_else(PoisonError::into_inner);
                    holder
                }
            };
        }
        *holder = Some(me);
        Some(Turn { writers: self })
    }

    /// Whether a thread of this process has the turn (and so lives, and may be writing).
    pub fn busy(&self) -> bool {
        *self.holder.lock().unwrap_or_else(PoisonError::into_inner) == Some(std::process::id())
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        *self
            .writers
            .holder
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        self.writers.free.notify_one();
    }
}

impl Drop for WriteLock<'_> {
    fn drop(&mut self) {
        // Fails only for a descriptor that is not open, which a borrowed one is.
        let _ = ofd_lock(self.fd, libc::F_OFD_SETLK, libc::F_UNLCK);
    }
}

/// Whether another open file description than `fd`'s holds the writers' lock of its file.
pub fn write_locked(fd: BorrowedFd<'_>) -> Result<bool> {
    let found =
        ofd_lock(fd, libc::F_OFD_GETLK, libc::F_RDLCK).map_err(Error::os("fcntl(F_OFD_GETLK)"))?;
    Ok(found != libc::F_UNLCK)
}

/// `fcntl(fd, command, lock)` for a lock of type `kind` on the whole file: the lock's type
/// after the call (`F_OFD_GETLK` writes there the type of a lock in the way, or `F_UNLCK`).
fn ofd_lock(
    fd: BorrowedFd<'_>,
    command: libc::c_int,
    kind: libc::c_int,
) -> std::result::Result<libc::c_int, Errno> {
    // SAFETY: `flock` is plain data, for which all zeroes is a valid value.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short; // from 0, `l_len` 0: the whole file
    loop {
        // SAFETY: a live descriptor, and a `flock` this call reads and (for F_OFD_GETLK)
        // writes, valid for the whole call; `l_pid` is 0, as OFD locks need.
        let done = unsafe { libc::fcntl(fd.as_raw_fd(), command, &raw mut lock) };
        if done != -1 {
            return Ok(libc::c_int::from(lock.l_type));
        }
        let errno = Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::IO);
        if errno != Errno::INTR {
            return Err(errno);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::memfd::SealedFile;
    use super::*;

    #[test]
    fn writers_lock_one_description_at_a_time_and_readers_see_it() {
        let file = SealedFile::create(c"test", 4096).unwrap();
        let other = file.reopen(true).unwrap();
        let reader = file.reopen(false).unwrap();
        assert!(!write_locked(reader.fd()).unwrap());
        // Readers' flocks are no obstacle.
        assert!(try_shared(reader.fd()).unwrap());
        let held = WriteLock::try_take(file.fd()).unwrap().unwrap();
        assert!(write_locked(reader.fd()).unwrap());
        assert!(write_locked(other.fd()).unwrap());
        assert!(!write_locked(file.fd()).unwrap()); // its own description's is no conflict
        assert!(WriteLock::try_take(other.fd()).unwrap().is_none());
        drop(held);
        assert!(!write_locked(reader.fd()).unwrap());
        let taken = WriteLock::try_take(other.fd()).unwrap().unwrap();
        assert!(WriteLock::try_take(file.fd()).unwrap().is_none());
        // Closing the description drops its lock.
        std::mem::forget(taken);
        drop(other);
        assert!(!write_locked(reader.fd()).unwrap());
        // A read-only description can't take it.
        assert!(WriteLock::try_take(reader.fd()).is_err());
    }

    #[test]
    fn writers_of_one_process_take_turns() {
        let writers = Writers::new();
        assert!(!writers.busy());
        let turn = writers.try_turn().unwrap();
        assert!(writers.busy());
        assert!(writers.try_turn().is_none());
        // The description's lock doesn't keep the process's own threads apart: the turn does.
        let file = SealedFile::create(c"test", 4096).unwrap();
        let held = WriteLock::try_take(file.fd()).unwrap().unwrap();
        assert!(WriteLock::try_take(file.fd()).unwrap().is_some());
        let _alone = held.exclusive(&turn);
        let inside = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            let waiting: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        let _turn = writers.turn(None).unwrap();
                        let was = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        std::thread::yield_now();
                        inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        was
                    })
                })
                .collect();
            drop(turn);
            for thread in waiting {
                assert_eq!(
                    thread.join().unwrap(),
                    0,
                    "two threads had the turn at once"
                );
            }
        });
        assert!(!writers.busy());
        let held = writers.try_turn().unwrap();
        assert!(
            writers.turn(Some(Instant::now())).is_none(),
            "waited past its deadline"
        );
        drop(held);
        assert!(writers.turn(Some(Instant::now())).is_some());
    }

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
