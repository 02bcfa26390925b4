//! Which host memory Rust views of this crate hold, so that a mutable view never aliases
//! another view: shared views of overlapping memory may coexist, a mutable one only alone.
//!
//! Memory is compared by the address range each view's layout spans (`byte_extent`), so two
//! views of disjoint elements interleaved in one range (`a[::2]` and `a[1::2]`) conflict too:
//! a refusal where the elements would not have aliased, never the other way round.
//!
//! The runtime's own writers (`copyto`) consult it too: memory a view holds, shared or mutably,
//! is not theirs to write (`check_unheld`).
//!
//! The registry is guarded by the GIL, which every C API call holds, instead of a lock: the
//! lock's two atomic operations per view cost more than the rest of the registry (a
//! free-threaded build would need the lock back).

use std::ffi::c_void;

use dlpack_core::layout::Layout;
use pyo3::Python;

use crate::error::{Error, Result};
use crate::ffi::python::GilCell;
use crate::tensor::Tensor;

/// A held range; equal entries are interchangeable, so an entry is found by its value.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Entry {
    start: usize,
    end: usize,
    exclusive: bool,
}

static HELD: GilCell<Vec<Entry>> = GilCell::new(Vec::new());

/// The addresses `start..end` a tensor's elements span, as the registry compares them; a
/// `ValueError` for a layout that would run past either end of the address space from its
/// first element (a foreign pointer and layout, which no memory could hold).
pub fn range_of(tensor: &Tensor) -> Result<(usize, usize)> {
    span(tensor.data(), tensor.layout(), tensor.dtype().itemsize())
}

/// `range_of` for the elements of `layout` (items of `itemsize` bytes) from `first` on.
pub fn span(first: *const c_void, layout: &Layout, itemsize: usize) -> Result<(usize, usize)> {
    let (low, high) = layout.byte_extent(itemsize)?;
    let first = first as usize;
    let at = |offset: i64| {
        isize::try_from(offset)
            .ok()
            .and_then(|offset| first.checked_add_signed(offset))
    };
    match (at(low), at(high)) {
        (Some(start), Some(end)) => Ok((start, end)),
        _ => Err(Error::value(format!(
            "this memory's layout spans bytes {low}..{high} from its first element at {first:#x}, \
             outside the address space"
        ))),
    }
}

/// A `BufferError` if a view holds any of `start..end` (addresses), for `writer`, which would
/// write there: a shared view reads memory that must not change under it, a mutable one holds
/// it alone.
pub fn check_unheld(_py: Python<'_>, start: usize, end: usize, writer: &str) -> Result<()> {
    if start >= end {
        return Ok(()); // no bytes written
    }
    // SAFETY: the GIL is held (`_py`), and nothing below reaches `HELD` again or runs Python
    // code while `held` is used.
    let held = unsafe { HELD.get() };
    match held.iter().find(|e| e.start < end && start < e.end) {
        None => Ok(()),
        Some(other) => Err(Error::buffer(if other.exclusive {
            format!(
                "{writer} can't write into this memory: it is borrowed mutably by a view (a Rust \
                 or C extension's view_mut, through dlpack's C API) that holds it alone; write \
                 once that view is dropped"
            )
        } else {
            format!(
                "{writer} can't write into this memory: it is borrowed by a view (a Rust or C \
                 extension's, through dlpack's C API) that reads it; write once that view is \
                 dropped"
            )
        })),
    }
}

/// A held range of host memory, given back by `give_back` (or on drop, which attaches to the
/// interpreter first).
pub struct Borrow(Entry);

impl Borrow {
    /// Hold `start..end` (addresses), shared or exclusive; a `BufferError` if another view
    /// holds overlapping memory and either of the two is exclusive. An empty range holds
    /// nothing and never conflicts.
    pub fn take(
        _py: Python<'_>,
        start: usize,
        end: usize,
        exclusive: bool,
    ) -> Result<Option<Borrow>> {
        if start >= end {
            return Ok(None);
        }
        // SAFETY: the GIL is held (`_py`), and nothing below reaches `HELD` again or runs
        // Python code while `held` is used.
        let held = unsafe { HELD.get() };
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
        let entry = Entry {
            start,
            end,
            exclusive,
        };
        held.push(entry);
        Ok(Some(Borrow(entry)))
    }

    /// End the hold, the GIL held (`py`).
    pub fn give_back(self, py: Python<'_>) {
        remove(py, self.0);
        std::mem::forget(self);
    }
}

fn remove(_py: Python<'_>, entry: Entry) {
    // SAFETY: the GIL is held (`_py`), and nothing below reaches `HELD` again or runs Python
    // code while `held` is used.
    let held = unsafe { HELD.get() };
    if let Some(k) = held.iter().rposition(|e| *e == entry) {
        held.swap_remove(k);
    }
}

impl Drop for Borrow {
    fn drop(&mut self) {
        Python::attach(|py| remove(py, self.0));
    }
}

#[cfg(test)]
mod tests {
    use pyo3::Python;

    use super::Borrow;

    // Addresses far from any other test's, so tests running at once can't meet.
    const BASE: usize = 0x7000_0000_0000;

    #[test]
    fn shared_views_coexist_and_a_mutable_one_needs_its_memory_alone() {
        Python::initialize();
        Python::attach(|py| {
            let take =
                |start, end, exclusive| Borrow::take(py, BASE + start, BASE + end, exclusive);
            let a = take(0, 100, false).unwrap();
            let b = take(50, 150, false).unwrap();
            assert!(take(99, 120, true).is_err());
            // Adjacent memory is not shared.
            let c = take(150, 200, true).unwrap();
            assert!(take(160, 170, false).is_err());
            drop((a, b));
            let d = take(0, 150, true).unwrap();
            c.unwrap().give_back(py);
            drop(d);
            assert!(take(0, 200, true).unwrap().is_some());
            assert!(take(0, 0, true).unwrap().is_none());
        });
    }
}
