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
/// bytes `storage.data` and `layout` address (items of `storage.dtype`, reached through the
/// buffer view when `storage.indirect`) are memory of `storage.device`, readable, and writable
/// unless `storage.readonly`; `storage.stream` is a stream of that device. The fields are
/// private, so the invariant is a rule of the type: every constructor given an address is an
/// `unsafe fn` whose caller vouches for it (for an import, on the producer's word: an address in
/// an array interface, a DLPack tensor, which nothing can check), the constructors over buffers
/// we allocated check the layout fits, and after construction only `make_readonly` and
/// `set_swapped` change a tensor safely.
///
/// Three parts, each named once wherever a tensor is built, written in place or released: what
/// the memory is (`Storage`), how its elements are laid out, and what keeps it alive.
pub struct Tensor {
    storage: Storage,
    layout: Layout,
    owner: Owner,
}

/// What a tensor's memory is, apart from its layout and owner: where it starts and on which
/// device, what its elements are, and how they may be read or written.
pub struct Storage {
    /// Address of the first element (any `byte_offset` already applied).
    pub data: *mut c_void,
    pub device: Device,
    pub dtype: DType,
    pub readonly: bool,
    /// Elements are stored in the other byte order (only a copy can serve them).
    pub swapped: bool,
    /// A buffer with suboffsets: rows are reached through pointers (only a copy can serve it).
    pub indirect: bool,
    /// The CUDA stream a `__cuda_array_interface__` producer said its data is ready on.
    pub stream: Option<isize>,
}

impl Storage {
    /// Writable, native-order memory reached directly, ready on no particular stream: memory we
    /// own (a copy or an allocation).
    pub fn owned(data: *mut c_void, device: Device, dtype: DType) -> Storage {
        Storage {
            data,
            device,
            dtype,
            readonly: false,
            swapped: false,
            indirect: false,
            stream: None,
        }
    }
}

// SAFETY: `data` is only an address that is never dereferenced without the owner alive; the
// owner's Python handles are only released while attached to the interpreter (see `Owner::drop`),
// and producers' deleters may be called from any thread per the DLPack contract.
unsafe impl Send for Tensor {}
// SAFETY: nothing in a `Tensor` is mutated after construction except through `&mut`.
unsafe impl Sync for Tensor {}

impl Tensor {
    /// A tensor of `storage` laid out as `layout`, kept alive by `owner`.
    ///
    /// # Safety
    /// The memory invariant holds: while `owner` lives, the bytes `storage.data` and `layout`
    /// address (items of `storage.dtype`, reached through the buffer view when
    /// `storage.indirect`) are memory of `storage.device`, readable, and writable unless
    /// `storage.readonly`; `storage.stream`, if any, is a stream of that device.
    #[inline(always)]
    pub unsafe fn new(storage: Storage, layout: Layout, owner: Owner) -> Tensor {
        Tensor {
            storage,
            layout,
            owner,
        }
    }

    /// Where the layout of the tensor at `dst` goes, for building it in place (see
    /// `Layout::build_into`) before `complete_in_place` writes the other parts.
    ///
    /// # Safety
    /// `dst` is valid for writes of a `Tensor`.
    #[inline(always)]
    pub unsafe fn layout_place(dst: *mut Tensor) -> *mut Layout {
        // SAFETY: `dst` addresses a `Tensor`'s worth of memory we may write (this function's
        // contract), so its field's address lies inside it.
        unsafe { &raw mut (*dst).layout }
    }

    /// Complete the tensor at `dst`, whose layout is written (see `layout_place`): its storage
    /// and owner written in place (built on the stack and moved, a tensor cost more in copying
    /// than in reading).
    ///
    /// # Safety
    /// `dst` is valid for writes of a `Tensor`, and holds a layout and no other part; the
    /// memory invariant (see `Tensor::new`) holds of `storage` and `owner` with that layout.
    #[inline(always)]
    pub unsafe fn complete_in_place(dst: *mut Tensor, storage: Storage, owner: Owner) {
        // SAFETY: `dst` addresses a `Tensor`'s worth of memory we may write (the contract), so
        // its fields' addresses lie inside it.
        let storage_place = unsafe { &raw mut (*dst).storage };
        // SAFETY: the field is memory of `dst` we may write, holding nothing yet (the contract:
        // only the layout is written), so `write` drops nothing.
        unsafe { storage_place.write(storage) };
        // SAFETY: `dst` addresses a `Tensor`'s worth of memory we may write (the contract).
        let owner_place = unsafe { &raw mut (*dst).owner };
        // SAFETY: the field is memory of `dst` we may write, holding nothing yet (the contract).
        unsafe { owner_place.write(owner) };
    }

    /// Release a tensor in place, on a thread known to hold the GIL (a deallocator CPython
    /// calls): its owner as `Owner::release_attached_in_place` does, its other parts dropped.
    /// Nothing is moved: copying the owner out cost a store-forwarding stall per object.
    ///
    /// # Safety
    /// `tensor` is a live tensor, not used again; the calling thread holds the GIL.
    pub unsafe fn release_attached_in_place(tensor: *mut Tensor) {
        // SAFETY: `tensor` is live and ours alone from here on (this function's contract).
        let Tensor {
            storage,
            layout,
            owner,
        } = unsafe { &mut *tensor };
        // SAFETY: a live part of the tensor, dropped once, here: it is never used again.
        unsafe { std::ptr::drop_in_place(storage) };
        // SAFETY: a live part of the tensor, dropped once, here: it is never used again.
        unsafe { std::ptr::drop_in_place(layout) };
        // SAFETY: the owner is live and released once, here; the calling thread holds the GIL
        // (this function's contract).
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
        // SAFETY: `layout` addresses only bytes of the buffer (checked just above), host memory
        // we allocated, readable and writable, that the owner frees when it goes.
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
            storage: Storage::owned(data, device, dtype),
            layout,
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
        self.storage.readonly = true;
    }

    /// Say whether the elements are stored in the other byte order (which byte order the bytes
    /// are read in; which bytes may be read or written is unchanged).
    #[inline]
    pub fn set_swapped(&mut self, swapped: bool) {
        self.storage.swapped = swapped;
    }

    /// Address of the first element (any `byte_offset` already applied).
    #[inline]
    pub fn data(&self) -> *mut c_void {
        self.storage.data
    }

    #[inline]
    pub fn device(&self) -> &Device {
        &self.storage.device
    }

    #[inline]
    pub fn dtype(&self) -> DType {
        self.storage.dtype
    }

    #[inline]
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    #[inline]
    pub fn readonly(&self) -> bool {
        self.storage.readonly
    }

    /// Elements are stored in the other byte order (only a copy can serve them).
    #[inline]
    pub fn swapped(&self) -> bool {
        self.storage.swapped
    }

    /// A buffer with suboffsets: rows are reached through pointers (only a copy can serve it).
    #[inline]
    pub fn indirect(&self) -> bool {
        self.storage.indirect
    }

    /// The CUDA stream a `__cuda_array_interface__` producer said its data is ready on.
    #[inline]
    pub fn stream(&self) -> Option<isize> {
        self.storage.stream
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
        self.numel()
            .saturating_mul(self.storage.dtype.itemsize() as i64)
    }

    /// The size in bytes of a dense copy of the elements: what every copy into fresh memory
    /// allocates (before asking for `c_order_layout`, so that a copy larger than memory is a
    /// `MemoryError`, whatever its layout would say).
    #[inline]
    pub fn dense_bytes(&self) -> Result<usize> {
        usize::try_from(self.nbytes()).map_err(|_| Error::value("tensor too large"))
    }

    /// The C-ordered layout of a dense copy of the elements.
    #[inline]
    pub fn c_order_layout(&self) -> Result<Layout> {
        Ok(Layout::c_order(
            self.layout.shape(),
            self.storage.dtype.itemsize(),
        )?)
    }

    /// The tensor as DLPack can describe it, or why it can't as it is (then only a copy can
    /// serve it).
    #[inline(always)]
    pub fn exportable(&self) -> std::result::Result<Exportable<'_>, &'static str> {
        if self.storage.indirect {
            return Err("buffers with suboffsets (indirect, PIL-style memory) can't be DLPack");
        }
        if self.storage.swapped {
            return Err(
                "non-native byte order can't be DLPack (DLPack data is in native byte order)",
            );
        }
        let Some(strides) = self.layout.strides() else {
            return Err("byte strides that are not a multiple of the item size can't be DLPack");
        };
        Ok(Exportable {
            data: self.storage.data,
            dtype: self.storage.dtype,
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
