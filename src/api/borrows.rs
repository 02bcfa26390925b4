//! Which host memory Rust views of this crate hold, so that a mutable view never aliases
//! another view: shared views of overlapping memory may coexist, a mutable one only alone.
//!
//! Memory is compared by the address range each view's layout spans (`byte_extent`), so two
//! views of disjoint elements interleaved in one range (`a[::2]` and `a[1::2]`) conflict too:
//! a refusal where the elements would not have aliased, never the other way round.
//!
//! The runtime's own writers (`copyto`) hold their destination here too while they write
//! (`Writing`): memory a view holds, shared or mutably, is not theirs to write, and no view is
//! taken of memory being written. Writers don't exclude one another (as numpy's writes don't).
//!
//! When the runtime installed rust-numpy's borrow flags (`rust_numpy`), rust-numpy's borrows are
//! entries here too, marked by the array they were acquired with: a view checks them as it
//! checks other views, and a rust-numpy borrow is checked against the views only (against
//! other rust-numpy borrows rust-numpy's own flags decide, by its rules).
//!
//! The registry is a `Latch` (`HELD`), taken for a check and its insert as one step, and never
//! held while Python code runs, so a thread waits for it only while another compares a few
//! ranges; it needs no GIL, on either build.

use std::ffi::{c_int, c_void};

use dlpack_core::layout::Layout;

use crate::error::{Error, Result};
use crate::ffi::python::Latch;
use crate::tensor::Tensor;

/// A held range; equal entries are interchangeable, so an entry is found by its value.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Entry {
    start: usize,
    end: usize,
    exclusive: bool,
    /// `VIEW`, `WRITER`, or for a rust-numpy borrow the address of the array it was acquired
    /// with.
    holder: usize,
}

/// `holder` of a view's entry.
const VIEW: usize = 0;
/// `holder` of a writer's entry (always exclusive); no array lives at address 1.
const WRITER: usize = 1;

/// Every change is one push or one removal, whole before anything could panic.
static HELD: Latch<Vec<Entry>> = Latch::new(Vec::new());

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

/// A writer's hold of `start..end` (addresses) while it writes there, given back on drop.
pub struct Writing(Entry);

impl Writing {
    /// Hold `start..end` for `writer`, which will write there; a `BufferError` if a view holds
    /// any of it: a shared view reads memory that must not change under it, a mutable one holds
    /// it alone. An empty range holds nothing.
    pub fn take(start: usize, end: usize, writer: &str) -> Result<Option<Writing>> {
        if start >= end {
            return Ok(None); // no bytes written
        }
        let entry = Entry {
            start,
            end,
            exclusive: true,
            holder: WRITER,
        };
        // rust-numpy's borrows are left to their holders, as they are where the runtime didn't
        // install rust-numpy's flags (and so can't see them).
        let viewed = HELD.with(|held| {
            let found = held
                .iter()
                .find(|e| e.holder == VIEW && e.start < end && start < e.end)
                .map(|other| other.exclusive);
            if found.is_none() {
                held.push(entry);
            }
            found
        });
        if let Some(exclusive) = viewed {
            return Err(Error::buffer(if exclusive {
                format!(
                    "{writer} can't write into this memory: it is borrowed mutably by a view (a \
                     Rust or C extension's view_mut, through dlpack's C API) that holds it alone; \
                     write once that view is dropped"
                )
            } else {
                format!(
                    "{writer} can't write into this memory: it is borrowed by a view (a Rust or C \
                     extension's, through dlpack's C API) that reads it; write once that view is \
                     dropped"
                )
            }));
        }
        Ok(Some(Writing(entry)))
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        remove(self.0);
    }
}

/// A held range of host memory, given back by `give_back` or on drop: a view's entry, without
/// its `holder`.
pub struct Borrow {
    start: usize,
    end: usize,
    exclusive: bool,
}

impl Borrow {
    /// Hold `start..end` (addresses), shared or exclusive; a `BufferError` if another view
    /// holds overlapping memory and either of the two is exclusive, or a writer is writing
    /// there. An empty range holds nothing and never conflicts.
    pub fn take(start: usize, end: usize, exclusive: bool) -> Result<Option<Borrow>> {
        if start >= end {
            return Ok(None);
        }
        let conflict = HELD.with(|held| {
            let found = held
                .iter()
                .find(|e| e.start < end && start < e.end && (e.exclusive || exclusive))
                .copied();
            if found.is_none() {
                held.push(Entry {
                    start,
                    end,
                    exclusive,
                    holder: VIEW,
                });
            }
            found
        });
        if let Some(other) = conflict {
            return Err(match other.holder {
                VIEW if other.exclusive => Error::buffer(
                    "this memory is already borrowed mutably by another Rust view (view_mut); \
                     drop that view first",
                ),
                VIEW => Error::buffer(
                    "this memory is borrowed by another Rust view; a mutable view (view_mut) \
                     needs it alone: drop the other views first",
                ),
                WRITER => Error::buffer(
                    "this memory is being written (copyto, on another thread); view it once the \
                     copy is done",
                ),
                _ => held_by_rust_numpy(exclusive),
            });
        }
        Ok(Some(Borrow {
            start,
            end,
            exclusive,
        }))
    }

    /// End the hold (as dropping does).
    pub fn give_back(self) {
        drop(self);
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

impl Drop for Borrow {
    fn drop(&mut self) {
        remove(self.entry());
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

/// A rust-numpy borrow of `start..end` (addresses), `exclusive` or shared, acquired with the
/// array at `holder` (an object's address, never 0 or 1, which the borrow keeps alive: no other
/// array has it until `release_rust_numpy`): refused (-1) where a view holds any of it in
/// conflict, else `acquire`'s answer (rust-numpy's own flags), recorded when granted (0). The
/// check, `acquire` and the record are one step under the registry's lock, so no view can come
/// between; `acquire` must run no Python code and never reach the registry (rust-numpy's own
/// lock is taken inside it, so always after the registry's).
pub fn acquire_rust_numpy(
    start: usize,
    end: usize,
    exclusive: bool,
    holder: usize,
    acquire: impl FnOnce() -> c_int,
) -> c_int {
    HELD.with(|held| {
        let viewed = held.iter().any(|e| {
            e.holder == VIEW && e.start < end && start < e.end && (e.exclusive || exclusive)
        });
        if viewed {
            return -1;
        }
        let status = acquire();
        if status == 0 {
            held.push(Entry {
                start,
                end,
                exclusive,
                holder,
            });
        }
        status
    })
}

/// End a rust-numpy borrow acquired with the array at `holder`: `release` (rust-numpy's own
/// flags, as `acquire_rust_numpy`'s `acquire`), and the registry forgets the borrow, found by the
/// array (whose range Python code may have changed since, `a.shape = ...`): any one of its
/// borrows of that kind, as they are released one for one. One step under the registry's lock.
pub fn release_rust_numpy(exclusive: bool, holder: usize, release: impl FnOnce()) {
    HELD.with(|held| {
        release();
        if let Some(k) = held
            .iter()
            .rposition(|e| e.holder == holder && e.exclusive == exclusive)
        {
            held.swap_remove(k);
        }
    });
}

fn remove(entry: Entry) {
    HELD.with(|held| {
        if let Some(k) = held.iter().rposition(|e| *e == entry) {
            held.swap_remove(k);
        }
    });
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicIsize, Ordering};

    use super::{Borrow, Writing, acquire_rust_numpy, release_rust_numpy};

    // Addresses far from any other test's, so tests running at once can't meet.
    const BASE: usize = 0x7000_0000_0000;

    #[test]
    fn shared_views_coexist_and_a_mutable_one_needs_its_memory_alone() {
        let take = |start, end, exclusive| Borrow::take(BASE + start, BASE + end, exclusive);
        let a = take(0, 100, false).unwrap();
        let b = take(50, 150, false).unwrap();
        assert!(take(99, 120, true).is_err());
        // Adjacent memory is not shared.
        let c = take(150, 200, true).unwrap();
        assert!(take(160, 170, false).is_err());
        drop((a, b));
        let d = take(0, 150, true).unwrap();
        c.unwrap().give_back();
        drop(d);
        assert!(take(0, 200, true).unwrap().is_some());
        assert!(take(0, 0, true).unwrap().is_none());
    }

    #[test]
    fn writes_beside_a_view_are_the_writers() {
        let at = |offset| BASE + 0x20_0000 + offset;
        let view = Borrow::take(at(100), at(200), false).unwrap();
        // the bytes either side of the view's are free to write, one more byte is not
        assert!(Writing::take(at(0), at(100), "copyto").is_ok());
        assert!(Writing::take(at(200), at(300), "copyto").is_ok());
        assert!(Writing::take(at(0), at(101), "copyto").is_err());
        assert!(Writing::take(at(199), at(300), "copyto").is_err());
        drop(view);
    }

    #[test]
    fn rust_numpy_borrows_meet_views_only() {
        const ARRAY: usize = 0x1234_5670;
        let at = |offset| BASE + 0x10_0000 + offset;
        let granted = || 0;
        // A rust-numpy borrow refuses a mutable view of its memory, a mutable one any view.
        assert_eq!(acquire_rust_numpy(at(0), at(100), false, ARRAY, granted), 0);
        assert!(Borrow::take(at(10), at(20), false).unwrap().is_some());
        let refused = Borrow::take(at(10), at(20), true).err().unwrap();
        assert!(format!("{refused:?}").contains("borrowed through rust-numpy"));
        assert_eq!(
            acquire_rust_numpy(at(200), at(300), true, ARRAY + 16, granted),
            0
        );
        assert!(Borrow::take(at(250), at(251), false).is_err());
        // Views are what rust-numpy's borrows are checked against, not each other; a refusal
        // never reaches rust-numpy's flags, and what they refuse is not recorded.
        let view = Borrow::take(at(400), at(500), false).unwrap();
        let unreached = || panic!("rust-numpy's flags asked after a view's refusal");
        assert_eq!(
            acquire_rust_numpy(at(450), at(460), true, ARRAY + 32, unreached),
            -1
        );
        assert_eq!(
            acquire_rust_numpy(at(450), at(460), false, ARRAY + 32, || -1),
            -1
        );
        assert_eq!(
            acquire_rust_numpy(at(450), at(460), false, ARRAY + 32, granted),
            0
        );
        // Released by the array, whatever its range became; the views' writers never consult
        // them.
        assert!(Writing::take(at(0), at(300), "copyto").is_ok());
        let mut released = 0;
        release_rust_numpy(false, ARRAY, || released += 1);
        release_rust_numpy(true, ARRAY + 16, || released += 1);
        release_rust_numpy(false, ARRAY + 32, || released += 1);
        assert_eq!(released, 3);
        assert!(Borrow::take(at(0), at(300), true).unwrap().is_some());
        drop(view);
    }

    #[test]
    fn a_writer_and_the_views_of_its_memory_exclude_each_other() {
        let at = |offset| BASE + 0x20_0000 + offset;
        let view = Borrow::take(at(0), at(100), false).unwrap();
        let refused = Writing::take(at(50), at(150), "copyto").err().unwrap();
        assert!(format!("{refused:?}").contains("borrowed by a view"));
        drop(view);
        let writing = Writing::take(at(50), at(150), "copyto").unwrap();
        // Writers don't exclude each other; views of what they write wait for both.
        let other = Writing::take(at(0), at(60), "copyto").unwrap();
        let refused = Borrow::take(at(140), at(141), false).err().unwrap();
        assert!(format!("{refused:?}").contains("being written"));
        drop(writing);
        assert!(Borrow::take(at(100), at(200), true).unwrap().is_some());
        assert!(Borrow::take(at(0), at(10), false).is_err());
        drop(other);
        assert!(Borrow::take(at(0), at(200), true).unwrap().is_some());
    }

    /// Threads taking and giving back views of overlapping ranges: a mutable view is never
    /// granted beside another view of its memory, and nothing stays held.
    #[test]
    fn threads_never_hold_conflicting_views() {
        let at = |offset| BASE + 0x30_0000 + offset;
        // Per 100-byte cell: the views held now (a mutable one counts as -1000).
        let cells: [AtomicIsize; 4] = Default::default();
        std::thread::scope(|scope| {
            for thread in 0..4usize {
                let cells = &cells;
                scope.spawn(move || {
                    for k in 0..2000usize {
                        let first = (thread + k) % 4;
                        let last = (first + k % 2).min(3);
                        let exclusive = (thread + k) % 3 == 0;
                        let Ok(Some(view)) =
                            Borrow::take(at(100 * first), at(100 * (last + 1)), exclusive)
                        else {
                            continue;
                        };
                        let weight = if exclusive { -1000 } else { 1 };
                        for cell in &cells[first..=last] {
                            let before = cell.fetch_add(weight, Ordering::SeqCst);
                            assert!(
                                if exclusive { before == 0 } else { before >= 0 },
                                "a view was granted beside a conflicting one"
                            );
                        }
                        for cell in &cells[first..=last] {
                            cell.fetch_sub(weight, Ordering::SeqCst);
                        }
                        drop(view);
                    }
                });
            }
        });
        assert!(Borrow::take(at(0), at(400), true).unwrap().is_some());
    }

    #[test]
    fn a_refusal_names_what_holds_the_memory() {
        let at = |offset| BASE + 0x30_0000 + offset;
        let refusal = |taken: super::Result<Option<Borrow>>| format!("{:?}", taken.err().unwrap());
        let shared = Borrow::take(at(0), at(100), false).unwrap();
        assert!(refusal(Borrow::take(at(50), at(60), true)).contains(
            "this memory is borrowed by another Rust view; a mutable view (view_mut) needs \
                 it alone"
        ));
        drop(shared);
        let exclusive = Borrow::take(at(0), at(100), true).unwrap();
        assert!(
            refusal(Borrow::take(at(50), at(60), false))
                .contains("this memory is already borrowed mutably by another Rust view")
        );
        drop(exclusive);
    }

    #[test]
    fn rust_numpy_borrows_beside_a_view_are_granted() {
        const ARRAY: usize = 0x2234_5670;
        let at = |offset| BASE + 0x40_0000 + offset;
        let granted = || 0;
        let view = Borrow::take(at(100), at(200), true).unwrap();
        // ending where the view starts, or starting where it ends: no byte shared
        assert_eq!(acquire_rust_numpy(at(0), at(100), true, ARRAY, granted), 0);
        assert_eq!(
            acquire_rust_numpy(at(200), at(300), true, ARRAY + 16, granted),
            0
        );
        // one byte into it: refused
        assert_eq!(
            acquire_rust_numpy(at(0), at(101), false, ARRAY + 32, granted),
            -1
        );
        assert_eq!(
            acquire_rust_numpy(at(199), at(300), false, ARRAY + 48, granted),
            -1
        );
        release_rust_numpy(true, ARRAY, || ());
        release_rust_numpy(true, ARRAY + 16, || ());
        drop(view);
    }

    #[test]
    fn a_range_is_the_bytes_the_elements_span() {
        use dlpack_core::dtype::DType;
        use dlpack_core::layout::Layout;
        use dlpack_core::memory::AlignedBuffer;

        use super::{range_of, span};
        use crate::tensor::Tensor;

        let at = |address: usize| address as *const std::ffi::c_void;
        // 2 x 3 float32s from 0x1000: 24 bytes on
        let c = Layout::c_order(&[2, 3], 4).unwrap();
        assert_eq!(span(at(0x1000), &c, 4).ok(), Some((0x1000, 0x1018)));
        // walking backwards from the first element: two items before it, and itself
        let back = Layout::from_byte_strides(&[3], Some(&[-4]), 4).unwrap();
        assert_eq!(span(at(0x1000), &back, 4).ok(), Some((0xff8, 0x1004)));
        let refused = span(at(0x4), &back, 4).err().unwrap();
        assert!(
            format!("{refused:?}").contains(
                "this memory's layout spans bytes -8..4 from its first element at 0x4, outside \
                 the address space"
            ),
            "{refused:?}"
        );
        let dtype = DType::from_name("float32").unwrap();
        let buffer = AlignedBuffer::new(24).unwrap();
        let start = buffer.as_ptr() as usize;
        let tensor = Tensor::host_allocation(buffer, dtype, c).ok().unwrap();
        assert_eq!(range_of(&tensor).ok(), Some((start, start + 24)));
    }
}
