//! Copies that involve CUDA memory: device to host, host to device, device to device.
//!
//! Contiguous data moves with the driver's async memcpy on the consumer's stream. Layouts a
//! plain memcpy can't serve (strided, odd byte strides, swapped bytes) are staged through the
//! host: the bytes the source spans come over whole, and the CPU engine gathers them. Device
//! buffers we allocate come from `cuMemAlloc` (256-byte aligned) and are freed by their owner,
//! on whatever thread drops it.

use std::ffi::c_void;

use cudarc::driver::sys;
use pyo3::prelude::*;

use super::cpu::AlignedBuffer;
use super::host;
use crate::cuda::{self, Context, check, stream_handle, with_context};
use crate::error::{Error, Result};
use crate::ffi::{DLDevice, device_type};
use crate::tensor::{Device, Layout, Owner, Tensor};

/// Device memory we allocated; freed (in its device's context) on drop.
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    ctx: Context,
}

impl DeviceBuffer {
    fn new(device_id: i32, bytes: usize) -> Result<Self> {
        let ctx = cuda::primary_context(device_id).map_err(Error::Runtime)?;
        let mut ptr: sys::CUdeviceptr = 0;
        if bytes > 0 {
            // SAFETY: the device's context is current; `ptr` is a live out-parameter.
            with_context(ctx, || {
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
            // SAFETY: allocated by cuMemAlloc in this context and freed once, here.
            let _ = with_context(self.ctx, || {
                check(unsafe { sys::cuMemFree_v2(self.ptr) }, "cuMemFree")
            });
        }
    }
}

fn runtime(err: String) -> Error {
    Error::Runtime(err)
}

fn cuda_id(tensor: &Tensor) -> Result<i32> {
    let device = tensor.device.get()?;
    match device.device_type {
        device_type::CUDA | device_type::CUDA_MANAGED => Ok(device.device_id),
        other => Err(Error::buffer(format!(
            "device type {other} is not CUDA memory"
        ))),
    }
}

/// Whether a plain memcpy of `numel * itemsize` bytes from `data` reproduces the tensor.
fn dense(tensor: &Tensor) -> bool {
    !tensor.swapped && !tensor.indirect && tensor.layout.is_c_contiguous()
}

/// Order the consumer's stream after a CUDA array interface producer's, if it named one (an
/// event, no host wait), unless the consumer said `stream=-1` (no synchronisation).
pub fn after_producer(tensor: &Tensor, device_id: i32, stream: Option<i64>) -> Result<()> {
    match tensor.stream {
        Some(producer) if stream != Some(-1) => {
            cuda::stream_wait(device_id, producer, stream).map_err(runtime)
        }
        _ => Ok(()),
    }
}

/// A C-ordered, native-order host copy of CUDA memory (the copy is complete on return).
pub fn to_host(py: Python<'_>, tensor: &Tensor, stream: Option<i64>) -> Result<Tensor> {
    let device_id = cuda_id(tensor)?;
    after_producer(tensor, device_id, stream)?;
    let itemsize = tensor.dtype.itemsize();
    let (low, high) = tensor.layout.byte_extent(itemsize)?;
    let span = (high - low) as usize;
    let staging = AlignedBuffer::new(span)?;
    let ctx = cuda::primary_context(device_id).map_err(runtime)?;
    let source = (tensor.data as i64 + low) as u64;
    py.detach(|| {
        with_context(ctx, || {
            let handle = stream_handle(stream.filter(|&s| s != -1));
            // SAFETY: the staging buffer holds `span` bytes; the source range is the bytes the
            // tensor addresses, alive while we borrow the tensor; we wait for the copy below.
            unsafe {
                if span > 0 {
                    check(
                        sys::cuMemcpyDtoHAsync_v2(staging.as_ptr().cast(), source, span, handle),
                        "cuMemcpyDtoHAsync",
                    )?;
                }
                check(sys::cuStreamSynchronize(handle), "cuStreamSynchronize")
            }
        })
    })
    .map_err(runtime)?;
    let staged = Tensor {
        // SAFETY: `-low` is the first element's offset inside the staged span.
        data: unsafe { staging.as_ptr().offset(-low as isize) }.cast(),
        device: Device::CPU,
        dtype: tensor.dtype,
        layout: tensor.layout.clone(),
        readonly: false,
        swapped: tensor.swapped,
        indirect: false,
        stream: None,
        owner: Owner::Allocation(staging),
    };
    if dense(&staged) && low == 0 {
        Ok(staged)
    } else {
        host::to_c_order(py, &staged)
    }
}

/// A C-ordered copy on CUDA device `device_id` of host or CUDA memory, enqueued on `stream`
/// (the consumer's) and complete with respect to it.
pub fn to_device(
    py: Python<'_>,
    tensor: &Tensor,
    device_id: i32,
    stream: Option<i64>,
) -> Result<Tensor> {
    let itemsize = tensor.dtype.itemsize();
    let bytes = usize::try_from(tensor.nbytes()).map_err(|_| Error::value("tensor too large"))?;
    let source_on_device = !crate::import::is_host(tensor.device.get()?.device_type);
    if source_on_device {
        after_producer(tensor, cuda_id(tensor)?, stream)?;
    }
    // What to upload: the tensor itself when dense, else a dense host copy of it.
    let staged;
    let (source, from_device) = if dense(tensor) {
        (tensor, source_on_device)
    } else {
        staged = if source_on_device {
            to_host(py, tensor, stream)?
        } else {
            host::to_c_order(py, tensor)?
        };
        (&staged, false)
    };
    let buffer = DeviceBuffer::new(device_id, bytes)?;
    let (dst, src) = (buffer.ptr, source.data as usize);
    py.detach(|| {
        with_context(buffer.ctx, || {
            let handle = stream_handle(stream.filter(|&s| s != -1));
            // SAFETY: both ranges hold `bytes` bytes (dense layouts of the same shape); with
            // unified addressing cuMemcpyAsync also copies between devices. The host source
            // must outlive the copy, so we wait for the stream before returning.
            unsafe {
                if bytes > 0 {
                    if from_device {
                        check(
                            sys::cuMemcpyAsync(dst, src as u64, bytes, handle),
                            "cuMemcpyAsync",
                        )?;
                    } else {
                        check(
                            sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, bytes, handle),
                            "cuMemcpyHtoDAsync",
                        )?;
                    }
                }
                if from_device {
                    Ok(())
                } else {
                    check(sys::cuStreamSynchronize(handle), "cuStreamSynchronize")
                }
            }
        })
    })
    .map_err(runtime)?;
    let device = Device::Known(DLDevice {
        device_type: device_type::CUDA,
        device_id,
    });
    let layout = Layout::c_order(tensor.layout.shape(), itemsize)?;
    Ok(Tensor::owned(
        buffer.as_ptr(),
        device,
        tensor.dtype,
        layout,
        Owner::DeviceAllocation(buffer),
    ))
}
