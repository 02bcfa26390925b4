//! The CUDA driver as the transfer planner's [`Mover`]: linear and pitched (2-D/3-D) async
//! memcpys on the consumer's stream, scratch memory from `cuMemAlloc` (256-byte aligned) or
//! our host allocator, freed on whatever thread drops it.

use std::ffi::c_void;
use std::ptr;

use cudarc::driver::sys;

use super::device::{Addr, Mover, Pitched, Place};
use crate::cuda::{self, Context, check, stream_handle, with_context};
use crate::error::{Error, Result};
use crate::memory::{AlignedBuffer, DeviceBuffer};

fn runtime(err: String) -> Error {
    Error::Runtime(err)
}

/// Memory the planner asked for, held only to be freed when dropped.
pub struct Scratch {
    _host: Option<AlignedBuffer>,
    _device: Option<DeviceBuffer>,
}

/// The planner's transfers, run by the CUDA driver: on the consumer's stream on its device
/// (`home`), on the legacy default stream on any other.
pub struct Driver {
    home: Option<i32>,
    stream: Option<i64>,
    /// The streams used so far, for `sync`.
    used: Vec<(i32, sys::CUstream)>,
}

// SAFETY: stream handles may be used from any thread; the driver is only used by the thread
// that runs the copy.
unsafe impl Send for Driver {}

impl Driver {
    /// Transfers on device `home` go on `stream` (the consumer's; `None`: the legacy default
    /// stream, `-1`: none asked for, the same), on any other device on its legacy default one.
    ///
    /// # Safety
    /// `stream`, when given (and not -1), is a handle of a live CUDA stream of device `home`
    /// (or 1 or 2, the default streams), which stays live until the driver is dropped.
    pub unsafe fn new(home: Option<i32>, stream: Option<i64>) -> Self {
        Driver {
            home,
            stream: stream.filter(|&s| s != -1),
            used: Vec::new(),
        }
    }

    /// The context and stream that run a transfer on `device`.
    fn queue(&mut self, device: i32) -> Result<(Context, sys::CUstream)> {
        let ctx = cuda::primary_context(device).map_err(runtime)?;
        let handle = stream_handle(if self.home == Some(device) {
            self.stream
        } else {
            None
        });
        if !self.used.contains(&(device, handle)) {
            self.used.push((device, handle));
        }
        Ok((ctx, handle))
    }
}

/// The device whose stream runs a transfer: the destination's, else the source's.
fn runs_on(dst: Addr, src: Addr) -> Result<i32> {
    match (dst.place, src.place) {
        (Place::Device(d), _) | (Place::Host, Place::Device(d)) => Ok(d),
        (Place::Host, Place::Host) => Err(Error::Runtime(
            "internal error: a host-to-host transfer was sent to the CUDA driver".into(),
        )),
    }
}

/// How the driver's 2-D and 3-D copies name one side.
fn side(addr: Addr) -> (sys::CUmemorytype, usize, sys::CUdeviceptr) {
    match addr.place {
        Place::Host => (sys::CUmemorytype::CU_MEMORYTYPE_HOST, addr.at, 0),
        Place::Device(_) => (sys::CUmemorytype::CU_MEMORYTYPE_DEVICE, 0, addr.at as u64),
    }
}

/// The 2-D copy of a one-slice block: no arrays, no offsets.
fn memcpy_2d(b: &Pitched) -> sys::CUDA_MEMCPY2D {
    let (src_type, src_host, src_device) = side(b.src);
    let (dst_type, dst_host, dst_device) = side(b.dst);
    sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: src_type,
        srcHost: src_host as *const c_void,
        srcDevice: src_device,
        srcArray: ptr::null_mut(),
        srcPitch: b.src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: dst_type,
        dstHost: dst_host as *mut c_void,
        dstDevice: dst_device,
        dstArray: ptr::null_mut(),
        dstPitch: b.dst_pitch,
        WidthInBytes: b.width,
        Height: b.height,
    }
}

/// The 3-D copy of a block: no arrays, no offsets.
fn memcpy_3d(b: &Pitched) -> sys::CUDA_MEMCPY3D {
    let (src_type, src_host, src_device) = side(b.src);
    let (dst_type, dst_host, dst_device) = side(b.dst);
    sys::CUDA_MEMCPY3D {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: src_type,
        srcHost: src_host as *const c_void,
        srcDevice: src_device,
        srcArray: ptr::null_mut(),
        reserved0: ptr::null_mut(),
        srcPitch: b.src_pitch,
        srcHeight: b.src_rows,
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: dst_type,
        dstHost: dst_host as *mut c_void,
        dstDevice: dst_device,
        dstArray: ptr::null_mut(),
        reserved1: ptr::null_mut(),
        dstPitch: b.dst_pitch,
        dstHeight: b.dst_rows,
        WidthInBytes: b.width,
        Height: b.height,
        Depth: b.depth,
    }
}

impl Mover for Driver {
    type Scratch = Scratch;

    unsafe fn linear(&mut self, dst: Addr, src: Addr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let device = runs_on(dst, src)?;
        let (ctx, handle) = self.queue(device)?;
        let (d, s) = (dst.at, src.at);
        // Between two devices, `ctx` (the transfer runs on the destination's) is the
        // destination's context; the source's is needed too.
        let peer = match (dst.place, src.place) {
            (Place::Device(a), Place::Device(b)) if a != b => {
                Some((ctx, cuda::primary_context(b).map_err(runtime)?))
            }
            _ => None,
        };
        // `handle` is a stream of `ctx`, current in every arm: the consumer's (live per
        // `Driver::new`'s contract) or a default stream.
        with_context(ctx, || match (dst.place, src.place, peer) {
            (_, _, Some((dst_ctx, src_ctx))) => check(
                // SAFETY: `bytes` device bytes at `d` and `s`, live until the next sync (the
                // `linear` contract); both contexts are retained primary contexts, `handle` a
                // stream of `ctx`.
                unsafe {
                    sys::cuMemcpyPeerAsync(
                        d as u64,
                        dst_ctx.handle(),
                        s as u64,
                        src_ctx.handle(),
                        bytes,
                        handle,
                    )
                },
                "cuMemcpyPeerAsync",
            ),
            (Place::Device(_), Place::Device(_), None) => check(
                // SAFETY: `bytes` bytes of this device's memory at `d` and at `s`, live until
                // the next sync (the `linear` contract); `handle` is a stream of `ctx`.
                unsafe { sys::cuMemcpyDtoDAsync_v2(d as u64, s as u64, bytes, handle) },
                "cuMemcpyDtoDAsync",
            ),
            (Place::Device(_), Place::Host, _) => check(
                // SAFETY: `bytes` bytes of device memory at `d`, of host memory at `s`, live
                // until the next sync (the `linear` contract); `handle` is a stream of `ctx`.
                unsafe { sys::cuMemcpyHtoDAsync_v2(d as u64, s as *const c_void, bytes, handle) },
                "cuMemcpyHtoDAsync",
            ),
            (Place::Host, _, _) => check(
                // SAFETY: `bytes` bytes of host memory at `d`, of device memory at `s` (`runs_on`
                // refused host to host), live until the next sync (the `linear` contract);
                // `handle` is a stream of `ctx`.
                unsafe { sys::cuMemcpyDtoHAsync_v2(d as *mut c_void, s as u64, bytes, handle) },
                "cuMemcpyDtoHAsync",
            ),
        })
        .map_err(runtime)
    }

    unsafe fn pitched(&mut self, b: &Pitched) -> Result<bool> {
        let device = runs_on(b.dst, b.src)?;
        let (ctx, handle) = self.queue(device)?;
        let status = with_context(ctx, || {
            Ok(if b.depth == 1 {
                // SAFETY: the block's `height` rows of `width` bytes on each side are live until
                // the next sync (the `pitched` contract); `handle` is a stream of `ctx`, current.
                unsafe { sys::cuMemcpy2DAsync_v2(&memcpy_2d(b), handle) }
            } else {
                // SAFETY: the block's `depth` slices of `height` rows of `width` bytes on each
                // side are live until the next sync (the `pitched` contract); `handle` is `ctx`'s.
                unsafe { sys::cuMemcpy3DAsync_v2(&memcpy_3d(b), handle) }
            })
        })
        .map_err(runtime)?;
        use sys::cudaError_enum as E;
        match status {
            E::CUDA_SUCCESS => Ok(true),
            // Pitches the driver won't take (it may insist on its own between device buffers):
            // the planner sends the rows one by one.
            E::CUDA_ERROR_INVALID_VALUE | E::CUDA_ERROR_NOT_SUPPORTED => Ok(false),
            other => Err(runtime(format!("cuMemcpy2D/3DAsync failed ({other:?})"))),
        }
    }

    fn scratch(&mut self, place: Place, bytes: usize) -> Result<(Addr, Scratch)> {
        Ok(match place {
            Place::Host => {
                let buffer = AlignedBuffer::new(bytes)?;
                let at = buffer.as_ptr() as usize;
                (
                    Addr { at, place },
                    Scratch {
                        _host: Some(buffer),
                        _device: None,
                    },
                )
            }
            Place::Device(id) => {
                let buffer = DeviceBuffer::new(id, bytes)?;
                let at = buffer.as_ptr() as usize;
                (
                    Addr { at, place },
                    Scratch {
                        _host: None,
                        _device: Some(buffer),
                    },
                )
            }
        })
    }

    fn sync(&mut self) -> Result<()> {
        for (device, handle) in std::mem::take(&mut self.used) {
            let ctx = cuda::primary_context(device).map_err(runtime)?;
            with_context(ctx, || {
                check(
                    // SAFETY: `handle` is a stream of this context (the consumer's, live per
                    // `Driver::new`'s contract, or the legacy one), which is current.
                    unsafe { sys::cuStreamSynchronize(handle) },
                    "cuStreamSynchronize",
                )
            })
            .map_err(runtime)?;
        }
        Ok(())
    }
}
