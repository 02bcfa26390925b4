//! Segments: a memory file at one generation, as this process holds it. Every segment ends in
//! a trailer holding its generation: a random number, new each time the segment is reused for
//! other data, which handles carry, so that a handle to earlier contents can't open the new
//! ones. A segment lives while a mapping of it does (`mapped`), or while the lender holds it for
//! a handle in flight; its files go back to the pool, or are closed, when it dies.

use std::os::fd::BorrowedFd;
use std::sync::Arc;

use super::pool::Files;
use dlpack_core::error::Result;
use dlpack_core::share::{FileId, Mapping, Writes, system};

/// Bytes of the generation at the end of every segment.
pub const TRAILER: u64 = 8;

/// The length of a segment for `nbytes` bytes of elements: rounded up to whole 8-byte words
/// (so the generation is aligned), then the trailer.
pub fn file_size(nbytes: u64) -> Option<u64> {
    nbytes
        .checked_next_multiple_of(TRAILER)?
        .checked_add(TRAILER)
}

/// A new generation number.
pub fn new_generation() -> Result<u64> {
    Ok(u64::from_le_bytes(system::random::<8>()?))
}

#[derive(Debug)]
pub struct Segment {
    /// Taken when the segment dies (to the pool, or closed).
    files: Option<Files>,
    generation: u64,
    /// Whether it is mapped so that writes reach the file (so it may be shared writable);
    /// otherwise copy-on-write.
    writable: bool,
}

impl Segment {
    pub fn new(files: Files, generation: u64, writable: bool) -> Arc<Segment> {
        Arc::new(Segment {
            files: Some(files),
            generation,
            writable,
        })
    }

    pub fn files(&self) -> &Files {
        self.files.as_ref().expect("a live segment holds its files")
    }

    /// A mapping of all of the segment: the maker's writable one kept for a frozen segment, or
    /// a new one, shared if the segment is writable here (and not frozen), otherwise
    /// copy-on-write (the maker's memory can't be written through it, see `Writes`).
    pub fn map(&self, populate: bool) -> Result<(Mapping, Writes)> {
        if let Some(writer) = self.files().take_writer() {
            return Ok((writer, Writes::Shared));
        }
        let writes = if self.writable && !self.files().frozen() {
            Writes::Shared
        } else {
            Writes::Private
        };
        Ok((Mapping::new(self.files().file(), writes, populate)?, writes))
    }

    /// Bytes of the file, trailer included.
    pub fn size(&self) -> u64 {
        self.files().size()
    }

    /// Bytes the elements may take: the file without its trailer.
    pub fn capacity(&self) -> u64 {
        self.size() - TRAILER
    }

    pub fn id(&self) -> FileId {
        self.files().file().id()
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn writable(&self) -> bool {
        self.writable
    }

    /// The descriptor to lend: the mapped one for a writable handle (or when this process's
    /// mapping is not writable either), otherwise a read-only open of the file, through which no
    /// process can map the memory writable.
    pub fn fd_for(&self, writable: bool) -> Result<BorrowedFd<'_>> {
        if writable || !self.writable {
            return Ok(self.files().file().fd());
        }
        self.files().readonly()
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if let Some(files) = self.files.take() {
            files.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_hold_the_trailer() {
        assert_eq!(file_size(1), Some(16));
        assert_eq!(file_size(8), Some(16));
        assert_eq!(file_size(9), Some(24));
        assert_eq!(file_size(u64::MAX), None);
    }
}
