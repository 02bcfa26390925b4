//! A view's lease on an object's memory, for the C API: the source that keeps the memory
//! alive and the memory's borrow in the process's one registry (`borrows`), and in rust-numpy's
//! borrow flags when a numpy array holds the memory (`rust_numpy`).
//!
//! A view is made and given back once per call of a Rust function taking an array, so its
//! description is written in place into a reused box: moving a tensor and allocating its box
//! cost more than reading an exact numpy array does.

use std::mem::MaybeUninit;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use dlpack_core::layout::{SelfOverlap, self_overlap};
use pyo3::prelude::*;

use super::borrows::{self, Borrow};
use super::rust_numpy::{self, NumpyBorrow};
use crate::error::{Error, Result};
use crate::import::{self, array_interface::type_name};
use crate::object::tensor_of;
use crate::tensor::Tensor;

/// What a view holds, free of the interpreter's lifetime (the C API hands it out boxed): the
/// source that keeps the memory alive, and the memory's borrows. Given back with the GIL held
/// (`release`); only `make` builds one.
pub(crate) struct Lease {
    /// The imported tensor, initialised exactly when `claims.object` is `None`.
    imported: MaybeUninit<Tensor>,
    claims: Claims,
}

/// The rest of a `Lease`, written at once beside the tensor written in place.
struct Claims {
    /// A `DLPackObject`, whose own tensor is read in place; `None`: `imported` is the tensor.
    object: Option<Py<PyAny>>,
    borrow: Option<Borrow>,
    /// The same memory's borrow in rust-numpy's flags, when a numpy array holds it.
    numpy: Option<NumpyBorrow>,
    exclusive: bool,
}

/// One box kept from the last view given back, for the next view to reuse (null: none), taken
/// and put back by atomic swaps, so threads never share one.
static SPARE: AtomicPtr<MaybeUninit<Lease>> = AtomicPtr::new(ptr::null_mut());

fn take_box() -> Box<MaybeUninit<Lease>> {
    let spare = SPARE.swap(ptr::null_mut(), Ordering::Acquire);
    if spare.is_null() {
        return Box::new_uninit();
    }
    // SAFETY: a non-null `SPARE` came from `Box::into_raw` (`keep_box`), and the swap made it
    // this thread's alone.
    unsafe { Box::from_raw(spare) }
}

fn keep_box(spare: Box<MaybeUninit<Lease>>) {
    let old = SPARE.swap(Box::into_raw(spare), Ordering::AcqRel);
    if !old.is_null() {
        // SAFETY: a non-null `SPARE` came from `Box::into_raw` (above, by an earlier call), and
        // the swap made it this thread's alone; freed as uninitialised memory (no Python code).
        drop(unsafe { Box::from_raw(old) });
    }
}

impl Lease {
    /// `obj`'s memory, held shared, or `exclusive`ly (writable host memory only), in a box.
    pub(crate) fn make(obj: &Bound<'_, PyAny>, exclusive: bool) -> Result<Box<Lease>> {
        let mut slot = take_box();
        let dst = slot.as_mut_ptr();
        // SAFETY: `dst` is the box's memory, ours alone and valid for writes of a `Lease`.
        match unsafe { Lease::write(dst, obj, exclusive) } {
            // SAFETY: `write` initialised the whole `Lease` when it succeeded.
            Ok(()) => Ok(unsafe { slot.assume_init() }),
            Err(err) => {
                keep_box(slot);
                Err(err)
            }
        }
    }

    /// Write the hold of `obj`'s memory at `dst`: whole when it succeeds, nothing to drop when
    /// it fails.
    ///
    /// # Safety
    /// `dst` is valid for writes of a `Lease`.
    unsafe fn write(dst: *mut Lease, obj: &Bound<'_, PyAny>, exclusive: bool) -> Result<()> {
        // SAFETY: per the contract, `dst`'s fields may be written.
        let imported = unsafe { (&raw mut (*dst).imported).cast::<Tensor>() };
        let object = if tensor_of(obj).is_some() {
            Some(obj.clone().unbind())
        // SAFETY: `imported` is valid for writes of a `Tensor` (the contract).
        } else if unsafe { import::import_known_into(obj, imported) } {
            None
        } else {
            // The object's protocols run Python code: attached through PyO3, so that the
            // references dropped on the way (a producer kept for device memory, errors of
            // protocols tried and passed over) are released now rather than queued (see
            // `at_c_boundary`).
            let tensor = Python::attach(|_| import::import_in_place(obj).map(|i| i.tensor))?;
            // SAFETY: `imported` is valid for writes of a `Tensor` (the contract), and
            // `import_known_into` declined, leaving it unwritten.
            unsafe { imported.write(tensor) };
            None
        };
        // SAFETY: per the contract, `dst` addresses a `Lease`'s memory, which its fields lie in.
        let claims = unsafe { &raw mut (*dst).claims };
        // SAFETY: the field is valid for writes (the contract) and written once, here; the
        // tensor was written exactly when `object` is `None`, so the `Lease` is now whole.
        unsafe {
            claims.write(Claims {
                object,
                borrow: None,
                numpy: None,
                exclusive,
            })
        };
        // SAFETY: whole, just above, and ours alone.
        let lease = unsafe { &mut *dst };
        match lease.hold(obj) {
            Ok(borrow) => {
                lease.claims.borrow = borrow;
                if lease.claims.borrow.is_some() && rust_numpy::views_borrow_there(obj.py()) {
                    // SAFETY: per the contract, the `Lease` is not used again if this fails.
                    return unsafe { lease.hold_in_rust_numpy(obj) };
                }
                Ok(())
            }
            Err(err) => {
                // SAFETY: the `Lease` is not used again: `make` keeps its memory as
                // uninitialised (it holds no borrows, and nothing else needs dropping).
                unsafe { lease.drop_source(obj.py()) };
                Err(err)
            }
        }
    }

    /// Check what an exclusive view needs, and take the memory's borrow in the registry.
    fn hold(&self, obj: &Bound<'_, PyAny>) -> Result<Option<Borrow>> {
        let tensor = self.tensor(obj.py());
        if self.claims.exclusive {
            host_memory(tensor)?;
            if let Some(why) = tensor.copied() {
                return Err(a_copy(obj, why));
            }
            if tensor.readonly() || import::is_immutable(obj) {
                return Err(Error::buffer(
                    "this array's memory is read-only, so it can't be viewed mutably; \
                     view() reads it, or copy it first",
                ));
            }
            if tensor.indirect() {
                return Err(not_direct());
            }
        }
        // Only host memory is read in place by Rust, so only host memory is held.
        if host_memory(tensor).is_err() || tensor.indirect() {
            return Ok(None);
        }
        let (start, end) = borrows::range_of(tensor)?;
        Borrow::take(start, end, self.claims.exclusive)
    }

    /// Take the same memory's borrow in another extension's table of rust-numpy's borrows too
    /// (asked once the registry lent it, so a conflict there is rust-numpy's); when that fails,
    /// give the registry's back and release the source.
    ///
    /// # Safety
    /// The `Lease` is whole; if this fails, it is not used again (as `drop_source` asks).
    #[cold]
    #[inline(never)]
    unsafe fn hold_in_rust_numpy(&mut self, obj: &Bound<'_, PyAny>) -> Result<()> {
        let tensor = self.tensor(obj.py());
        let taken = borrows::range_of(tensor)
            .and_then(|range| NumpyBorrow::take(obj, tensor, range, self.claims.exclusive));
        match taken {
            Ok(numpy) => {
                self.claims.numpy = numpy;
                Ok(())
            }
            Err(err) => {
                if let Some(borrow) = self.claims.borrow.take() {
                    borrow.give_back();
                }
                // SAFETY: not used again (the contract).
                unsafe { self.drop_source(obj.py()) };
                Err(err)
            }
        }
    }

    /// The memory held, as described when the view was made (a `DLPackObject`'s tensor never
    /// changes).
    pub(crate) fn tensor<'a>(&'a self, py: Python<'a>) -> &'a Tensor {
        match &self.claims.object {
            Some(object) => tensor_of(object.bind(py))
                .expect("a DLPackObject when the view was made, and still"),
            // SAFETY: without an object, the imported tensor is initialised (the type's rule).
            None => unsafe { self.imported.assume_init_ref() },
        }
    }

    /// Whether the memory is held exclusively (a mutable view).
    pub(crate) fn exclusive(&self) -> bool {
        self.claims.exclusive
    }

    /// Release the source, the GIL held (`py`), leaving the rest: an imported tensor's owner
    /// is released directly, where dropping it would first ask whether this thread may attach.
    ///
    /// # Safety
    /// Nothing of the `Lease` but its borrows is used again: its memory is then freed (or kept)
    /// as uninitialised, never dropped as a `Lease`.
    unsafe fn drop_source(&mut self, py: Python<'_>) {
        match self.claims.object.take() {
            // Released as attached: a `Py` dropped here would be queued for later, as PyO3
            // can't tell that a C API caller holds the GIL.
            Some(object) => drop(object.into_bound(py)),
            // SAFETY: without an object, the imported tensor is initialised (the type's rule);
            // the GIL is held (`py`), and the tensor is never used again (the contract).
            None => unsafe { Tensor::release_attached_in_place(self.imported.as_mut_ptr()) },
        }
    }

    /// Give the hold back, the GIL held (`py`), and keep the box for the next view (dropping
    /// it gives the hold back too, more slowly).
    pub(crate) fn release(self: Box<Self>, py: Python<'_>) {
        let raw = Box::into_raw(self);
        // SAFETY: the box's contents, live and ours alone.
        let lease = unsafe { &mut *raw };
        // SAFETY: only the borrows are used after this, and the memory is kept as
        // uninitialised.
        unsafe { lease.drop_source(py) };
        if let Some(numpy) = lease.claims.numpy.take() {
            numpy.give_back(py);
        }
        if let Some(borrow) = lease.claims.borrow.take() {
            borrow.give_back();
        }
        // SAFETY: the allocation `Box::into_raw` gave; its source was released and its borrows
        // given back above, and what remains (`None`s and a bool) needs no drop.
        keep_box(unsafe { Box::from_raw(raw.cast::<MaybeUninit<Lease>>()) });
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.claims.object.is_none() {
            // SAFETY: without an object, the imported tensor is initialised (the type's rule),
            // and dropped once, here.
            unsafe { self.imported.assume_init_drop() };
        }
    }
}

// -- what a view checks ------------------------------------------------------------------------

/// A `BufferError` unless the CPU reads the memory directly (the CPU's, or pinned host memory).
fn host_memory(tensor: &Tensor) -> Result<()> {
    let device = tensor.device().get()?;
    if !device.is_host() {
        return Err(Error::buffer(format!(
            "this array's memory is on {}, which Rust can't read in place; copy it to the host \
             first (e.g. .cpu() in torch, jax.device_get, .get() in CuPy)",
            device.name()
        )));
    }
    Ok(())
}

/// The refusal of a mutable view of memory an import copied (chunks joined, columns gathered,
/// bits made bytes): the writes would land in the copy, never in the object.
#[cold]
fn a_copy(obj: &Bound<'_, PyAny>, why: &str) -> Error {
    Error::buffer(format!(
        "this {}'s memory could only be read as a copy ({why}), so it can't be viewed mutably: \
         the writes would never reach it",
        type_name(obj)
    ))
}

#[cold]
fn not_direct() -> Error {
    Error::buffer(
        "this buffer reaches its rows through pointers (suboffsets), so it can't be read in \
         place; to_vec() copies it",
    )
}

/// A `BufferError` if two of the elements lie in the same bytes (a broadcast view), which no
/// write can serve faithfully.
pub(super) fn check_disjoint(tensor: &Tensor) -> Result<()> {
    let layout = tensor.layout();
    let dims = layout.shape().iter().zip(layout.byte_strides());
    let overlap = self_overlap(
        dims.map(|(&n, &s)| (n as u64, s)),
        tensor.dtype().itemsize() as u64,
    );
    if overlap != SelfOverlap::Disjoint {
        return Err(Error::buffer(
            "elements of this array share memory (a broadcast view), so it can't be written \
             element by element",
        ));
    }
    Ok(())
}
