//! Which host memory Rust views of this crate hold, so that a mutable view never aliases
//! another view: shared views of overlapping memory may coexist, a mutable one only alone.
//!
//! Memory is compared by the address range each view's layout spans (`byte_extent`), so two
//! views of disjoint elements interleaved in one range (`a[::2]` and `a[1::2]`) conflict too:
//! a refusal where the elements would not have aliased, never the other way round.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

struct Entry {
    id: u64,
    start: usize,
    end: usize,
    exclusive: bool,
}

static HELD: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A held range of host memory, given back on drop.
pub struct Borrow {
    id: u64,
}

impl Borrow {
    /// Hold `start..end` (addresses), shared or exclusive; a `BufferError` if another view
    /// holds overlapping memory and either of the two is exclusive. An empty range holds
    /// nothing and never conflicts.
    pub fn take(start: usize, end: usize, exclusive: bool) -> Result<Option<Borrow>> {
        if start >= end {
            return Ok(None);
        }
        let mut held = HELD.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let conflict = held
            .iter()
            .find(|e| e.start < end && start < e.end && (e.exclusive || exclusive));
        if let Some(other) = conflict {
            return Err(Error::buffer(if other.exclusive {
                "this memory is already borrowed mutably by another Rust view (view_mut); drop \
                 that view first"
            } else {
                "this memory is borrowed by another Rust view; a mutable view (view_mut) needs \
                 it alone: drop the other views first"
            }));
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        held.push(Entry {
            id,
            start,
            end,
            exclusive,
        });
        Ok(Some(Borrow { id }))
    }
}

impl Drop for Borrow {
    fn drop(&mut self) {
        let mut held = HELD.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(k) = held.iter().position(|e| e.id == self.id) {
            held.swap_remove(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Borrow;

    // Addresses far from any other test's, so tests running at once can't meet.
    const BASE: usize = 0x7000_0000_0000;

    #[test]
    fn shared_views_coexist_and_a_mutable_one_needs_its_memory_alone() {
        let a = Borrow::take(BASE, BASE + 100, false).unwrap();
        let b = Borrow::take(BASE + 50, BASE + 150, false).unwrap();
        assert!(Borrow::take(BASE + 99, BASE + 120, true).is_err());
        // Adjacent memory is not shared.
        let c = Borrow::take(BASE + 150, BASE + 200, true).unwrap();
        assert!(Borrow::take(BASE + 160, BASE + 170, false).is_err());
        drop((a, b));
        let d = Borrow::take(BASE, BASE + 150, true).unwrap();
        drop((c, d));
        assert!(Borrow::take(BASE, BASE + 200, true).unwrap().is_some());
        assert!(Borrow::take(BASE, BASE, true).unwrap().is_none());
    }
}
