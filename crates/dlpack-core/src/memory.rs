//! Memory we own: host buffers (64-byte aligned; huge-page backed when large) and CUDA device
//! buffers we allocated for copies. Each frees itself on drop, on any thread, without Python.

use std::alloc::{self, Layout as AllocLayout};
use std::ffi::c_void;
use std::ptr::NonNull;

use cudarc::driver::sys;

use crate::cuda::{self, Context, check, with_context};
use crate::error::{Error, Result};

/// Alignment of buffers we allocate: a cache line, and what SIMD loads like best.
pub const ALIGNMENT: usize = 64;

/// Buffers of at least this many bytes are aligned to huge pages and ask the kernel to back them
/// with transparent huge pages, as numpy does: a fresh copy otherwise spends most of its time in
/// page faults (64 MiB: 24 ms with 4 KiB pages, 13 ms with huge ones, on our test machine).
const HUGE_PAGE_THRESHOLD: usize = 4 << 20;
const HUGE_PAGE: usize = 2 << 20;

/// Ask for transparent huge pages behind `len` bytes at `ptr` (a hint: failure changes nothing).
///
/// # Safety
/// `ptr..ptr + len` is memory we allocated, whole huge pages.
unsafe fn advise_huge_pages(ptr: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        use rustix::mm::{Advice, madvise};
        // SAFETY: per the contract; the advice only changes how the kernel backs the memory.
        let _ = unsafe { madvise(ptr.cast(), len, Advice::LinuxHugepage) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, len);
}

/// Memory we allocated; freed on drop.
pub struct AlignedBuffer {
    ptr: NonNull<u8>,
    layout: AllocLayout,
}

// SAFETY: the buffer is plain bytes owned by this value alone.
unsafe impl Send for AlignedBuffer {}
// SAFETY: shared access only hands out the address.
unsafe impl Sync for AlignedBuffer {}

impl AlignedBuffer {
    /// `bytes` of host memory; a `MemoryError` before allocating when more than this process
    /// can have (see `available`).
    pub fn new(bytes: usize) -> Result<Self> {
        crate::available::check(bytes as u64, "memory")?;
        let huge = bytes >= HUGE_PAGE_THRESHOLD;
        // A huge-page buffer spans whole huge pages, so the advice covers only our memory.
        let (size, align) = match huge {
            true => (bytes.checked_next_multiple_of(HUGE_PAGE), HUGE_PAGE),
            false => (Some(bytes.max(1)), ALIGNMENT),
        };
        let layout = size
            .and_then(|size| AllocLayout::from_size_align(size, align).ok())
            .ok_or_else(|| Error::value(format!("can't allocate {bytes} bytes")))?;
        // SAFETY: the layout has non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc(layout) })
            .ok_or_else(|| Error::Memory(format!("out of memory allocating {bytes} bytes")))?;
        if huge {
            // SAFETY: just allocated, `layout.size()` bytes aligned to huge pages.
            unsafe { advise_huge_pages(ptr.as_ptr(), layout.size()) };
        }
        Ok(AlignedBuffer { ptr, layout })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes allocated from `as_ptr` (at least the bytes asked for).
    pub fn size(&self) -> usize {
        self.layout.size()
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Device memory we allocated; freed (in its device's context) on drop.
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    ctx: Context,
}

impl DeviceBuffer {
    pub fn new(device_id: i32, bytes: usize) -> Result<Self> {
        let ctx = cuda::primary_context(device_id).map_err(Error::Runtime)?;
        let mut ptr: sys::CUdeviceptr = 0;
        if bytes > 0 {
            with_context(ctx, || {
                // SAFETY: the device's context is current; `ptr` is a live out-parameter.
                check(unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) }, "cuMemAlloc")
            })
            .map_err(Error::Runtime)?;
        }
        Ok(DeviceBuffer { ptr, ctx })
    }

    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr as usize as *mut c_void
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 {
            let _ = with_context(self.ctx, || {
                // SAFETY: allocated by cuMemAlloc in this context and freed once, here.
                check(unsafe { sys::cuMemFree_v2(self.ptr) }, "cuMemFree")
            });
        }
    }
}
