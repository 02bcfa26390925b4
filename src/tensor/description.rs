//! A tensor as the importers describe it: data pointer, device, element type, layout, flags,
//! and the owner that keeps the memory alive; and the part of it DLPack can describe as it is.

use std::ffi::c_void;

use dlpack_core::dtype::DType;
use dlpack_core::layout::Layout;
use dlpack_core::memory::AlignedBuffer;

use super::owner::Owner;
use crate::error::{Error, Result};
use dlpack_core::abi::DLDevice;

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
/// What copies and exports rely on (the tensor's memory invariant): while `owner` lives, the
/// bytes `data` and `layout` address (items of `dtype`, reached through the buffer view when
/// `indirect`) are memory of `device`, readable, and writable unless `readonly`; `stream` is a
/// stream of that device. The fields are private, so the invariant is a rule of the type: every
/// constructor given an address is an `unsafe fn` whose caller vouches for it (for an import,
/// on the producer's word: an address in an array interface, a DLPack tensor, which nothing can
/// check), the constructors over buffers we allocated check the layout fits, and after
/// construction only `make_readonly` and `set_swapped` change a tensor safely.
pub struct Tensor {
    /// Address of the first element (any `byte_offset` already applied).
    data: *mut c_void,
    device: Device,
    dtype: DType,
    layout: Layout,
    readonly: bool,
    /// Elements are stored in the other byte order (only a copy can serve them).
    swapped: bool,
    /// A buffer with suboffsets: rows are reached through pointers (only a copy can serve it).
    indirect: bool,
    /// The CUDA stream a `__cuda_array_interface__` producer said its data is ready on.
    stream: Option<isize>,
    owner: Owner,
}

/// The fields of a `Tensor`, given to `Tensor::new` (which is `unsafe`: see there).
pub struct TensorParts {
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
    pub owner: Owner,
}

// SAFETY: `data` is only an address that is never dereferenced without the owner alive; the
// owner's Python handles are only released while attached to the interpreter (see `Owner::drop`),
// and producers' deleters may be called from any thread per the DLPack contract.
unsafe impl Send for Tensor {}
// SAFETY: nothing in a `Tensor` is mutated after construction except through `&mut`.
unsafe impl Sync for Tensor {}

impl Tensor {
    /// A tensor of `parts`.
    ///
    /// # Safety
    /// The memory invariant holds of `parts`: while `parts.owner` lives, the bytes `parts.data`
    /// and `parts.layout` address (items of `parts.dtype`, reached through the buffer view when
    /// `parts.indirect`) are memory of `parts.device`, readable, and writable unless
    /// `parts.readonly`; `parts.stream`, if any, is a stream of that device.
    #[inline(always)]
    pub unsafe fn new(parts: TensorParts) -> Tensor {
        let TensorParts {
            data,
            device,
            dtype,
            layout,
            readonly,
            swapped,
            indirect,
            stream,
            owner,
        } = parts;
        Tensor {
            data,
            device,
            dtype,
            layout,
            readonly,
            swapped,
            indirect,
            stream,
            owner,
        }
    }

    /// Where the layout of the tensor at `dst` goes, for building it in place (see
    /// `Layout::build_into`) before `complete_in_place` writes the other fields.
    ///
    /// # Safety
    /// `dst` is valid for writes of a `Tensor`.
    #[inline(always)]
    pub unsafe fn layout_place(dst: *mut Tensor) -> *mut Layout {
        // SAFETY: per the contract, `dst` addresses a `Tensor`'s worth of memory we may write.
        unsafe { &raw mut (*dst).layout }
    }

    /// Complete the tensor at `dst`, whose layout is written (see `layout_place`): each other
    /// field written once, in place (built on the stack and moved, a tensor cost more in copying
    /// than in reading). `writes_every_field` below names every field, so a new one fails to
    /// compile there until it is written here too.
    ///
    /// # Safety
    /// `dst` is valid for writes of a `Tensor`, and holds a layout and no other field; the
    /// memory invariant (see `Tensor::new`) holds of the arguments with that layout.
    #[inline(always)]
    #[allow(
        clippy::too_many_arguments,
        reason = "one per field, each written in place"
    )]
    pub unsafe fn complete_in_place(
        dst: *mut Tensor,
        data: *mut c_void,
        device: Device,
        dtype: DType,
        readonly: bool,
        swapped: bool,
        indirect: bool,
        stream: Option<isize>,
        owner: Owner,
    ) {
        // Each field: its place in `dst`, then its value, written once.
        macro_rules! write_field {
            ($field:ident) => {{
                // SAFETY: per the contract, the fields of `dst` lie in memory we may write.
                let place = unsafe { &raw mut (*dst).$field };
                // SAFETY: as above; `write` drops nothing (the field holds nothing yet).
                unsafe { place.write($field) };
            }};
        }
        write_field!(data);
        write_field!(device);
        write_field!(dtype);
        write_field!(readonly);
        write_field!(swapped);
        write_field!(indirect);
        write_field!(stream);
        write_field!(owner);
    }

    /// Every field of `Tensor`, named so that adding one fails to compile here: the in-place
    /// construction (`layout_place`, `complete_in_place`) writes them one by one and must then
    /// write the new one too. (This list and those writes must match: keep them together when
    /// editing either.)
    #[allow(dead_code, reason = "a compile-time check")]
    fn writes_every_field(tensor: &Tensor) {
        let Tensor {
            data: _,
            device: _,
            dtype: _,
            layout: _,
            readonly: _,
            swapped: _,
            indirect: _,
            stream: _,
            owner: _,
        } = tensor;
    }

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

    /// A C-ordered, writable, native-order CPU tensor in a buffer we allocated; an error if
    /// `layout` reaches bytes outside the buffer.
    pub fn host_allocation(buffer: AlignedBuffer, dtype: DType, layout: Layout) -> Result<Tensor> {
        fits(&buffer, dtype, &layout)?;
        let data = buffer.as_ptr().cast();
        // SAFETY: `layout` addresses only bytes of the buffer (checked just above), host memory
        // we allocated, readable and writable, that the owner frees when it goes.
        Ok(unsafe { Tensor::owned(data, Device::CPU, dtype, layout, Owner::Allocation(buffer)) })
    }

    /// `host_allocation` for a copy made when the tensor was made, and why it was made (the
    /// object's `copy_reason`).
    pub fn host_copy(
        buffer: AlignedBuffer,
        dtype: DType,
        layout: Layout,
        why: String,
    ) -> Result<Tensor> {
        fits(&buffer, dtype, &layout)?;
        let data = buffer.as_ptr().cast();
        let why = why.into_boxed_str();
        let owner = Owner::Copied { buffer, why };
        // SAFETY: as in `host_allocation`.
        Ok(unsafe { Tensor::owned(data, Device::CPU, dtype, layout, owner) })
    }

    /// Why the memory is a copy of the source's made when the tensor was made, if it is.
    pub fn copied(&self) -> Option<&str> {
        match &self.owner {
            Owner::Copied { why, .. } => Some(why),
            _ => None,
        }
    }

    /// A writable, native-order tensor in memory we own (a copy or an allocation).
    ///
    /// # Safety
    /// The memory invariant (see `Tensor::new`) holds of the arguments, the tensor writable:
    /// while `owner` lives, the bytes `data` and `layout` address (items of `dtype`) are memory
    /// of `device`, readable and writable.
    pub unsafe fn owned(
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

    /// The same tensor with `layout` in place of its own.
    ///
    /// # Safety
    /// The memory invariant (see `Tensor::new`) holds with `layout`: the bytes it addresses from
    /// the tensor's data are memory the tensor's owner keeps alive, as the tensor's own layout's
    /// are (for example, the same bytes in another order).
    #[inline]
    pub unsafe fn with_layout(self, layout: Layout) -> Tensor {
        Tensor { layout, ..self }
    }

    /// Make the tensor read-only (there is no safe way back: see `Tensor::new`).
    #[inline]
    pub fn make_readonly(&mut self) {
        self.readonly = true;
    }

    /// Say whether the elements are stored in the other byte order (which byte order the bytes
    /// are read in; which bytes may be read or written is unchanged).
    #[inline]
    pub fn set_swapped(&mut self, swapped: bool) {
        self.swapped = swapped;
    }

    /// Address of the first element (any `byte_offset` already applied).
    #[inline]
    pub fn data(&self) -> *mut c_void {
        self.data
    }

    #[inline]
    pub fn device(&self) -> &Device {
        &self.device
    }

    #[inline]
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    #[inline]
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    #[inline]
    pub fn readonly(&self) -> bool {
        self.readonly
    }

    /// Elements are stored in the other byte order (only a copy can serve them).
    #[inline]
    pub fn swapped(&self) -> bool {
        self.swapped
    }

    /// A buffer with suboffsets: rows are reached through pointers (only a copy can serve it).
    #[inline]
    pub fn indirect(&self) -> bool {
        self.indirect
    }

    /// The CUDA stream a `__cuda_array_interface__` producer said its data is ready on.
    #[inline]
    pub fn stream(&self) -> Option<isize> {
        self.stream
    }

    /// What keeps the memory alive.
    #[inline]
    pub fn owner(&self) -> &Owner {
        &self.owner
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

/// Whether `layout` (items of `dtype`) addresses only bytes of `buffer` from its start.
fn fits(buffer: &AlignedBuffer, dtype: DType, layout: &Layout) -> Result<()> {
    let (low, high) = layout.byte_extent(dtype.itemsize())?;
    if low < 0 || high > buffer.size() as i64 {
        return Err(Error::runtime(
            "internal error: a layout reaches past the buffer allocated for it",
        ));
    }
    Ok(())
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
