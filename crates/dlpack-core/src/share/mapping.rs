//! Mappings of sealed memory files: the whole file, readable and writable, unmapped on drop.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

use rustix::io::Errno;
use rustix::mm::{self, Advice, MapFlags, MremapFlags, ProtFlags};

use super::memfd::SealedFile;
use crate::available::human;
use crate::error::{Error, Result};

/// How writes through a mapping land.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writes {
    /// In the file: every process mapping it sees them (needs a descriptor open for writing).
    Shared,
    /// In pages of this mapping's own (copy-on-write): the file is never written through it,
    /// and a consumer that writes despite a read-only flag changes only what it sees itself,
    /// instead of crashing on a read-only mapping.
    Private,
}

/// This process's mapping of a whole sealed file: `len` bytes at `ptr`, readable and writable,
/// never faulting (the file can't shrink), unmapped when dropped.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a mapping is plain memory, owned by this value alone; nothing in it is tied to a
// thread.
unsafe impl Send for Mapping {}
// SAFETY: shared access only hands out the address and reads or writes whole words through raw
// pointers.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map all of `file`; `populate`: fault every page in now (`MAP_POPULATE`).
    pub fn new(file: &SealedFile, writes: Writes, populate: bool) -> Result<Mapping> {
        let len = usize::try_from(file.size())
            .map_err(|_| Error::Memory(format!("can't map {} bytes", file.size())))?;
        let mut flags = match writes {
            Writes::Shared => MapFlags::SHARED,
            Writes::Private => MapFlags::PRIVATE,
        };
        if populate {
            flags |= MapFlags::POPULATE;
        }
        let prot = ProtFlags::READ | ProtFlags::WRITE;
        // SAFETY: a new mapping where the kernel chooses (no fixed address), so it replaces
        // nothing; the file can't shrink, so every page of it stays backed.
        let ptr = unsafe { mm::mmap(std::ptr::null_mut(), len, prot, flags, file.fd(), 0) }
            .map_err(|errno| match errno {
                Errno::NOMEM => unmappable(file.size(), writes),
                errno => Error::os("mmap")(errno),
            })?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(Error::Os {
            call: "mmap",
            errno: Errno::NOMEM,
        })?;
        Ok(Mapping { ptr, len })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Make this mapping (a private one, see `Writes::Private`) a shared one of `file`, opened
    /// for writing, at the same address: writes through it reach the file from now on.
    ///
    /// A private mapping can't be turned shared in place (`mprotect` changes rights, not how
    /// writes land, and a shared mapping of a read-only descriptor can't be made writable), so
    /// `file` is mapped anew elsewhere first, which checks everything the kernel checks of a
    /// mapping (and on failure leaves this one as it was), then moved over this one's pages in
    /// one `mremap`: under the address-space lock, so no thread sees a hole. A move fails
    /// after unmapping this mapping's pages only where the kernel can't allocate a few bytes
    /// for it, which it refuses only to a process the OOM killer is ending.
    ///
    /// # Safety
    /// `file` must be the file this mapping maps, and no page of this mapping may hold this
    /// process's own copy (`private_pages_written`): then every byte reads the same before and
    /// after, so whatever addresses the memory meanwhile sees no change.
    pub unsafe fn share_writes(&self, file: &SealedFile) -> Result<()> {
        if usize::try_from(file.size()) != Ok(self.len) {
            return Err(Error::buffer("not the file this mapping maps"));
        }
        let fresh = Mapping::new(file, Writes::Shared, false)?;
        // SAFETY: `fresh` is a whole mapping of `len` bytes of ours, moved onto this one's `len`
        // bytes, which it replaces with the same file's bytes (the caller's contract); the
        // ranges can't overlap (both are live mappings). On success `fresh`'s address holds
        // nothing any more: it is forgotten, not unmapped.
        let moved = unsafe {
            mm::mremap_fixed(
                fresh.ptr.as_ptr().cast(),
                self.len,
                self.len,
                MremapFlags::MAYMOVE,
                self.ptr.as_ptr().cast(),
            )
        };
        match moved {
            Ok(_) => {
                std::mem::forget(fresh);
                Ok(())
            }
            Err(errno) => Err(Error::os("mremap")(errno)), // `fresh` unmapped where it is
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a file of no bytes can't be mapped.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The little-endian word at `offset` (a multiple of 8 inside the mapping), read once.
    pub fn read_word(&self, offset: usize) -> u64 {
        let word = self.word(offset);
        // SAFETY: an aligned word inside this live, readable mapping (`word` checks).
        u64::from_le(unsafe { word.read_volatile() })
    }

    /// Write the little-endian word at `offset` (a multiple of 8 inside the mapping).
    pub fn write_word(&self, offset: usize, value: u64) {
        let word = self.word(offset);
        // SAFETY: an aligned word inside this live, writable mapping (`word` checks).
        unsafe { word.write_volatile(value.to_le()) };
    }

    /// The word at `offset` (a multiple of 8 inside the mapping), for atomic access shared with
    /// the other processes that map the same file.
    pub fn atomic_word(&self, offset: usize) -> &AtomicU64 {
        let word = self.word(offset);
        // SAFETY: an aligned word inside this mapping, which lives as long as the borrow;
        // `AtomicU64` has the layout of `u64`, and every process accesses these words atomically.
        unsafe { AtomicU64::from_ptr(word) }
    }

    fn word(&self, offset: usize) -> *mut u64 {
        assert!(
            offset.is_multiple_of(8) && offset.checked_add(8).is_some_and(|end| end <= self.len),
            "word {offset} outside a {}-byte mapping",
            self.len
        );
        // SAFETY: in bounds (just checked); the base is page-aligned, so the word is aligned.
        unsafe { self.ptr.as_ptr().add(offset) }.cast()
    }

    /// Fault the first `len` bytes' pages in, for writing, from up to `threads` threads at once
    /// (`MADV_POPULATE_WRITE`): on a virtual machine each page fault is dear, and a copy that
    /// faults as it writes takes longer. `Error::Memory` when the memory can't be had (rather
    /// than the OOM killer mid-copy); nothing on kernels without the advice (before 5.14).
    pub fn populate(&self, len: usize, threads: usize) -> Result<()> {
        let len = len.min(self.len);
        let page = super::system::page_size();
        let threads = threads.clamp(1, len.div_ceil(page).max(1));
        let chunk = len.div_ceil(threads).div_ceil(page) * page;
        let base = self.ptr.as_ptr() as usize;
        let fault = |start: usize| -> Option<Errno> {
            let size = chunk.min(len.saturating_sub(start));
            if size == 0 {
                return None;
            }
            // SAFETY: a page-aligned range inside this live mapping; the advice only faults its
            // pages in.
            unsafe {
                mm::madvise(
                    (base + start) as *mut c_void,
                    size,
                    Advice::LinuxPopulateWrite,
                )
            }
            .err()
        };
        let failures: Vec<Option<Errno>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (1..threads)
                .map(|k| scope.spawn(move || fault(k * chunk)))
                .collect();
            let mut failures = vec![fault(0)];
            failures.extend(workers.into_iter().map(|w| w.join().unwrap_or(None)));
            failures
        });
        if failures.contains(&Some(Errno::NOMEM)) {
            return Err(Error::Memory(format!(
                "can't allocate {len} bytes of shared memory"
            )));
        }
        Ok(())
    }
}

/// A read-only shared mapping of a whole sealed file, unmapped on drop: its bytes are the
/// file's as it is, whatever this process wrote into a copy-on-write mapping of the same file
/// (whose written pages are its own from then on). Nothing is ever written through it, so it
/// needs only a descriptor open for reading.
#[derive(Debug)]
pub struct ReadMapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a mapping is plain memory, owned by this value alone; nothing in it is tied to a
// thread.
unsafe impl Send for ReadMapping {}
// SAFETY: shared access only hands out the address and loads words atomically.
unsafe impl Sync for ReadMapping {}

impl ReadMapping {
    /// Map all of `file` for reading.
    pub fn new(file: &SealedFile) -> Result<ReadMapping> {
        let len = usize::try_from(file.size())
            .map_err(|_| Error::Memory(format!("can't map {} bytes", file.size())))?;
        // SAFETY: a new mapping where the kernel chooses (no fixed address), so it replaces
        // nothing; the file can't shrink, so every page of it stays backed.
        let ptr = unsafe {
            mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ,
                MapFlags::SHARED,
                file.fd(),
                0,
            )
        }
        .map_err(|errno| match errno {
            Errno::NOMEM => unmappable(file.size(), Writes::Shared),
            errno => Error::os("mmap")(errno),
        })?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(Error::Os {
            call: "mmap",
            errno: Errno::NOMEM,
        })?;
        Ok(ReadMapping { ptr, len })
    }

    /// The address of the mapping: its `len` bytes may be read, never written.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a file of no bytes can't be mapped.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The word at `offset` (a multiple of 8 inside the mapping), for atomic loads shared with
    /// the processes that write the file: only ever loaded (a store would fault).
    pub fn atomic_word(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset.is_multiple_of(8) && offset.checked_add(8).is_some_and(|end| end <= self.len),
            "word {offset} outside a {}-byte mapping",
            self.len
        );
        // SAFETY: in bounds (just checked); the base is page-aligned, so the word is aligned.
        let word = unsafe { self.ptr.as_ptr().add(offset) }.cast::<u64>();
        // SAFETY: an aligned word inside this mapping, which lives as long as the borrow;
        // `AtomicU64` has the layout of `u64`; loads of it read the page, which is readable (on
        // the 64-bit targets we build for, an atomic load of 64 bits is a plain load).
        unsafe { AtomicU64::from_ptr(word) }
    }
}

impl Drop for ReadMapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once; whatever read it held this value.
        let _ = unsafe { mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The `MemoryError` of a mapping of `bytes` bytes the kernel refused for want of memory: of
/// address space under `RLIMIT_AS` (named with what is left, as `available::check` names it
/// where memory is allocated), else of map entries or, for a private mapping (which may come to
/// hold a copy of every page), of the commit limit.
#[cold]
fn unmappable(bytes: u64, writes: Writes) -> Error {
    let why = match crate::available::address_space() {
        Some(free) if free.bytes < bytes => {
            format!(
                "only {} can be had ({})",
                human(free.bytes),
                free.figure_from
            )
        }
        _ if writes == Writes::Private => "the kernel refused the address space (the \
             vm.max_map_count sysctl), or the commit its copy-on-write pages could take \
             (vm.overcommit_memory)"
            .to_owned(),
        _ => "the kernel refused the address space (the vm.max_map_count sysctl)".to_owned(),
    };
    Error::Memory(format!(
        "can't map {bytes} bytes ({}) of shared memory (mmap: {}): {why}",
        human(bytes),
        crate::error::describe(Errno::NOMEM),
    ))
}

/// Whether any page of the `len` bytes at `addr` (in a private mapping of a file, this
/// process's) holds this process's own copy, written since it was mapped (copy-on-write),
/// instead of the file's: such memory, shared as the file, would not be what this process sees.
/// Read from `/proc/self/pagemap`: a page present and not the file's, or swapped out (only
/// private copies swap; the file's pages are shared memory), is one. True when pagemap can't be
/// read (nothing known: assume written).
pub fn private_pages_written(addr: usize, len: usize) -> bool {
    private_pages(addr, len).unwrap_or(true)
}

/// `private_pages_written`, `None` when pagemap can't be read.
pub fn private_pages(addr: usize, len: usize) -> Option<bool> {
    const PRESENT: u64 = 1 << 63;
    const SWAPPED: u64 = 1 << 62;
    const FILE_OR_SHARED: u64 = 1 << 61;
    use std::os::unix::fs::FileExt;
    if len == 0 {
        return Some(false);
    }
    let page = super::system::page_size();
    let (first, last) = (addr / page, (addr + (len - 1)) / page);
    let pagemap = std::fs::File::open("/proc/self/pagemap").ok()?;
    let mut entries = vec![0u8; 8 * 4096];
    let mut page_index = first;
    while page_index <= last {
        let count = (last - page_index + 1).min(4096);
        let bytes = &mut entries[..8 * count];
        pagemap.read_exact_at(bytes, 8 * page_index as u64).ok()?;
        let written = bytes.chunks_exact(8).any(|entry| {
            let entry = u64::from_ne_bytes(entry.try_into().expect("8 bytes"));
            entry & SWAPPED != 0 || (entry & PRESENT != 0 && entry & FILE_OR_SHARED == 0)
        });
        if written {
            return Some(true);
        }
        page_index += count;
    }
    Some(false)
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once; whatever addressed it (views of it) held this
        // mapping's owner, so none is left.
        let _ = unsafe { mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::super::memfd::open_peer;
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn shared_writes_reach_the_file_and_private_ones_do_not() {
        let file = SealedFile::create(c"test", 3 * 4096).unwrap();
        let writer = Mapping::new(&file, Writes::Shared, false).unwrap();
        assert_eq!(writer.len(), 3 * 4096);
        assert_eq!(writer.read_word(3 * 4096 - 8), 0);
        writer.write_word(3 * 4096 - 8, 0x0102_0304_0506_0708);

        let reader = file.reopen(false).unwrap();
        let private = Mapping::new(&reader, Writes::Private, true).unwrap();
        assert_eq!(private.read_word(3 * 4096 - 8), 0x0102_0304_0506_0708);
        private.write_word(0, 7);
        assert_eq!(private.read_word(0), 7);
        assert_eq!(writer.read_word(0), 0);
        // The bytes are little-endian in memory, whatever the machine.
        let last_word = writer.as_ptr().wrapping_add(3 * 4096 - 8);
        // SAFETY: inside the live mapping.
        assert_eq!(unsafe { *last_word }, 8);
        // A shared mapping of a read-only descriptor is refused by the kernel.
        assert!(Mapping::new(&reader, Writes::Shared, false).is_err());
    }

    #[test]
    fn a_private_mapping_shares_its_writes_at_the_same_address() {
        let file = SealedFile::create(c"test", 2 * 4096).unwrap();
        let writer = Mapping::new(&file, Writes::Shared, false).unwrap();
        writer.write_word(4096, 11);
        let private = Mapping::new(&file.reopen(false).unwrap(), Writes::Private, false).unwrap();
        let address = private.as_ptr();
        assert_eq!(private.read_word(4096), 11);
        let other = SealedFile::create(c"test", 4096).unwrap();
        // SAFETY: refused before anything is mapped (another size).
        assert!(unsafe { private.share_writes(&other) }.is_err());
        // SAFETY: refused by the kernel (a read-only descriptor), the mapping left as it was.
        assert!(unsafe { private.share_writes(&file.reopen(false).unwrap()) }.is_err());
        assert_eq!(private.read_word(4096), 11);
        // SAFETY: the same file, and no page of `private` was written.
        unsafe { private.share_writes(&file.reopen(true).unwrap()) }.unwrap();
        assert_eq!((private.as_ptr(), private.read_word(4096)), (address, 11));
        private.write_word(0, 5);
        assert_eq!(writer.read_word(0), 5);
        writer.write_word(8, 6);
        assert_eq!(private.read_word(8), 6);
        assert!(!private_pages_written(address as usize, private.len()));
    }

    #[test]
    fn a_frozen_file_keeps_its_writers_and_gets_no_new_ones() {
        let file = SealedFile::create_freezable(c"test", 4096).unwrap();
        let writer = Mapping::new(&file, Writes::Shared, false).unwrap();
        assert!(file.freeze().unwrap());
        writer.write_word(0, 3); // made before: still writes
        let opened = open_peer(super::super::system::pid(), file.fd().as_raw_fd(), true).unwrap();
        let again = SealedFile::check(opened, Some(file.id()), 4096, true).unwrap();
        assert!(Mapping::new(&again, Writes::Shared, false).is_err());
        let private = Mapping::new(&again, Writes::Private, false).unwrap();
        assert_eq!(private.read_word(0), 3);
        assert!(rustix::io::write(again.fd(), b"x").is_err());
    }

    #[test]
    fn pagemap_tells_written_private_pages() {
        let file = SealedFile::create(c"test", 4 * 4096).unwrap();
        let writer = Mapping::new(&file, Writes::Shared, false).unwrap();
        writer.write_word(8192, 5);
        let private = Mapping::new(&file, Writes::Private, false).unwrap();
        let base = private.as_ptr() as usize;
        assert!(!private_pages_written(base, private.len())); // nothing touched
        assert_eq!(private.read_word(8192), 5);
        assert!(!private_pages_written(base, private.len())); // read: the file's page
        private.write_word(4096 + 16, 9);
        assert!(private_pages_written(base, private.len()));
        assert!(private_pages_written(base + 4096 + 16, 8));
        assert!(!private_pages_written(base, 4096)); // other pages are still the file's
        assert!(!private_pages_written(base + 8192, 8192));
        assert!(!private_pages_written(base, 0));
    }

    #[test]
    fn populating_from_threads_faults_pages_in() {
        let size = 8 << 20;
        let file = SealedFile::create(c"test", size).unwrap();
        let mapping = Mapping::new(&file, Writes::Shared, false).unwrap();
        mapping.populate(mapping.len(), 4).unwrap();
        mapping.populate(4096 + 1, 3).unwrap();
        mapping.write_word(mapping.len() - 8, 1);
        assert_eq!(mapping.read_word(mapping.len() - 8), 1);
    }

    #[test]
    fn a_read_mapping_sees_the_file_past_private_writes() {
        let file = SealedFile::create(c"test", 2 * 4096).unwrap();
        let writer = Mapping::new(&file, Writes::Shared, false).unwrap();
        let reader = file.reopen(false).unwrap();
        let private = Mapping::new(&reader, Writes::Private, false).unwrap();
        let read = ReadMapping::new(&reader).unwrap();
        assert_eq!(read.len(), 2 * 4096);
        private.write_word(4096, 1); // this process's own page from now on
        writer.write_word(4096, 2);
        writer.write_word(8, 3);
        assert_eq!(private.read_word(4096), 1);
        assert_eq!(
            read.atomic_word(4096)
                .load(std::sync::atomic::Ordering::Acquire),
            2
        );
        assert_eq!(
            read.atomic_word(8)
                .load(std::sync::atomic::Ordering::Acquire),
            3
        );
        let eighth = read.as_ptr().wrapping_add(8);
        // SAFETY: inside the live mapping.
        assert_eq!(unsafe { *eighth }, 3);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn words_outside_are_refused() {
        let file = SealedFile::create(c"test", 4096).unwrap();
        Mapping::new(&file, Writes::Shared, false)
            .unwrap()
            .read_word(4096);
    }
}
