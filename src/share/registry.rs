//! This process's live mappings of segments: by address, so that memory already in a segment
//! is shared without a copy, and by file, so that a process maps each segment once, however many
//! handles to it arrive. Entries are weak: a mapping lives while its views do, and forgets
//! itself as it dies.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};

use super::os::FileId;
use super::per_process::PerProcess;
use super::segment::Mapped;

#[derive(Default)]
struct Registry {
    by_base: BTreeMap<usize, Weak<Mapped>>,
    by_file: HashMap<(FileId, bool), Weak<Mapped>>,
}

static REGISTRY: PerProcess<Registry> = PerProcess::new(Registry::default);

// A mapping found is upgraded under the lock but only ever dropped after it: dropping the last
// reference runs `forget`, which takes the lock.

pub fn register(mapped: &Arc<Mapped>) {
    let weak = Arc::downgrade(mapped);
    let key = (mapped.segment().id(), mapped.segment().writable());
    let mut registry = REGISTRY.lock();
    registry
        .by_base
        .insert(mapped.base() as usize, weak.clone());
    registry.by_file.insert(key, weak);
}

/// Forget `mapped`, which is dying (its entries, if they are still its own).
pub fn forget(mapped: &Mapped) {
    let is_it = |weak: &Weak<Mapped>| std::ptr::eq(weak.as_ptr(), mapped);
    let mut registry = REGISTRY.lock();
    let base = mapped.base() as usize;
    if registry.by_base.get(&base).is_some_and(is_it) {
        registry.by_base.remove(&base);
    }
    let key = (mapped.segment().id(), mapped.segment().writable());
    if registry.by_file.get(&key).is_some_and(is_it) {
        registry.by_file.remove(&key);
    }
}

/// The live mapping whose elements hold the addresses `[low, high)`.
pub fn at(low: usize, high: usize) -> Option<Arc<Mapped>> {
    let mapped = {
        let registry = REGISTRY.lock();
        let (_, weak) = registry.by_base.range(..=low).next_back()?;
        weak.upgrade()?
    };
    let capacity = usize::try_from(mapped.segment().capacity()).unwrap_or(usize::MAX);
    (high <= (mapped.base() as usize).saturating_add(capacity)).then_some(mapped)
}

/// The live mapping of the file `id`, writable if asked (a read-only handle is served by
/// either mapping).
pub fn named(id: FileId, writable: bool) -> Option<Arc<Mapped>> {
    let registry = REGISTRY.lock();
    let modes: &[bool] = if writable { &[true] } else { &[false, true] };
    modes
        .iter()
        .find_map(|&mode| registry.by_file.get(&(id, mode))?.upgrade())
}

/// How many segments this process maps.
pub fn live() -> usize {
    let registry = REGISTRY.lock();
    registry
        .by_base
        .values()
        .filter(|weak| weak.strong_count() > 0)
        .count()
}

/// In a forked child: a registry of its own, empty; the segments the parent's held at the fork
/// (for `hold_in_child`).
pub fn renew_in_child() -> Vec<Weak<Mapped>> {
    match REGISTRY.renew() {
        Some(old) => old.by_base.values().cloned().collect(),
        None => Vec::new(),
    }
}

/// In a forked child: the inherited segments still alive, registered, each with a lock of the
/// child's own (see `Segment::hold_after_fork`).
pub fn hold_in_child(inherited: Vec<Weak<Mapped>>) {
    let alive: Vec<Arc<Mapped>> = inherited.iter().filter_map(Weak::upgrade).collect();
    for mapped in &alive {
        register(mapped);
        mapped.segment().hold_after_fork();
    }
}
