//! A segment's open files, and their reuse: the files of fresh copies' and shared trees'
//! segments whose every view, handle and pin here is gone are kept (up to these limits: a few
//! arrays of up to 1 GiB each, on a machine of 16 GiB or more) for the next fresh copy (or tree)
//! of the same size, which then costs a copy into memory already there instead of allocating
//! it (page faults are most of a fresh share's time). A kept segment is reused only once no
//! other process holds a lock on it: none can still see it. The two kinds are kept apart: a
//! fresh copy's segment is sealed against writes once written (`freeze`), a tree's is written
//! again at every update, and by receivers of a writable tree.

use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use super::per_process::PerProcess;
use dlpack_core::error::Result;
use dlpack_core::share::{Mapping, SealedFile, lock, system};

/// What a kept segment may be reused for: what it was made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reuse {
    /// A fresh copy (`share` of memory not shared yet): frozen once written.
    Copy,
    /// A shared tree.
    Tree,
}

/// At most this many segments are kept.
pub const POOL_SEGMENTS: usize = 4;

/// At most this many bytes are kept: 2 GiB, or an eighth of the machine's memory if less.
pub fn pool_bytes() -> u64 {
    static BYTES: OnceLock<u64> = OnceLock::new();
    *BYTES.get_or_init(|| (2u64 << 30).min(system::physical_memory() / 8))
}

/// A segment's open files, which outlive the segment when it is kept for reuse.
#[derive(Debug)]
pub struct Files {
    /// The one mapped (and, in a process that did not make the segment, locked).
    file: SealedFile,
    /// A read-only open of the same file, lent to read-only handles (opened once, when first
    /// asked), through which no process can map the memory writable.
    readonly: OnceLock<SealedFile>,
    /// Opens of a forked child's own, holding its locks.
    held: Mutex<Vec<SealedFile>>,
    /// What the process that made it may reuse it for, if anything (`maker`: a forked child
    /// never reuses what it inherited).
    reuse: Option<Reuse>,
    maker: i32,
    /// Sealed against writes (a fresh copy once written: see `SealedFile::freeze`).
    frozen: AtomicBool,
    /// The maker's writable mapping of a frozen or a tree's segment, kept while no view needs
    /// it (see `keep_writer`).
    writer: Mutex<Option<Mapping>>,
}

impl Files {
    pub fn new(file: SealedFile, reuse: Option<Reuse>) -> Files {
        Files {
            file,
            readonly: OnceLock::new(),
            held: Mutex::new(Vec::new()),
            reuse,
            maker: system::pid(),
            frozen: AtomicBool::new(false),
            writer: Mutex::new(None),
        }
    }

    /// Seal the file against writes from now on (once written, a fresh copy never changes):
    /// no process can map it writable, whatever its handle's state says.
    pub fn freeze(&self) -> Result<()> {
        if !self.frozen.load(Ordering::Acquire) && self.file.freeze()? {
            self.frozen.store(true, Ordering::Release);
        }
        Ok(())
    }

    pub fn frozen(&self) -> bool {
        self.frozen.load(Ordering::Acquire)
    }

    /// Keep `mapping` (this process's writable one) for reuse, if the segment may be reused
    /// here: a frozen copy's (the only way left to write it), or a tree's (mapped, its pages
    /// faulted in, already); otherwise it is unmapped.
    pub fn keep_writer(&self, mapping: Mapping) {
        let kept = match self.reuse {
            Some(Reuse::Copy) => self.frozen(),
            Some(Reuse::Tree) => true,
            None => false,
        };
        if kept && self.maker == system::pid() {
            *self.writer.lock().unwrap_or_else(PoisonError::into_inner) = Some(mapping);
        }
    }

    pub fn has_writer(&self) -> bool {
        self.writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// The writable mapping kept, if any.
    pub fn take_writer(&self) -> Option<Mapping> {
        self.writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Whether this process opened them (a forked child shares its parent's descriptions, and
    /// so their locks).
    pub fn opened_here(&self) -> bool {
        self.maker == system::pid()
    }

    /// The file mapped.
    pub fn file(&self) -> &SealedFile {
        &self.file
    }

    pub fn size(&self) -> u64 {
        self.file.size()
    }

    /// A read-only open of the file (made once).
    pub fn readonly(&self) -> Result<BorrowedFd<'_>> {
        if let Some(readonly) = self.readonly.get() {
            return Ok(readonly.fd());
        }
        let opened = self.file.reopen(false)?;
        Ok(self.readonly.get_or_init(|| opened).fd())
    }

    /// A shared lock of this process's own on the file (in a forked child that inherited a
    /// mapping of it), kept while the files are; false without /proc.
    pub fn hold(&self) -> bool {
        let Ok(file) = self.file.reopen(false) else {
            return false;
        };
        if !lock::try_shared(file.fd()).unwrap_or(false) {
            return false;
        }
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.push(file);
        true
    }

    /// The exclusive lock, taken without waiting: whether no other process holds a lock.
    fn lock_exclusive(&self) -> bool {
        lock::try_exclusive(self.file.fd()).unwrap_or(false)
    }

    /// The segment is gone: keep its files for reuse, or close them.
    pub fn release(self) {
        if self.reuse.is_some() && self.maker == system::pid() {
            keep(self);
        }
    }
}

/// Oldest first.
static POOL: PerProcess<VecDeque<Files>> = PerProcess::new(VecDeque::new);

/// Keep `files` for reuse, unless they are too large to keep (then closed). The oldest kept
/// beyond the limits are closed.
fn keep(files: Files) {
    if files.size() > pool_bytes() {
        return;
    }
    let evicted = {
        let mut pool = POOL.lock();
        pool.push_back(files);
        let mut evicted = Vec::new();
        while pool.len() > POOL_SEGMENTS || pool.iter().map(Files::size).sum::<u64>() > pool_bytes()
        {
            evicted.extend(pool.pop_front());
        }
        evicted
    };
    drop(evicted); // closed outside the lock
}

/// Kept files of `size` bytes for `reuse` that no other process locks, locked exclusively (the
/// caller unlocks them once it has written the segment's new generation), or `None`.
pub fn take(size: u64, reuse: Reuse) -> Option<Files> {
    let mut pool = POOL.lock();
    let index = pool.iter().position(|files| {
        files.size() == size && files.reuse == Some(reuse) && files.lock_exclusive()
    })?;
    pool.remove(index)
}

/// How many segments are kept.
pub fn kept() -> usize {
    POOL.lock().len()
}

/// Close the segments kept, returning their memory.
pub fn clear() {
    let kept = std::mem::take(&mut *POOL.lock());
    drop(kept);
}

/// In a forked child: the kept segments are the parent's to reuse; the child closes its copies
/// of their descriptors (the parent keeps its own).
pub fn renew_in_child() {
    if let Some(mut old) = POOL.renew() {
        old.clear();
    }
}
