//! What keeps a tensor's memory alive, and its release: Python references, buffer views and
//! producers' deleters only while attached to the interpreter (or, in a deallocator, known to
//! hold the GIL); memory we allocated or a Rust value holds, anywhere.

use std::ffi::c_int;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use dlpack_core::memory::{AlignedBuffer, DeviceBuffer};
use pyo3::{Py, PyAny, Python};

use crate::ffi::python::{self, Py_buffer, PyObject};
use dlpack_core::abi::DLManagedTensor;
use dlpack_core::abi::DLManagedTensorVersioned;

/// What keeps the memory alive; released exactly once, when the last holder drops the tensor.
/// Python handles are `ManuallyDrop` so that they are only released while attached.
pub enum Owner {
    /// A buffer-protocol view, `PyBuffer_Release`d on drop, and its exporter (the view holds a
    /// reference too; this one lets the garbage collector see it).
    Buffer {
        view: FilledView,
        exporter: ManuallyDrop<Py<PyAny>>,
    },
    /// A Python object that owns the memory (array interface, CUDA array interface).
    Object(ManuallyDrop<Py<PyAny>>),
    /// An `__array_struct__` capsule and the object it came from.
    ArrayStruct {
        capsule: ManuallyDrop<Py<PyAny>>,
        producer: ManuallyDrop<Py<PyAny>>,
    },
    /// A producer's legacy managed tensor; its deleter is called on drop.
    Legacy(Managed<DLManagedTensor>),
    /// A producer's versioned managed tensor; its deleter is called on drop.
    Versioned(Managed<DLManagedTensorVersioned>),
    /// Memory we allocated for a copy; needs no Python to free.
    Allocation(#[allow(dead_code, reason = "held to be freed on drop")] AlignedBuffer),
    /// Memory we allocated for a copy made when the object was made (the source's memory
    /// couldn't be described as it is), and why; needs no Python to free.
    Copied {
        #[allow(dead_code, reason = "held to be freed on drop")]
        buffer: AlignedBuffer,
        why: Box<str>,
    },
    /// CUDA memory we allocated for a copy; needs no Python to free.
    DeviceAllocation(#[allow(dead_code, reason = "held to be freed on drop")] DeviceBuffer),
    /// An imported Arrow array, whose buffers call the producer's release when dropped: dropped
    /// only while attached, as a producer's release may touch Python objects.
    Arrow(ManuallyDrop<Box<arrow_data::ArrayData>>),
    /// An imported Arrow C array read without `ArrayData` (plain numbers): its producer's
    /// release is called when dropped, only while attached, as for `Arrow`.
    ArrowC(ManuallyDrop<Box<arrow_data::ffi::FFI_ArrowArray>>),
    /// Memory a Rust value holds (a shared segment's mapping, unmapped when the last holder
    /// goes): freed by the value's own drop, on any thread; needs no Python. Its holders tell
    /// their own values apart by downcasting.
    RustValue(std::sync::Arc<dyn std::any::Any + Send + Sync>),
}

/// A buffer view that `get_buffer` filled, which its owner releases once: only `new` makes one.
pub struct FilledView(Box<Py_buffer>);

impl FilledView {
    /// # Safety
    /// `view` was filled by a successful `get_buffer` and is released by nobody else.
    pub unsafe fn new(view: Box<Py_buffer>) -> Self {
        FilledView(view)
    }
}

impl std::ops::Deref for FilledView {
    type Target = Py_buffer;
    fn deref(&self) -> &Py_buffer {
        &self.0
    }
}

/// A producer's managed tensor whose deleter is ours to call, once: only `take` makes one.
pub struct Managed<T>(NonNull<T>);

impl<T> Managed<T> {
    /// # Safety
    /// `managed` is a valid managed tensor (legacy or versioned, as `T` says) that stays valid
    /// until its deleter runs, and whose deleter nobody else will call.
    pub unsafe fn take(managed: NonNull<T>) -> Self {
        Managed(managed)
    }

    pub fn as_ptr(&self) -> *mut T {
        self.0.as_ptr()
    }
}

impl Owner {
    pub fn object(obj: Py<PyAny>) -> Self {
        Owner::Object(ManuallyDrop::new(obj))
    }

    pub fn arrow(data: arrow_data::ArrayData) -> Self {
        // Boxed: the description lives inline in every DLPackObject.
        Owner::Arrow(ManuallyDrop::new(Box::new(data)))
    }

    pub fn arrow_c(array: arrow_data::ffi::FFI_ArrowArray) -> Self {
        // Boxed, as for `arrow`.
        Owner::ArrowC(ManuallyDrop::new(Box::new(array)))
    }

    /// Call `visit` on each Python object this owner holds a reference to (for the garbage
    /// collector); stops at, and returns, the first non-zero result.
    pub fn for_each_object(&self, mut visit: impl FnMut(*mut PyObject) -> c_int) -> c_int {
        let mut each = |objects: &[*mut PyObject]| {
            objects
                .iter()
                .map(|&o| visit(o))
                .find(|&code| code != 0)
                .unwrap_or(0)
        };
        match self {
            // A memoryview is never shown to the collector: clearing one in a cycle drops its
            // memory while our view still reads it (CPython's memoryview clears its managed
            // buffer even with exports outstanding), and our release then crashes. A cycle
            // through a memoryview is left uncollected instead.
            Owner::Buffer { exporter, .. } if is_memoryview(exporter) => 0,
            // The view's own reference (normally to the same exporter) counts too.
            Owner::Buffer { view, exporter } if view.obj == exporter.as_ptr() => {
                each(&[exporter.as_ptr(), exporter.as_ptr()])
            }
            Owner::Buffer { exporter, .. } => each(&[exporter.as_ptr()]),
            Owner::Object(obj) => each(&[obj.as_ptr()]),
            Owner::ArrayStruct { capsule, producer } => {
                each(&[capsule.as_ptr(), producer.as_ptr()])
            }
            Owner::Legacy(_)
            | Owner::Versioned(_)
            | Owner::Arrow(_)
            | Owner::ArrowC(_)
            | Owner::Allocation(_)
            | Owner::Copied { .. }
            | Owner::DeviceAllocation(_) => 0,
            Owner::RustValue(_) => 0,
        }
    }

    /// Release the Python side of the owner: buffer views, references, producers' deleters.
    ///
    /// # Safety
    /// Called once, by a thread holding the GIL; the owner is not used afterwards except to
    /// drop its non-Python fields (`Allocation`, `Copied`, `DeviceAllocation`), which this leaves alone.
    unsafe fn release_python(&mut self) {
        match self {
            Owner::Buffer { view, exporter } => {
                // SAFETY: a `FilledView` was filled by `get_buffer` and is released only here,
                // once: this runs once, holding the GIL (this function's contract).
                unsafe { python::release_buffer(&raw mut *view.0) };
                // SAFETY: the owner's own reference to `exporter` (`ManuallyDrop`: never dropped),
                // given up once, as this runs once, holding the GIL (this function's contract).
                unsafe { python::decref(exporter.as_ptr()) };
            }
            // SAFETY: the owner's own reference to `obj` (`ManuallyDrop`: never dropped), given up
            // once, as this runs once, holding the GIL (this function's contract).
            Owner::Object(obj) => unsafe { python::decref(obj.as_ptr()) },
            Owner::ArrayStruct { capsule, producer } => {
                // SAFETY: the owner's own reference to `capsule` (`ManuallyDrop`: never dropped),
                // given up once, as this runs once, holding the GIL (this function's contract).
                unsafe { python::decref(capsule.as_ptr()) };
                // SAFETY: the owner's own reference to `producer` (`ManuallyDrop`: never dropped),
                // given up once, as this runs once, holding the GIL (this function's contract).
                unsafe { python::decref(producer.as_ptr()) };
            }
            Owner::Legacy(managed) => {
                // SAFETY: a `Managed` is valid until its deleter runs, which happens only here.
                if let Some(deleter) = unsafe { (*managed.as_ptr()).deleter } {
                    // SAFETY: nobody else calls the deleter (`Managed::take`) and this runs once
                    // (this function's contract), so it runs once, on a managed tensor still valid.
                    unsafe { deleter(managed.as_ptr()) };
                }
            }
            Owner::Versioned(managed) => {
                // SAFETY: a `Managed` is valid until its deleter runs, which happens only here.
                if let Some(deleter) = unsafe { (*managed.as_ptr()).deleter } {
                    // SAFETY: nobody else calls the deleter (`Managed::take`) and this runs once
                    // (this function's contract), so it runs once, on a managed tensor still valid.
                    unsafe { deleter(managed.as_ptr()) };
                }
            }
            // SAFETY: dropped only here (`ManuallyDrop`), once, as this runs once and the field is
            // not used afterwards (this function's contract); the producer's release gets the GIL.
            Owner::Arrow(data) => unsafe { ManuallyDrop::drop(data) },
            // SAFETY: dropped only here (`ManuallyDrop`), once, as this runs once and the field is
            // not used afterwards (this function's contract); the producer's release gets the GIL.
            Owner::ArrowC(array) => unsafe { ManuallyDrop::drop(array) },
            Owner::Allocation(_) | Owner::Copied { .. } | Owner::DeviceAllocation(_) => {}
            Owner::RustValue(_) => {}
        }
    }

    /// Release the owner in place on a thread known to hold the GIL (a deallocator CPython
    /// calls), without asking PyO3 whether it may attach: its Python side, then what remains of
    /// ours (a buffer view's box, our allocations).
    ///
    /// # Safety
    /// `owner` is live and not used (nor dropped) again; the calling thread holds the GIL.
    pub unsafe fn release_attached_in_place(owner: *mut Owner) {
        // SAFETY: per the contract, `owner` is live and ours alone from here on.
        let owner = unsafe { &mut *owner };
        // SAFETY: per the contract, this is the only release of the owner's Python side.
        unsafe { owner.release_python() };
        // Each remaining field is dropped once, here, and never used again.
        match owner {
            // SAFETY: `owner` is not used nor dropped again (this function's contract), so this is
            // `view`'s only drop.
            Owner::Buffer { view, .. } => unsafe { std::ptr::drop_in_place(view) },
            // SAFETY: `owner` is not used nor dropped again (this function's contract), so this is
            // `buffer`'s only drop.
            Owner::Allocation(buffer) => unsafe { std::ptr::drop_in_place(buffer) },
            Owner::Copied { buffer, why } => {
                // SAFETY: `owner` is not used nor dropped again (this function's contract), so this
                // is `buffer`'s only drop.
                unsafe { std::ptr::drop_in_place(buffer) };
                // SAFETY: `owner` is not used nor dropped again (this function's contract), so this
                // is `why`'s only drop.
                unsafe { std::ptr::drop_in_place(why) };
            }
            // SAFETY: `owner` is not used nor dropped again (this function's contract), so this is
            // `buffer`'s only drop.
            Owner::DeviceAllocation(buffer) => unsafe { std::ptr::drop_in_place(buffer) },
            // SAFETY: `owner` is not used nor dropped again (this function's contract), so this is
            // `value`'s only drop.
            Owner::RustValue(value) => unsafe { std::ptr::drop_in_place(value) },
            Owner::Object(_)
            | Owner::ArrayStruct { .. }
            | Owner::Legacy(_)
            | Owner::Versioned(_)
            | Owner::Arrow(_)
            | Owner::ArrowC(_) => {}
        }
    }
}

/// Whether a buffer's exporter is a memoryview.
fn is_memoryview(exporter: &Py<PyAny>) -> bool {
    // SAFETY: the exporter is live (its owner holds a reference).
    unsafe { python::is_memoryview(exporter.as_ptr()) }
}

impl Owner {
    /// Whether the owner is freed by its fields' own drops, on any thread.
    fn needs_no_python(&self) -> bool {
        matches!(
            self,
            Owner::Allocation(_)
                | Owner::Copied { .. }
                | Owner::DeviceAllocation(_)
                | Owner::RustValue(_)
        )
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        // The last reference may go on any thread (a consumer freeing its array), with or
        // without the GIL, or while the interpreter shuts down. Python state is only touched
        // when this thread can attach; otherwise the memory is left to the process' exit, as
        // numpy does, rather than risking a crash.
        if self.needs_no_python() {
            return; // freed by the field's own drop, on any thread
        }
        // SAFETY: attached here, and `drop` runs once.
        let _ = Python::try_attach(|_py| unsafe { self.release_python() });
    }
}
