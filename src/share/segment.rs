//! Segments: a memory file at one generation, and this process's mapping of it. Every segment ends in a
//! trailer holding its generation: a random number, new each time the segment is reused for
//! other data, which handles carry, so that a handle to earlier contents can't open the new
//! ones. A segment is made here (`create`, `reuse`), or adopted from a descriptor a handle led
//! to (`adopt`); it is registered while it lives (`registry`), and its files go back to the
//! pool (`pool`) or are closed when it dies.
//!
//! Every process that maps a segment it did not make holds a shared lock on it (`os::lock`),
//! on a description of its own; its maker reuses it only once it can take the exclusive lock.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use super::os::{Error, FileId, Mapping, Result, SealedFile, Writes, lock, system};
use super::{pool, registry};

/// Bytes of the generation at the end of every segment.
pub const TRAILER: u64 = 8;

/// The length of a segment for `nbytes` bytes of elements: rounded up to whole 8-byte words
/// (so the generation is aligned), then the trailer.
pub fn file_size(nbytes: u64) -> Option<u64> {
    nbytes
        .checked_next_multiple_of(TRAILER)?
        .checked_add(TRAILER)
}

/// Why a descriptor received for a handle was not adopted.
#[derive(Debug)]
pub enum Refused {
    /// The segment holds other contents than the handle's now (or is being rewritten).
    Stale,
    /// Anything else: not the segment named, or a system call failed.
    Other(Error),
}

impl From<Error> for Refused {
    fn from(err: Error) -> Self {
        Refused::Other(err)
    }
}

/// The error of a handle whose contents are gone.
pub fn stale() -> Error {
    Error::buffer(
        "this handle was already opened from its pickle, and its memory has been reused since \
         (each pickle opens while its memory is still shared)",
    )
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
    /// Whether the process that made it may reuse it (`maker`: a forked child never reuses what
    /// it inherited).
    poolable: bool,
    maker: i32,
}

impl Files {
    fn new(file: SealedFile, poolable: bool) -> Files {
        Files {
            file,
            readonly: OnceLock::new(),
            held: Mutex::new(Vec::new()),
            poolable,
            maker: system::pid(),
        }
    }

    pub fn size(&self) -> u64 {
        self.file.size()
    }

    /// The exclusive lock, taken without waiting: whether no other process holds a lock.
    pub fn lock_exclusive(&self) -> bool {
        lock::try_exclusive(self.file.fd()).unwrap_or(false)
    }

    /// The segment is gone: keep its files for reuse, or close them.
    fn release(self) {
        if self.poolable && self.maker == system::pid() {
            drop(pool::keep(self));
        }
    }
}

/// A memory file at one generation, as this process holds it: its files, and whether it is
/// mapped writable here. It lives while a mapping of it does (`Mapped`), or while the lender
/// holds it for a handle in flight; its files go back to the pool or are closed when it dies.
#[derive(Debug)]
pub struct Segment {
    /// Taken when the segment dies (to the pool, or closed).
    files: Option<Files>,
    generation: u64,
    writable: bool,
}

/// This process's mapping of a whole segment, registered while it lives; what views of the
/// segment hold (`Owner::Mapped`), unmapped when the last of them goes.
#[derive(Debug)]
pub struct Mapped {
    mapping: Mapping,
    segment: Arc<Segment>,
}

impl Segment {
    /// A new zero-filled segment for `nbytes` bytes (at least 1), mapped writable; `poolable`:
    /// kept for reuse once nothing maps it.
    pub fn create(nbytes: u64, poolable: bool) -> Result<Arc<Mapped>> {
        let size = file_size(nbytes.max(1))
            .ok_or_else(|| Error::Memory(format!("can't share {nbytes} bytes")))?;
        let file = SealedFile::create(c"dlpack-share", size)?;
        let segment = Segment::new(Files::new(file, poolable), new_generation()?, true);
        let mapped = segment.map(false)?;
        mapped.write_generation();
        Ok(mapped.registered())
    }

    /// A kept segment for `nbytes` bytes that no process maps any more, mapped writable (its
    /// pages faulted in) with a new generation, or `None`. The exclusive lock taken to find it
    /// unmapped is held until the new generation is written, so a process opening an old handle
    /// meanwhile finds the lock (or the new generation) and refuses.
    pub fn reuse(nbytes: u64) -> Result<Option<Arc<Mapped>>> {
        let Some(files) = file_size(nbytes.max(1)).and_then(pool::take) else {
            return Ok(None);
        };
        // On failure the files are closed or kept again, their lock with them.
        let mapped = new_generation().and_then(|g| Segment::new(files, g, true).map(true))?;
        mapped.write_generation();
        let _ = lock::unlock(mapped.segment.files().file.fd());
        Ok(Some(mapped.registered()))
    }

    /// Map a descriptor received for a handle, after checking it is the sealed memory file of
    /// `size` bytes that `id` names, at `generation`; the descriptor is the segment's from now
    /// on (closed on failure). `own_description`: it was opened here (through /proc), not
    /// passed (a passed one shares the lender's file description, and so its locks: this
    /// process then opens one of its own).
    pub fn adopt(
        fd: OwnedFd,
        id: FileId,
        size: u64,
        generation: u64,
        writable: bool,
        own_description: bool,
    ) -> std::result::Result<Arc<Mapped>, Refused> {
        let mut file = SealedFile::check(fd, id, size, writable)?;
        if !own_description {
            file = file.reopen(file.writable())?;
        }
        if !lock::try_shared(file.fd())? {
            return Err(Refused::Stale); // its maker is reusing it for other data right now
        }
        let mapped = Segment::new(Files::new(file, false), generation, writable).map(false)?;
        if mapped.read_generation() != generation {
            return Err(Refused::Stale);
        }
        Ok(mapped.registered())
    }

    fn new(files: Files, generation: u64, writable: bool) -> Arc<Segment> {
        Arc::new(Segment {
            files: Some(files),
            generation,
            writable,
        })
    }

    /// A new mapping of all of the segment (not registered yet): shared if the segment is
    /// writable here, otherwise copy-on-write (the maker's memory can't be written through it,
    /// see `Writes`).
    fn map(self: Arc<Segment>, populate: bool) -> Result<Mapped> {
        let writes = if self.writable {
            Writes::Shared
        } else {
            Writes::Private
        };
        let mapping = Mapping::new(&self.files().file, writes, populate)?;
        Ok(Mapped {
            mapping,
            segment: self,
        })
    }

    /// This process's mapping of the segment: the live one, or a new one.
    pub fn mapped(self: &Arc<Segment>) -> Result<Arc<Mapped>> {
        if let Some(mapped) = registry::named(self.id(), self.writable)
            && Arc::ptr_eq(&mapped.segment, self)
        {
            return Ok(mapped);
        }
        Ok(self.clone().map(false)?.registered())
    }

    fn files(&self) -> &Files {
        self.files.as_ref().expect("a live segment holds its files")
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
        self.files().file.id()
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether it is mapped so that writes reach the file (so it may be shared writable).
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// The descriptor to lend: the mapped one for a writable handle (or when this process's
    /// mapping is not writable either), otherwise a read-only open of the file.
    pub fn fd_for(&self, writable: bool) -> Result<BorrowedFd<'_>> {
        let files = self.files();
        if writable || !self.writable {
            return Ok(files.file.fd());
        }
        if let Some(readonly) = files.readonly.get() {
            return Ok(readonly.fd());
        }
        let opened = files.file.reopen(false)?;
        Ok(files.readonly.get_or_init(|| opened).fd())
    }

    /// In a forked child that inherited a mapping of this segment: a lock of the child's own,
    /// so that the parent, whose locks don't count its own mappings, can't reuse the segment
    /// while the child sees it (without /proc, nothing: the parent may).
    pub fn hold_after_fork(&self) {
        let files = self.files();
        if let Ok(file) = files.file.reopen(false)
            && lock::try_shared(file.fd()).unwrap_or(false)
        {
            let mut held = files.held.lock().unwrap_or_else(PoisonError::into_inner);
            held.push(file);
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if let Some(files) = self.files.take() {
            files.release();
        }
    }
}

fn new_generation() -> Result<u64> {
    Ok(u64::from_le_bytes(system::random::<8>()?))
}

impl Mapped {
    fn registered(self) -> Arc<Mapped> {
        let mapped = Arc::new(self);
        registry::register(&mapped);
        mapped
    }

    fn trailer(&self) -> usize {
        self.mapping.len() - TRAILER as usize
    }

    fn read_generation(&self) -> u64 {
        self.mapping.read_word(self.trailer())
    }

    fn write_generation(&self) {
        self.mapping
            .write_word(self.trailer(), self.segment.generation);
    }

    pub fn segment(&self) -> &Arc<Segment> {
        &self.segment
    }

    /// The address of the mapping.
    pub fn base(&self) -> *mut u8 {
        self.mapping.as_ptr()
    }

    /// Fault the first `len` bytes' pages in from several threads (see `Mapping::populate`).
    pub fn populate(&self, len: usize) -> Result<()> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.mapping
            .populate(len, threads.min(4).min(len >> 21).max(1))
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // Forgotten before it is unmapped: its address may be reused from then on.
        registry::forget(self);
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

    #[test]
    fn adopting_checks_generation_and_lock() {
        let mapped = Segment::create(100, false).unwrap();
        let made = mapped.segment();
        assert_eq!((made.size(), made.capacity()), (112, 104));
        let fd = || made.fd_for(false).unwrap().try_clone_to_owned().unwrap();
        let id = made.id();

        let opened = Segment::adopt(fd(), id, 112, made.generation(), false, false).unwrap();
        assert!(!opened.segment().writable());
        assert!(!made.files().lock_exclusive()); // the reader's lock

        let old = made.generation().wrapping_add(1);
        assert!(matches!(
            Segment::adopt(fd(), id, 112, old, false, false),
            Err(Refused::Stale)
        ));
        assert!(matches!(
            Segment::adopt(fd(), id, 112, made.generation(), true, false),
            Err(Refused::Other(Error::Buffer(_)))
        ));
        drop(opened);
        assert!(made.files().lock_exclusive());
        // Locked exclusively, as while its maker rewrites it: refused.
        assert!(matches!(
            Segment::adopt(fd(), id, 112, made.generation(), false, false),
            Err(Refused::Stale)
        ));
    }
}
