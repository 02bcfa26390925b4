//! Reuse: the files of fresh copies' segments whose every view, handle and pin here is gone are
//! kept (up to these limits: a few arrays of up to 1 GiB each, on a machine of 16 GiB or more)
//! for the next fresh copy of the same size, which then costs a copy into memory already there
//! instead of allocating it (page faults are most of a fresh share's time). A kept segment is
//! reused only once no other process holds a lock on it: none can still see it.

use std::collections::VecDeque;
use std::sync::OnceLock;

use super::os::system;
use super::per_process::PerProcess;
use super::segment::Files;

/// At most this many segments are kept.
pub const POOL_SEGMENTS: usize = 4;

/// At most this many bytes are kept: 2 GiB, or an eighth of the machine's memory if less.
pub fn pool_bytes() -> u64 {
    static BYTES: OnceLock<u64> = OnceLock::new();
    *BYTES.get_or_init(|| (2u64 << 30).min(system::physical_memory() / 8))
}

/// Oldest first.
static POOL: PerProcess<VecDeque<Files>> = PerProcess::new(VecDeque::new);

/// Keep `files` for reuse; handed back (to be closed) when they are too large to keep. The
/// oldest kept beyond the limits are closed.
pub fn keep(files: Files) -> Option<Files> {
    if files.size() > pool_bytes() {
        return Some(files);
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
    None
}

/// Kept files of `size` bytes that no other process locks, locked exclusively (the caller
/// unlocks them once it has written the segment's new generation), or `None`.
pub fn take(size: u64) -> Option<Files> {
    let mut pool = POOL.lock();
    let index = pool
        .iter()
        .position(|files| files.size() == size && files.lock_exclusive())?;
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
