//! Registries of mappings: by address, so that memory already in a segment is shared without a
//! copy, and by file, so that a process maps each segment once, however many handles to it
//! arrive, read-only or writable. Entries are weak: a mapping lives while its views do, and
//! leaves its registry as it dies.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};

use dlpack_core::share::FileId;

/// What a registry knows of its entries.
pub trait Entry {
    /// The address of the mapping.
    fn base(&self) -> usize;
    /// The bytes from `base` that elements may take.
    fn capacity(&self) -> usize;
    /// The file mapped.
    fn file(&self) -> FileId;
    /// Whether writes through the mapping reach the file (it may change, from false to true).
    fn writable(&self) -> bool;
}

pub struct Registry<T> {
    by_base: BTreeMap<usize, Weak<T>>,
    by_file: HashMap<FileId, Weak<T>>,
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Registry {
            by_base: BTreeMap::new(),
            by_file: HashMap::new(),
        }
    }
}

// An entry found is upgraded here, and handed to the caller: the caller drops it only after
// unlocking the registry (dropping the last reference removes the entry, which locks it).

impl<T: Entry> Registry<T> {
    pub fn insert(&mut self, entry: &Arc<T>) {
        let weak = Arc::downgrade(entry);
        self.by_base.insert(entry.base(), weak.clone());
        self.by_file.insert(entry.file(), weak);
    }

    /// Remove `entry`, which is dying (its entries, if they are still its own).
    pub fn remove(&mut self, entry: &T) {
        let is_it = |weak: &Weak<T>| std::ptr::eq(weak.as_ptr(), entry);
        let base = entry.base();
        if self.by_base.get(&base).is_some_and(is_it) {
            self.by_base.remove(&base);
        }
        let file = entry.file();
        if self.by_file.get(&file).is_some_and(is_it) {
            self.by_file.remove(&file);
        }
    }

    /// The live entry that maps the address `low`, if any (its capacity is the caller's to
    /// check against the addresses it needs).
    pub fn at(&self, low: usize) -> Option<Arc<T>> {
        let (_, weak) = self.by_base.range(..=low).next_back()?;
        weak.upgrade()
    }

    /// The live entry of the file `id`, only if it is writable when `writable` is asked (a
    /// read-only handle is served by either).
    pub fn named(&self, id: FileId, writable: bool) -> Option<Arc<T>> {
        let entry = self.by_file.get(&id)?.upgrade()?;
        (!writable || entry.writable()).then_some(entry)
    }

    /// How many entries are alive.
    pub fn live(&self) -> usize {
        self.by_base
            .values()
            .filter(|weak| weak.strong_count() > 0)
            .count()
    }

    /// Every entry, alive or dying.
    pub fn entries(&self) -> Vec<Weak<T>> {
        self.by_base.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake(usize, FileId);

    impl Entry for Fake {
        fn base(&self) -> usize {
            self.0
        }
        fn capacity(&self) -> usize {
            100
        }
        fn file(&self) -> FileId {
            self.1
        }
        fn writable(&self) -> bool {
            false
        }
    }

    #[test]
    fn entries_are_found_by_address_and_file_while_they_live() {
        let id = FileId { dev: 1, ino: 2 };
        let mut registry = Registry::default();
        let entry = Arc::new(Fake(1000, id));
        registry.insert(&entry);
        assert!(registry.at(999).is_none());
        assert_eq!(registry.at(1050).unwrap().base(), 1000);
        assert!(registry.named(id, false).is_some());
        assert!(registry.named(id, true).is_none()); // a read-only mapping serves no writer
        assert!(registry.named(FileId { dev: 1, ino: 3 }, true).is_none());
        assert_eq!(registry.live(), 1);

        let newer = Arc::new(Fake(1000, id)); // the same address mapped again
        registry.insert(&newer);
        registry.remove(&entry); // not its entries any more
        assert_eq!(registry.live(), 1);
        registry.remove(&newer);
        assert_eq!(registry.live(), 0);
        assert!(registry.entries().is_empty());
    }
}
