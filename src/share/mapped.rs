//! This process's mappings of segments (`Mapped`), each of a whole segment and registered
//! while it lives: what views of a segment hold (`Owner::RustValue`), unmapped when the last of
//! them goes. Segments come mapped from here: made (`create`), reused (`reuse`), or adopted from
//! a descriptor a handle led to (`adopt`).
//!
//! Every process that maps a segment it did not make holds a shared lock on it (`os::lock`),
//! on a description of its own; its maker reuses it only once it can take the exclusive lock.
//!
//! A process maps a segment once (`one_of`), however many handles to it arrive, read-only or
//! writable: views of one memory then have one address, as the registry of borrowed memory
//! (keyed by address) needs to tell that a shared view and a mutable one alias. A read-only
//! handle's mapping is private (see `Writes::Private`); a writable handle of the same segment
//! arriving later turns it shared at the same address (`share_writes`), its read-only views
//! staying read-only by their flag, as the views of read-only handles are in a process that
//! maps the segment writable from the start (its maker's, or one that opened the writable
//! handle first). The alternatives fail: mapping every handle's memory shared and writable at
//! once needs a writable descriptor, which read-only handles never lend; a second, writable
//! mapping aliases the first at another address; and refusing the writable handle would make
//! the order handles arrive in matter.

use std::mem::ManuallyDrop;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use super::lender;
use super::per_process::PerProcess;
use super::pool::{self, Files, Reuse};
use super::registry::{Entry, Registry};
use super::segment::{Segment, TRAILER, file_size, new_generation};
use dlpack_core::available;
use dlpack_core::error::{Error, Result};
use dlpack_core::share::{FileId, Mapping, SealedFile, Writes, lock, private_pages};

#[derive(Debug)]
pub struct Mapped {
    /// Taken only when the mapping dies (kept with a frozen segment's files, or unmapped).
    mapping: ManuallyDrop<Mapping>,
    /// Whether writes through it reach the segment (`Writes::Shared`), or are this process's
    /// own; once true, for good.
    shared: AtomicBool,
    /// The segment as first mapped.
    segment: Arc<Segment>,
    /// The segment as a writable handle opened it, where that turned the mapping shared.
    writable: OnceLock<Arc<Segment>>,
    /// This process's writers of the segment in place (a shared tree's updates), one at a time.
    writers: lock::Writers,
}

static REGISTRY: PerProcess<Registry<Mapped>> = PerProcess::new(Registry::default);

/// Held while a segment is found mapped or mapped (`one_of`), so that two threads opening
/// handles of one segment at once map it once.
static OPENING: PerProcess<()> = PerProcess::new(|| ());

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

    fn file(&self) -> FileId {
        self.segment.id()
    }

    fn writable(&self) -> bool {
        !self.is_private()
    }
}

impl Mapped {
    /// A new zero-filled segment for `nbytes` bytes (at least 1), mapped writable; kept for
    /// `reuse` once nothing maps it, if given.
    pub fn create(nbytes: u64, reuse: Option<Reuse>) -> Result<Arc<Mapped>> {
        let size = file_size(nbytes.max(1))
            .ok_or_else(|| Error::Memory(format!("can't share {nbytes} bytes")))?;
        // Before the file exists: its pages are only had when touched, too late to refuse.
        available::check(nbytes, "shared memory").map_err(|err| Error::Memory(err.to_string()))?;
        // A fresh copy's segment is frozen once written (`freeze`).
        let file = if reuse == Some(Reuse::Copy) {
            SealedFile::create_freezable(c"dlpack-share", size)?
        } else {
            SealedFile::create(c"dlpack-share", size)?
        };
        let segment = Segment::new(Files::new(file, reuse), new_generation()?, true);
        let mapped = Mapped::new(segment, false)?;
        mapped.write_generation();
        Ok(mapped.registered())
    }

    /// A segment kept for `reuse`, of `nbytes` bytes, that no process maps any more, mapped
    /// writable (its pages faulted in) with a new generation, or `None`. The exclusive lock
    /// taken to find it unmapped is held until the new generation is written, so a process
    /// opening an old handle meanwhile finds the lock (or the new generation) and refuses.
    pub fn reuse(nbytes: u64, reuse: Reuse) -> Result<Option<Arc<Mapped>>> {
        let Some(files) = file_size(nbytes.max(1)).and_then(|size| pool::take(size, reuse)) else {
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
        let segment = Segment::new(Files::new(file, None), generation, writable);
        Mapped::one_of(&segment)
    }

    /// This process's mapping of `segment` (one its lender pinned).
    pub fn of(segment: &Arc<Segment>) -> Result<Arc<Mapped>> {
        Mapped::one_of(segment).map_err(|refused| match refused {
            Refused::Stale => stale(),
            Refused::Other(err) => err,
        })
    }

    /// This process's one mapping of `segment`'s file (see the module's doc), checked to hold
    /// its generation: the live one, made shared first if `segment` is writable and it is not,
    /// or else a new one.
    fn one_of(segment: &Arc<Segment>) -> std::result::Result<Arc<Mapped>, Refused> {
        let _opening = OPENING.lock();
        let live = REGISTRY.lock().named(segment.id(), false);
        let mapped = match live {
            Some(live) => live,
            None => Mapped::new(segment.clone(), false)?.registered(),
        };
        if mapped.mapping.read_word(mapped.trailer()) != segment.generation() {
            return Err(Refused::Stale);
        }
        if segment.writable() && mapped.is_private() {
            mapped.share_writes(segment)?;
        }
        Ok(mapped)
    }

    /// Turn this private mapping shared, at the same address, for `segment` (its file open for
    /// writing): refused where this process wrote into its read-only views, whose pages of its
    /// own the segment's would replace.
    fn share_writes(&self, segment: &Arc<Segment>) -> Result<()> {
        if !segment.writable() || segment.files().frozen() {
            return Err(Error::buffer(
                "a writable mapping needs the segment open for writing",
            ));
        }
        let (base, len) = (self.base(), self.mapping.len());
        let written = private_pages(base, len).ok_or_else(|| {
            Error::buffer(
                "a writable handle to this memory can't open here: this process maps it from a \
                 read-only handle, and /proc/self/pagemap, which tells whether it wrote into \
                 that view (pages the segment's would replace), can't be read. Let go of the \
                 arrays of the read-only handle first, or open the writable handle before it",
            )
        })?;
        if written {
            return Err(Error::buffer(
                "this process wrote into its read-only view of this memory (pages of its own, \
                 copy-on-write, which the segment never saw: torch writes so, whatever the \
                 read-only flag), so a writable handle to the same memory can't open here while \
                 those arrays live: their writes would be lost. Let go of the arrays of the \
                 read-only handle first, or open the writable handle before it",
            ));
        }
        // SAFETY: `segment` is the file this mapping maps (`one_of` found it by its identity,
        // and the trailer holds its generation), and no page of the mapping is this process's
        // own (just checked): every byte reads the same before and after. A thread writing
        // into a read-only view meanwhile, against its flag, may lose that write.
        unsafe { self.mapping.share_writes(segment.files().file()) }?;
        let _ = self.writable.set(segment.clone()); // only here, under `OPENING`
        self.shared.store(true, Ordering::Release);
        Ok(())
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
            shared: AtomicBool::new(writes == Writes::Shared),
            segment,
            writable: OnceLock::new(),
            writers: lock::Writers::new(),
        })
    }

    /// Whether writes through this mapping are this process's own (copy-on-write).
    pub fn is_private(&self) -> bool {
        !self.shared.load(Ordering::Acquire)
    }

    /// Seal the segment against writes from now on (a fresh copy, written): this mapping
    /// still writes (and is kept for the segment's reuse), no new one can.
    pub fn freeze(&self) -> Result<()> {
        self.segment().files().freeze()
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

    /// The segment as this process may use it: writable if a writable handle opened it.
    pub fn segment(&self) -> &Arc<Segment> {
        self.writable.get().unwrap_or(&self.segment)
    }

    /// The mapping itself (its words, for atomic access shared with other processes).
    pub fn mapping(&self) -> &Mapping {
        &self.mapping
    }

    /// This process's writers of the segment in place, who take turns (see `lock::Writers`).
    pub fn writers(&self) -> &lock::Writers {
        &self.writers
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
        if !self.is_private() {
            self.segment().files().keep_writer(mapping); // unmapped there unless reusable
        }
        // Handles of the segment released since the lender last looked no longer keep it.
        lender::sweep();
    }
}

/// In a forked child: a registry of its own, empty; the mappings the parent's held at the fork
/// (for `hold_in_child`).
pub fn renew_in_child() -> Vec<Weak<Mapped>> {
    drop(OPENING.renew());
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
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn adopting_checks_generation_and_lock() {
        let mapped = Mapped::create(100, None).unwrap();
        let (id, generation) = (mapped.segment().id(), mapped.segment().generation());
        assert_eq!(
            (mapped.segment().size(), mapped.segment().capacity()),
            (112, 104)
        );
        // The maker's descriptors, which keep the file once its mapping is gone.
        let writer = mapped
            .segment()
            .files()
            .file()
            .fd()
            .try_clone_to_owned()
            .unwrap();
        let reader = mapped
            .segment()
            .fd_for(false)
            .unwrap()
            .try_clone_to_owned()
            .unwrap();
        let fd = || reader.try_clone().unwrap();
        let adopt =
            |fd, generation, writable| Mapped::adopt(fd, id, 112, generation, writable, false);

        // In its maker's process, a segment's one mapping serves every handle of it.
        assert!(Arc::ptr_eq(
            &adopt(fd(), generation, false).unwrap(),
            &mapped
        ));
        drop(mapped);

        let opened = adopt(fd(), generation, false).unwrap();
        assert!(!opened.segment().writable() && opened.is_private());
        assert!(Arc::ptr_eq(&Mapped::named(id, false).unwrap(), &opened));
        assert!(Mapped::named(id, true).is_none());
        assert!(!lock::try_exclusive(writer.as_fd()).unwrap()); // the reader's lock

        let old = generation.wrapping_add(1);
        assert!(matches!(adopt(fd(), old, false), Err(Refused::Stale)));
        assert!(matches!(
            adopt(fd(), generation, true),
            Err(Refused::Other(Error::Buffer(_)))
        ));

        // A writable handle of it turns the one mapping shared, at its address...
        let base = opened.base();
        let writable = adopt(writer.try_clone().unwrap(), generation, true).unwrap();
        assert!(Arc::ptr_eq(&writable, &opened));
        assert!(opened.segment().writable() && !opened.is_private());
        assert!(Arc::ptr_eq(&Mapped::named(id, true).unwrap(), &opened));
        assert_eq!(opened.base(), base);
        opened.mapping.write_word(0, 7);
        let private = adopt(fd(), generation, false).unwrap();
        assert_eq!(private.mapping.read_word(0), 7);
        drop((writable, private, opened));

        // ... unless this process wrote into its copy-on-write pages.
        let opened = adopt(fd(), generation, false).unwrap();
        opened.mapping.write_word(0, 9);
        let refused = adopt(writer.try_clone().unwrap(), generation, true);
        assert!(matches!(refused, Err(Refused::Other(Error::Buffer(m))) if m.contains("wrote")));
        assert!(opened.is_private());
        assert_eq!(opened.mapping.read_word(0), 9);

        drop(opened);
        assert!(lock::try_exclusive(writer.as_fd()).unwrap());
        // Locked exclusively, as while its maker rewrites it: refused.
        assert!(matches!(
            adopt(fd(), generation, false),
            Err(Refused::Stale)
        ));
    }

    #[test]
    fn mappings_are_found_by_address() {
        let mapped = Mapped::create(4096, None).unwrap();
        let base = mapped.base();
        assert!(Arc::ptr_eq(
            &Mapped::at(base + 8, base + 4096).unwrap(),
            &mapped
        ));
        assert!(Mapped::at(base, base + 4097).is_none()); // into the trailer
        assert!(Arc::ptr_eq(&Mapped::of(mapped.segment()).unwrap(), &mapped));
    }
}
