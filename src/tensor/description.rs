//! A tensor as the importers describe it: data pointer, device, element type, layout, flags,
//! and the owner that keeps the memory alive; and the part of it DLPack can describe as it is.

use std::ffi::c_void;

use dlpack_core::dtype::DType;
use dlpack_core::layout::Layout;
use dlpack_core::memory::AlignedBuffer;

use super::owner::Owner;
use crate::error::{Error, Result};
use crate::ffi::DLDevice;

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

/// An imported tensor. Held by its `DLPackObject`, which every capsule exported from it keeps
/// alive (copies are shared in an `Arc` by their capsules); the owner releases the memory when
/// the last of them goes.
///
/// What every importer vouches for, and copies and exports rely on: while `owner` lives, the
/// bytes `data` and `layout` address (items of `dtype`, reached through the buffer view when
/// `indirect`) are memory of `device`, readable, and writable unless `readonly`; `stream` is a
/// stream of that device. It is the producer's word (an address in an array interface, a
/// DLPack tensor), which nothing can check; the fields are public, so this is a rule of the
/// crate rather than of the type.
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
    /// calls): its owner as `Owner::release_attached_in_place` does, its other fields dropped.
    /// Nothing is moved: copying the owner out cost a store-forwarding stall per object.
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

    /// `host_allocation` for a copy made when the tensor was made, and why it was made (the
    /// object's `copy_reason`).
    pub fn host_copy(buffer: AlignedBuffer, dtype: DType, layout: Layout, why: String) -> Tensor {
        let data = buffer.as_ptr().cast();
        let why = why.into_boxed_str();
        Tensor::owned(
            data,
            Device::CPU,
            dtype,
            layout,
            Owner::Copied { buffer, why },
        )
    }

    /// Why the memory is a copy of the source's made when the tensor was made, if it is.
    pub fn copied(&self) -> Option<&str> {
        match &self.owner {
            Owner::Copied { why, .. } => Some(why),
            _ => None,
        }
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
