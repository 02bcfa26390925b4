//! This process's mappings of segments (`Mapped`), each of a whole segment and registered
//! while it lives: what views of a segment hold (`Owner::Held`), unmapped when the last of
//! them goes. Segments come mapped from here: made (`create`), reused (`reuse`), or adopted from
//! a descriptor a handle led to (`adopt`).
//!
//! Every process that maps a segment it did not make holds a shared lock on it (`os::lock`),
//! on a description of its own; its maker reuses it only once it can take the exclusive lock.

use std::mem::ManuallyDrop;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Weak};

use super::lender;
use super::per_process::PerProcess;
use super::pool::{self, Files};
use super::registry::{Entry, Registry};
use super::segment::{Segment, TRAILER, file_size, new_generation};
use dlpack_core::available;
use dlpack_core::error::{Error, Result};
use dlpack_core::share::{FileId, Mapping, SealedFile, Writes, lock};

#[derive(Debug)]
pub struct Mapped {
    /// Taken only when the mapping dies (kept with a frozen segment's files, or unmapped).
    mapping: ManuallyDrop<Mapping>,
    /// Whether writes through it reach the segment, or are this process's own.
    writes: Writes,
    segment: Arc<Segment>,
}

static REGISTRY: PerProcess<Registry<Mapped>> = PerProcess::new(Registry::default);

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

impl Entry for Mapped {
    fn base(&self) -> usize {
        self.mapping.as_ptr() as usize
    }

    fn capacity(&self) -> usize {
        self.mapping.len() - TRAILER as usize
    }

    fn key(&self) -> (FileId, bool) {
        (self.segment.id(), self.segment.writable())
    }
}

impl Mapped {
    /// A new zero-filled segment for `nbytes` bytes (at least 1), mapped writable; `poolable`:
    /// kept for reuse once nothing maps it.
    pub fn create(nbytes: u64, poolable: bool) -> Result<Arc<Mapped>> {
        let size = file_size(nbytes.max(1))
            .ok_or_else(|| Error::Memory(format!("can't share {nbytes} bytes")))?;
        // Before the file exists: its pages are only had when touched, too late to refuse.
        available::check(nbytes, "shared memory").map_err(|err| Error::Memory(err.to_string()))?;
        // A poolable segment (a fresh copy's) is frozen once written (`freeze`).
        let file = if poolable {
            SealedFile::create_freezable(c"dlpack-share", size)?
        } else {
            SealedFile::create(c"dlpack-share", size)?
        };
        let segment = Segment::new(Files::new(file, poolable), new_generation()?, true);
        let mapped = Mapped::new(segment, false)?;
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
        // A frozen segment can only be written through the writable mapping kept with it.
        if files.frozen() && !files.has_writer() {
            return Ok(None); // closed
        }
        // On failure the files are closed or kept again, their lock with them.
        let segment = Segment::new(files, new_generation()?, true);
        let mapped = Mapped::new(segment, true)?;
        mapped.write_generation();
        let _ = lock::unlock(mapped.segment.files().file().fd());
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
        let mut file = SealedFile::check(fd, Some(id), size, writable)?;
        if !own_description {
            file = file.reopen(file.writable())?;
        }
        if !lock::try_shared(file.fd())? {
            return Err(Refused::Stale); // its maker is reusing it for other data right now
        }
        let segment = Segment::new(Files::new(file, false), generation, writable);
        let mapped = Mapped::new(segment, false)?;
        if mapped.mapping.read_word(mapped.trailer()) != generation {
            return Err(Refused::Stale);
        }
        Ok(mapped.registered())
    }

    /// This process's mapping of `segment`: the live one, or a new one.
    pub fn of(segment: &Arc<Segment>) -> Result<Arc<Mapped>> {
        let live = REGISTRY.lock().named(segment.id(), segment.writable());
        if let Some(mapped) = live
            && Arc::ptr_eq(&mapped.segment, segment)
        {
            return Ok(mapped);
        }
        Ok(Mapped::new(segment.clone(), false)?.registered())
    }

    /// The live mapping whose elements hold the addresses `[low, high)`.
    pub fn at(low: usize, high: usize) -> Option<Arc<Mapped>> {
        let mapped = REGISTRY.lock().at(low)?;
        (high <= mapped.base().saturating_add(mapped.capacity())).then_some(mapped)
    }

    /// The live mapping of the file `id`, writable if asked (a read-only handle is served by
    /// either).
    pub fn named(id: FileId, writable: bool) -> Option<Arc<Mapped>> {
        REGISTRY.lock().named(id, writable)
    }

    /// How many segments this process maps.
    pub fn live() -> usize {
        REGISTRY.lock().live()
    }

    fn new(segment: Arc<Segment>, populate: bool) -> Result<Mapped> {
        let (mapping, writes) = segment.map(populate)?;
        Ok(Mapped {
            mapping: ManuallyDrop::new(mapping),
            writes,
            segment,
        })
    }

    /// Whether writes through this mapping are this process's own (copy-on-write).
    pub fn is_private(&self) -> bool {
        self.writes == Writes::Private
    }

    /// Seal the segment against writes from now on (a fresh copy, written): this mapping
    /// still writes (and is kept for the segment's reuse), no new one can.
    pub fn freeze(&self) -> Result<()> {
        self.segment.files().freeze()
    }

    fn registered(self) -> Arc<Mapped> {
        let mapped = Arc::new(self);
        REGISTRY.lock().insert(&mapped);
        mapped
    }

    fn trailer(&self) -> usize {
        self.mapping.len() - TRAILER as usize
    }

    fn write_generation(&self) {
        self.mapping
            .write_word(self.trailer(), self.segment.generation());
    }

    pub fn segment(&self) -> &Arc<Segment> {
        &self.segment
    }

    /// The address of the mapping.
    pub fn base_ptr(&self) -> *mut u8 {
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
        REGISTRY.lock().remove(self);
        // SAFETY: taken once, here, and the field is not used after.
        let mapping = unsafe { ManuallyDrop::take(&mut self.mapping) };
        if self.writes == Writes::Shared && self.segment.files().frozen() {
            self.segment.files().keep_writer(mapping); // unmapped there unless reusable
        }
        // Handles of the segment released since the lender last looked no longer keep it.
        lender::sweep();
    }
}

/// In a forked child: a registry of its own, empty; the mappings the parent's held at the fork
/// (for `hold_in_child`).
pub fn renew_in_child() -> Vec<Weak<Mapped>> {
    REGISTRY.renew().map_or_else(Vec::new, |old| old.entries())
}

/// In a forked child: the inherited mappings still alive, registered, each segment with a lock
/// of the child's own, so that the parent, whose locks don't count its own mappings, can't
/// reuse the segment while the child sees it (without /proc, nothing: the parent may).
pub fn hold_in_child(inherited: Vec<Weak<Mapped>>) {
    let alive: Vec<Arc<Mapped>> = inherited.iter().filter_map(Weak::upgrade).collect();
    for mapped in &alive {
        REGISTRY.lock().insert(mapped);
        mapped.segment.files().hold();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adopting_checks_generation_and_lock() {
        let mapped = Mapped::create(100, false).unwrap();
        let made = mapped.segment();
        assert_eq!((made.size(), made.capacity()), (112, 104));
        let fd = || made.fd_for(false).unwrap().try_clone_to_owned().unwrap();
        let (id, generation) = (made.id(), made.generation());

        let opened = Mapped::adopt(fd(), id, 112, generation, false, false).unwrap();
        assert!(!opened.segment().writable());
        assert!(Arc::ptr_eq(&Mapped::named(id, false).unwrap(), &opened));
        assert!(!lock::try_exclusive(made.files().file().fd()).unwrap()); // the reader's lock

        let old = generation.wrapping_add(1);
        assert!(matches!(
            Mapped::adopt(fd(), id, 112, old, false, false),
            Err(Refused::Stale)
        ));
        assert!(matches!(
            Mapped::adopt(fd(), id, 112, generation, true, false),
            Err(Refused::Other(Error::Buffer(_)))
        ));
        drop(opened);
        assert!(lock::try_exclusive(made.files().file().fd()).unwrap());
        // Locked exclusively, as while its maker rewrites it: refused.
        assert!(matches!(
            Mapped::adopt(fd(), id, 112, generation, false, false),
            Err(Refused::Stale)
        ));
    }

    #[test]
    fn mappings_are_found_by_address() {
        let mapped = Mapped::create(4096, false).unwrap();
        let base = mapped.base();
        assert!(Arc::ptr_eq(
            &Mapped::at(base + 8, base + 4096).unwrap(),
            &mapped
        ));
        assert!(Mapped::at(base, base + 4097).is_none()); // into the trailer
        assert!(Arc::ptr_eq(&Mapped::of(mapped.segment()).unwrap(), &mapped));
    }
}
