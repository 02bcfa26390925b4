//! The one tensor description every importer produces and every exporter reads: where the data
//! is (pointer and device), what it holds (dtype), how it is laid out (shape, strides), whether
//! it may be written, and who keeps the memory alive (the owner). Its parts without Python
//! (element types, layouts, buffers we own) are the core's, re-exported here.

use std::ffi::{c_int, c_void};
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use pyo3::{Py, PyAny, Python};

use crate::error::{Error, Result};
use crate::ffi::python::{self, Py_buffer, PyObject};
use crate::ffi::{DLDevice, DLManagedTensor, DLManagedTensorVersioned};
pub use dlpack_core::dtype::{self, DType};
pub use dlpack_core::layout::{self, Layout};
pub use dlpack_core::memory::{AlignedBuffer, DeviceBuffer};

/// Where the data lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Device {
    Known(DLDevice),
    /// CUDA memory whose device could not be determined (e.g. no CUDA driver here): the
    /// metadata is usable, exporting is not.
    Unresolved {
        reason: String,
    },
}

impl Device {
    pub const CPU: Device = Device::Known(DLDevice::CPU);

    pub fn get(&self) -> Result<DLDevice> {
        match self {
            Device::Known(device) => Ok(*device),
            Device::Unresolved { reason } => Err(Error::buffer(reason.clone())),
        }
    }
}

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
        source: ManuallyDrop<Py<PyAny>>,
    },
    /// A producer's legacy managed tensor; its deleter is called on drop.
    Legacy(Managed<DLManagedTensor>),
    /// A producer's versioned managed tensor; its deleter is called on drop.
    Versioned(Managed<DLManagedTensorVersioned>),
    /// Memory we allocated for a copy; needs no Python to free.
    Allocation(#[allow(dead_code, reason = "held to be freed on drop")] AlignedBuffer),
    /// CUDA memory we allocated for a copy; needs no Python to free.
    DeviceAllocation(#[allow(dead_code, reason = "held to be freed on drop")] DeviceBuffer),
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
            // The view's own reference (normally to the same exporter) counts too.
            Owner::Buffer { view, exporter } if view.obj == exporter.as_ptr() => {
                each(&[exporter.as_ptr(), exporter.as_ptr()])
            }
            Owner::Buffer { exporter, .. } => each(&[exporter.as_ptr()]),
            Owner::Object(obj) => each(&[obj.as_ptr()]),
            Owner::ArrayStruct { capsule, source } => each(&[capsule.as_ptr(), source.as_ptr()]),
            Owner::Legacy(_)
            | Owner::Versioned(_)
            | Owner::Allocation(_)
            | Owner::DeviceAllocation(_) => 0,
        }
    }

    /// Release the Python side of the owner: buffer views, references, producers' deleters.
    ///
    /// # Safety
    /// Called once, by a thread holding the GIL; the owner is not used afterwards except to
    /// drop its non-Python fields (`Allocation`, `DeviceAllocation`), which this leaves alone.
    unsafe fn release_python(&mut self) {
        // Per the contract, this runs once, holding the GIL, so the decrefs and releases happen
        // now and only once: "as said" below.
        match self {
            Owner::Buffer { view, exporter } => {
                // SAFETY: as said; a `FilledView` was filled by a successful `get_buffer`.
                unsafe { python::release_buffer(&raw mut *view.0) };
                // SAFETY: as said.
                unsafe { python::decref(exporter.as_ptr()) };
            }
            // SAFETY: as said.
            Owner::Object(obj) => unsafe { python::decref(obj.as_ptr()) },
            Owner::ArrayStruct { capsule, source } => {
                // SAFETY: as said.
                unsafe { python::decref(capsule.as_ptr()) };
                // SAFETY: as said.
                unsafe { python::decref(source.as_ptr()) };
            }
            Owner::Legacy(managed) => {
                // SAFETY: a `Managed` is valid until its deleter runs, which happens only here.
                if let Some(deleter) = unsafe { (*managed.as_ptr()).deleter } {
                    // SAFETY: as said; nobody else calls the deleter (`Managed::take`).
                    unsafe { deleter(managed.as_ptr()) };
                }
            }
            Owner::Versioned(managed) => {
                // SAFETY: as for `Legacy`.
                if let Some(deleter) = unsafe { (*managed.as_ptr()).deleter } {
                    // SAFETY: as for `Legacy`.
                    unsafe { deleter(managed.as_ptr()) };
                }
            }
            Owner::Allocation(_) | Owner::DeviceAllocation(_) => {}
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
        // Each remaining field is dropped once, here ("as said" below), and never used again.
        match owner {
            // SAFETY: as said.
            Owner::Buffer { view, .. } => unsafe { std::ptr::drop_in_place(view) },
            // SAFETY: as said.
            Owner::Allocation(buffer) => unsafe { std::ptr::drop_in_place(buffer) },
            // SAFETY: as said.
            Owner::DeviceAllocation(buffer) => unsafe { std::ptr::drop_in_place(buffer) },
            Owner::Object(_)
            | Owner::ArrayStruct { .. }
            | Owner::Legacy(_)
            | Owner::Versioned(_) => {}
        }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        // The last reference may go on any thread (a consumer freeing its array), with or
        // without the GIL, or while the interpreter shuts down. Python state is only touched
        // when this thread can attach; otherwise the memory is left to the process' exit, as
        // numpy does, rather than risking a crash.
        if matches!(self, Owner::Allocation(_) | Owner::DeviceAllocation(_)) {
            return; // freed by the field's own drop, on any thread
        }
        // SAFETY: attached here, and `drop` runs once.
        let _ = Python::try_attach(|_py| unsafe { self.release_python() });
    }
}

/// An imported tensor. Held by its `DLPackObject`, which every capsule exported from it keeps
/// alive (copies are shared in an `Arc` by their capsules); the owner releases the memory when
/// the last of them goes.
pub struct Tensor {
    /// Address of the first element (any `byte_offset` already applied).
    pub data: *mut c_void,
    pub device: Device,
    pub dtype: DType,
    pub layout: Layout,
    pub readonly: bool,
    /// Elements are stored in the other byte order (only a copy can serve them).
    pub swapped: bool,
    /// A buffer with suboffsets: rows are reached through pointers (only a copy can serve it).
    pub indirect: bool,
    /// The CUDA stream a `__cuda_array_interface__` producer said its data is ready on.
    pub stream: Option<isize>,
    #[allow(dead_code, reason = "held to release the memory on drop")]
    pub owner: Owner,
}

// SAFETY: `data` is only an address that is never dereferenced without the owner alive; the
// owner's Python handles are only released while attached to the interpreter (see `Owner::drop`),
// and producers' deleters may be called from any thread per the DLPack contract.
unsafe impl Send for Tensor {}
// SAFETY: nothing in a `Tensor` is mutated after construction.
unsafe impl Sync for Tensor {}

impl Tensor {
    /// Release a tensor in place, on a thread known to hold the GIL (a deallocator CPython
    /// calls): its owner as `Owner::release_attached_in_place` does, its other fields dropped. Nothing is
    /// moved: copying the owner out cost a store-forwarding stall per object.
    ///
    /// # Safety
    /// `tensor` is a live tensor, not used again; the calling thread holds the GIL.
    pub unsafe fn release_attached_in_place(tensor: *mut Tensor) {
        // SAFETY: per the contract, live and ours alone from here on.
        let tensor = unsafe { &mut *tensor };
        // Every field is dropped or released exactly once, here ("as said" below): the pattern
        // names them all, so a new field can't be forgotten.
        let Tensor {
            data: _,
            device,
            dtype: _,
            layout,
            readonly: _,
            swapped: _,
            indirect: _,
            stream: _,
            owner,
        } = tensor;
        // SAFETY: as said.
        unsafe { std::ptr::drop_in_place(device) };
        // SAFETY: as said.
        unsafe { std::ptr::drop_in_place(layout) };
        // SAFETY: as said; the calling thread holds the GIL (the contract).
        unsafe { Owner::release_attached_in_place(owner) };
    }

    /// A C-ordered, writable, native-order CPU tensor in a buffer we allocated.
    pub fn host_allocation(buffer: AlignedBuffer, dtype: DType, layout: Layout) -> Tensor {
        Tensor::owned(
            buffer.as_ptr().cast(),
            Device::CPU,
            dtype,
            layout,
            Owner::Allocation(buffer),
        )
    }

    /// A writable, native-order tensor in memory we own (a copy or an allocation).
    pub fn owned(
        data: *mut c_void,
        device: Device,
        dtype: DType,
        layout: Layout,
        owner: Owner,
    ) -> Tensor {
        Tensor {
            data,
            device,
            dtype,
            layout,
            readonly: false,
            swapped: false,
            indirect: false,
            stream: None,
            owner,
        }
    }

    pub fn numel(&self) -> i64 {
        self.layout.numel()
    }

    /// Bytes of the elements if stored densely (saturating: a broadcast view may describe more
    /// than memory holds).
    pub fn nbytes(&self) -> i64 {
        self.numel().saturating_mul(self.dtype.itemsize() as i64)
    }

    /// The tensor as DLPack can describe it, or why it can't as it is (then only a copy can
    /// serve it).
    #[inline(always)]
    pub fn exportable(&self) -> std::result::Result<Exportable<'_>, &'static str> {
        if self.indirect {
            return Err("buffers with suboffsets (indirect, PIL-style memory) can't be DLPack");
        }
        if self.swapped {
            return Err(
                "non-native byte order can't be DLPack (DLPack data is in native byte order)",
            );
        }
        let Some(strides) = self.layout.strides() else {
            return Err("byte strides that are not a multiple of the item size can't be DLPack");
        };
        Ok(Exportable {
            data: self.data,
            dtype: self.dtype,
            shape: self.layout.shape(),
            strides,
        })
    }

    /// Reject a null data pointer for a tensor that has elements.
    pub fn check_data(data: *mut c_void, layout: &Layout) -> Result<()> {
        if data.is_null() && layout.numel() != 0 {
            return Err(Error::value("null data pointer for a tensor with elements"));
        }
        Ok(())
    }
}

/// A tensor as DLPack describes it: strides in whole elements, native byte order, memory
/// reached directly. Exporters build `DLTensor`s from this alone (`Tensor::exportable` is the
/// only way to one), so no export can carry missing or unset strides.
#[derive(Clone, Copy, Debug)]
pub struct Exportable<'a> {
    pub data: *mut c_void,
    pub dtype: DType,
    pub shape: &'a [i64],
    /// In elements, one per dimension.
    pub strides: &'a [i64],
}
