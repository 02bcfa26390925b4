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
//! When the runtime installed rust-numpy's borrow flags (`rust_numpy`), rust-numpy's borrows are
//! entries here too, marked by the array they were acquired with: a view checks them as it
//! checks other views, and a rust-numpy borrow is checked against the views only (against
//! other rust-numpy borrows rust-numpy's own flags decide, by its rules).
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
    /// 0 for a view; for a rust-numpy borrow, the address of the array it was acquired with.
    holder: usize,
}

/// `holder` of a view's entry.
const VIEW: usize = 0;

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
    // rust-numpy's borrows are left to their holders, as they are where the runtime didn't
    // install rust-numpy's flags (and so can't see them).
    match held
        .iter()
        .find(|e| e.holder == VIEW && e.start < end && start < e.end)
    {
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
/// interpreter first): a view's entry, without its `holder`.
pub struct Borrow {
    start: usize,
    end: usize,
    exclusive: bool,
}

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
            if other.holder != VIEW {
                return Err(held_by_rust_numpy(exclusive));
            }
            return Err(Error::buffer(if other.exclusive {
                "this memory is already borrowed mutably by another Rust view (view_mut); drop \
                 that view first"
            } else {
                "this memory is borrowed by another Rust view; a mutable view (view_mut) needs \
                 it alone: drop the other views first"
            }));
        }
        held.push(Entry {
            start,
            end,
            exclusive,
            holder: VIEW,
        });
        Ok(Some(Borrow {
            start,
            end,
            exclusive,
        }))
    }

    /// End the hold, the GIL held (`py`).
    pub fn give_back(self, py: Python<'_>) {
        remove(py, self.entry());
        std::mem::forget(self);
    }

    fn entry(&self) -> Entry {
        Entry {
            start: self.start,
            end: self.end,
            exclusive: self.exclusive,
            holder: VIEW,
        }
    }
}

/// The refusal of a view (`exclusive`: a mutable one) of memory rust-numpy lends.
#[cold]
pub fn held_by_rust_numpy(exclusive: bool) -> Error {
    Error::buffer(if exclusive {
        "this memory is borrowed through rust-numpy (a PyReadonlyArray or PyReadwriteArray, in \
         this or another extension); a mutable view (view_mut) needs it alone: drop that borrow \
         first"
    } else {
        "this memory is borrowed mutably through rust-numpy (a PyReadwriteArray, in this or \
         another extension); drop that borrow first"
    })
}

/// Whether a view holds any of `start..end` (addresses) against a rust-numpy borrow of it,
/// `exclusive` or shared.
pub fn viewed(_py: Python<'_>, start: usize, end: usize, exclusive: bool) -> bool {
    // SAFETY: the GIL is held (`_py`), and nothing below reaches `HELD` again or runs Python
    // code while `held` is used.
    let held = unsafe { HELD.get() };
    held.iter()
        .any(|e| e.holder == VIEW && e.start < end && start < e.end && (e.exclusive || exclusive))
}

/// Record a rust-numpy borrow of `start..end`, acquired with the array at `holder` (an object's
/// address, never 0, which the borrow keeps alive: no other array has it until
/// `release_rust_numpy`).
pub fn hold_rust_numpy(_py: Python<'_>, start: usize, end: usize, exclusive: bool, holder: usize) {
    // SAFETY: the GIL is held (`_py`), and nothing below reaches `HELD` again or runs Python
    // code while `held` is used.
    let held = unsafe { HELD.get() };
    held.push(Entry {
        start,
        end,
        exclusive,
        holder,
    });
}

/// Forget a rust-numpy borrow acquired with the array at `holder`, found by the array (whose
/// range Python code may have changed since, `a.shape = ...`): any one of its borrows of that
/// kind, as they are released one for one.
pub fn release_rust_numpy(_py: Python<'_>, exclusive: bool, holder: usize) {
    // SAFETY: the GIL is held (`_py`), and nothing below reaches `HELD` again or runs Python
    // code while `held` is used.
    let held = unsafe { HELD.get() };
    if let Some(k) = held
        .iter()
        .rposition(|e| e.holder == holder && e.exclusive == exclusive)
    {
        held.swap_remove(k);
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
        Python::attach(|py| remove(py, self.entry()));
    }
}

#[cfg(test)]
mod tests {
    use pyo3::Python;

    use super::{Borrow, check_unheld, hold_rust_numpy, release_rust_numpy, viewed};

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

    #[test]
    fn writes_beside_a_view_are_the_writers() {
        Python::initialize();
        Python::attach(|py| {
            let at = |offset| BASE + 0x20_0000 + offset;
            let view = Borrow::take(py, at(100), at(200), false).unwrap();
            // the bytes either side of the view's are free to write, one more byte is not
            assert!(check_unheld(py, at(0), at(100), "copyto").is_ok());
            assert!(check_unheld(py, at(200), at(300), "copyto").is_ok());
            assert!(check_unheld(py, at(0), at(101), "copyto").is_err());
            assert!(check_unheld(py, at(199), at(300), "copyto").is_err());
            drop(view);
        });
    }

    #[test]
    fn rust_numpy_borrows_meet_views_only() {
        Python::initialize();
        Python::attach(|py| {
            const ARRAY: usize = 0x1234_5670;
            let at = |offset| BASE + 0x10_0000 + offset;
            // A rust-numpy borrow refuses a mutable view of its memory, a mutable one any view.
            hold_rust_numpy(py, at(0), at(100), false, ARRAY);
            assert!(Borrow::take(py, at(10), at(20), false).unwrap().is_some());
            let refused = Borrow::take(py, at(10), at(20), true).err().unwrap();
            assert!(format!("{refused:?}").contains("borrowed through rust-numpy"));
            hold_rust_numpy(py, at(200), at(300), true, ARRAY + 16);
            assert!(Borrow::take(py, at(250), at(251), false).is_err());
            // Views are what rust-numpy's borrows are checked against, not each other.
            assert!(!viewed(py, at(0), at(300), true));
            let view = Borrow::take(py, at(400), at(500), false).unwrap();
            assert!(viewed(py, at(450), at(460), true));
            assert!(!viewed(py, at(450), at(460), false));
            // Released by the array, whatever its range became; the views' writers never
            // consulted them.
            assert!(check_unheld(py, at(0), at(300), "copyto").is_ok());
            release_rust_numpy(py, false, ARRAY);
            release_rust_numpy(py, true, ARRAY + 16);
            assert!(Borrow::take(py, at(0), at(300), true).unwrap().is_some());
            drop(view);
        });
    }
}
