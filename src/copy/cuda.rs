//! Copies that involve CUDA memory: device to host, host to device, device to device, and
//! `copyto` with a CUDA array on either side.
//!
//! The core's transfer planner (`dlpack_core::copy::device`) plans each copy as linear and
//! pitched (2-D/3-D) transfers, or stages it through the host when it would take many small
//! ones; its CUDA `Driver` carries them out on the consumer's stream. Here: the tensors' side
//! (where their memory is, their producers' streams) and running the transfers without the GIL.
//! Device buffers we allocate are freed by their owner, on whatever thread drops it.

use dlpack_core::copy::cpu::may_overlap;
use dlpack_core::copy::device::{self, Addr, Mover, Place, View};
use dlpack_core::copy::driver::Driver;
use dlpack_core::cuda;
use dlpack_core::layout::broadcast_strides;
use pyo3::prelude::*;

use super::host;
use crate::error::{Error, Result};
use crate::tensor::{Device, Owner, Tensor};
use dlpack_core::abi::DLDevice;
use dlpack_core::abi::device_type;
use dlpack_core::layout::Layout;
use dlpack_core::memory::AlignedBuffer;
use dlpack_core::memory::DeviceBuffer;

fn cuda_id(tensor: &Tensor) -> Result<i32> {
    match place(tensor)? {
        Place::Device(id) => Ok(id),
        Place::Host => Err(Error::buffer(
            "the tensor is in host memory, not CUDA memory",
        )),
    }
}

/// Where a tensor's memory lives, for the planner: host memory (pinned included) or a CUDA
/// device (managed memory is handled as its device's).
fn place(tensor: &Tensor) -> Result<Place> {
    let device = tensor.device().get()?;
    match device.device_type {
        _ if device.is_host() => Ok(Place::Host),
        device_type::CUDA | device_type::CUDA_MANAGED => Ok(Place::Device(device.device_id)),
        other => Err(Error::buffer(format!(
            "device type {other} is not CUDA memory; only CUDA devices can be copied to and from"
        ))),
    }
}

/// `tensor`'s elements viewed with `shape` and `byte_strides`.
fn view(tensor: &Tensor, shape: &[i64], byte_strides: &[i64]) -> Result<View> {
    Ok(View {
        base: Addr {
            at: tensor.data() as usize,
            place: place(tensor)?,
        },
        shape: shape.iter().map(|&n| n as usize).collect(),
        strides: byte_strides.iter().map(|&s| s as isize).collect(),
    })
}

/// Order the consumer's stream after a CUDA array interface producer's, if it named one (an
/// event, no host wait), unless the consumer said `stream=-1` (no synchronisation).
pub fn after_producer(tensor: &Tensor, device_id: i32, stream: Option<i64>) -> Result<()> {
    match tensor.stream() {
        Some(producer) if stream != Some(-1) => {
            // SAFETY: `producer` is the stream the CUDA array interface producer named, and
            // `stream` the consumer's: the protocols promise live streams of the device.
            unsafe { cuda::stream_wait(device_id, producer, stream) }.map_err(Error::runtime)
        }
        _ => Ok(()),
    }
}

/// Run `body`'s transfers without the GIL, on `stream` (the consumer's, on device `home`); wait
/// for them when `wait` (host memory or scratch takes part, or the caller wants the copy
/// complete on return).
fn drive(
    py: Python<'_>,
    home: Option<i32>,
    stream: Option<i64>,
    wait: bool,
    body: impl FnOnce(&mut Driver) -> dlpack_core::error::Result<()> + Send,
) -> Result<()> {
    let done = py.detach(|| {
        // SAFETY: `stream` is the consumer's, which the protocols (`__dlpack__`, `copyto`'s
        // stream) promise is a live stream of device `home`.
        let mut driver = unsafe { Driver::new(home, stream) };
        let done = body(&mut driver);
        // Even after an error, nothing may still be reading or writing memory we return.
        let synced = if wait || done.is_err() {
            driver.sync()
        } else {
            Ok(())
        };
        done.and(synced)
    });
    Ok(done?)
}

/// A C-ordered, native-order host copy of CUDA memory (the copy is complete on return).
pub fn to_host(py: Python<'_>, tensor: &Tensor, stream: Option<i64>) -> Result<Tensor> {
    let device_id = cuda_id(tensor)?;
    after_producer(tensor, device_id, stream)?;
    let bytes = tensor.dense_bytes()?;
    let buffer = AlignedBuffer::new(bytes)?;
    let layout = tensor.c_order_layout()?;
    let at = Addr {
        at: buffer.as_ptr() as usize,
        place: Place::Host,
    };
    // SAFETY: `at` is the buffer we just allocated, `bytes` long (the layout's), and kept past
    // the copy, which is complete on return.
    unsafe { copy_dense(py, tensor, at, &layout, device_id, stream)? };
    let copy = Tensor::host_allocation(buffer, tensor.dtype(), layout)?;
    if tensor.swapped() {
        // SAFETY: `copy` is ours alone, in host memory we allocated.
        unsafe { host::swap_in_place(py, &copy) };
    }
    Ok(copy)
}

/// Copy `source`'s elements into the memory at `at`, laid out as `layout` (C order), on
/// `device_id` and `stream`; complete on return.
///
/// # Safety
/// `at` is memory we allocated for `layout`'s dense elements, writable, that nothing else uses
/// and that outlives the call.
unsafe fn copy_dense(
    py: Python<'_>,
    source: &Tensor,
    at: Addr,
    layout: &Layout,
    device_id: i32,
    stream: Option<i64>,
) -> Result<()> {
    let itemsize = source.dtype().itemsize();
    let dst = view_at(at, layout);
    let src = view(
        source,
        source.layout().shape(),
        source.layout().byte_strides(),
    )?;
    drive(py, Some(device_id), stream, true, |driver| {
        // SAFETY: `dst` is memory allocated for the elements, ours and live past the sync
        // (this function's contract); `src` is the source's memory, live while its owner is.
        unsafe { device::copy_views(driver, &dst, &src, itemsize) }
    })?;
    Ok(())
}

/// A view of memory at `base` laid out as `layout`.
fn view_at(base: Addr, layout: &Layout) -> View {
    View {
        base,
        shape: layout.shape().iter().map(|&n| n as usize).collect(),
        strides: layout.byte_strides().iter().map(|&s| s as isize).collect(),
    }
}

/// A C-ordered copy on CUDA device `device_id` of host or CUDA memory, made on `stream` (the
/// consumer's) and complete on return.
pub fn to_device(
    py: Python<'_>,
    tensor: &Tensor,
    device_id: i32,
    stream: Option<i64>,
) -> Result<Tensor> {
    let bytes = tensor.dense_bytes()?;
    // The consumer's stream is on `device_id`; a source on another device is read on that
    // device's legacy default stream (see `Driver`), which is what must wait for its producer.
    let source_stream = match place(tensor)? {
        Place::Device(id) => {
            let on = if id == device_id { stream } else { None };
            after_producer(tensor, id, on)?;
            Some(on)
        }
        Place::Host => None,
    };
    // Swapped bytes and suboffsets need the CPU: such sources go over as native host copies.
    let staged;
    let source = if tensor.swapped() || tensor.indirect() {
        staged = match source_stream {
            Some(on) => to_host(py, tensor, on)?,
            None => host::to_c_order(py, tensor)?,
        };
        &staged
    } else {
        tensor
    };
    let buffer = DeviceBuffer::new(device_id, bytes)?;
    let layout = tensor.c_order_layout()?;
    let at = Addr {
        at: buffer.as_ptr() as usize,
        place: Place::Device(device_id),
    };
    // The source must have been read before we return: the caller may free it then, and a
    // device source's memory may be reused at once on a stream ours is not ordered with (torch's
    // caching allocator reuses blocks on the stream that allocated them); `copy_dense` is
    // complete on return.
    // SAFETY: `at` is the device buffer we just allocated, `bytes` long (the layout's), kept
    // past the copy.
    unsafe { copy_dense(py, source, at, &layout, device_id, stream)? };
    let device = Device::Known(DLDevice {
        device_type: device_type::CUDA,
        device_id,
    });
    let data = buffer.as_ptr();
    // SAFETY: `data` is the device buffer we just allocated on `device`, `bytes` long, which
    // is what the C-ordered `layout` of the tensor's shape addresses (its elements times their
    // size); ours to read and write, freed when the owner goes.
    Ok(unsafe {
        Tensor::owned(
            data,
            device,
            tensor.dtype(),
            layout,
            Owner::DeviceAllocation(buffer),
        )
    })
}

/// `copyto` with CUDA memory on either side (checks of dtypes, shapes and writability done;
/// `src` broadcasts to `dst`'s shape). With `stream` (a stream of the destination's device, or
/// of the source's when the destination is host memory), the copy is enqueued on it and
/// complete when it is, unless host memory takes part; without, it is complete on return.
pub fn copy_into(py: Python<'_>, dst: &Tensor, src: &Tensor, stream: Option<i64>) -> Result<()> {
    let (dst_place, src_place) = (place(dst)?, place(src)?);
    let home = match (dst_place, src_place) {
        (Place::Device(d), _) | (Place::Host, Place::Device(d)) => d,
        (Place::Host, Place::Host) => {
            return Err(Error::runtime(
                "internal error: a host-to-host copy was sent to the CUDA engine",
            ));
        }
    };
    // Work on `home` runs on `stream`; on another device, on its legacy default stream (see
    // `Driver`). Those streams must wait for the arrays' producers.
    let stream_on = |id: i32| if id == home { stream } else { None };
    for (tensor, place) in [(src, src_place), (dst, dst_place)] {
        if let Place::Device(id) = place {
            after_producer(tensor, id, stream_on(id))?;
        }
    }
    // Byte order and suboffsets need the CPU: such sources become host copies in the
    // destination's byte order.
    let staged;
    let source = if src.indirect() || src.swapped() != dst.swapped() {
        let mut copy = match src_place {
            Place::Host => host::to_c_order(py, src)?,
            Place::Device(id) => to_host(py, src, stream_on(id))?,
        };
        if dst.swapped() {
            // SAFETY: `copy` is ours alone, in host memory we allocated.
            unsafe { host::swap_in_place(py, &copy) };
            copy.set_swapped(true);
        }
        staged = copy;
        &staged
    } else {
        src
    };
    let shape = dst.layout().shape();
    let itemsize = dst.dtype().itemsize();
    let to = view(dst, shape, dst.layout().byte_strides())?;
    let from = view(source, shape, &broadcast_strides(source.layout(), shape)?)?;
    let overlap = to.base.place == from.base.place
        && may_overlap(&to.as_strided(), &from.as_strided(), itemsize);
    let wait = stream.is_none() || to.base.place == Place::Host || from.base.place == Place::Host;
    // `to` is the destination's memory and `from` the source's (or our copy of it), each live
    // while its owner is.
    drive(py, Some(home), stream, wait, |driver| {
        if !overlap {
            // SAFETY: `to` is writable (`super::copyto` checked), `to` and `from` live past the
            // transfers (`drive` syncs or the consumer's stream orders them); no shared bytes.
            return unsafe { device::copy_views(driver, &to, &from, itemsize) };
        }
        // Shared bytes: the source goes whole into a buffer of its own first.
        let bytes = to.shape.iter().product::<usize>() * itemsize;
        let (at, _scratch) = driver.scratch(from.base.place, bytes)?;
        let dense = View::c_order(at, &to.shape, itemsize);
        // SAFETY: `dense` is our fresh scratch, kept past the sync below; `from` lives past the
        // transfers (`drive` syncs or the consumer's stream orders them); no shared bytes.
        unsafe { device::copy_views(driver, &dense, &from, itemsize)? };
        // SAFETY: `to` is writable (`super::copyto` checked) and live past the transfers;
        // `dense` is our fresh scratch, kept past the sync below; no shared bytes.
        unsafe { device::copy_views(driver, &to, &dense, itemsize)? };
        driver.sync()
    })
}
