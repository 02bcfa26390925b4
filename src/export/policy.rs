//! What an export hands out for a consumer's request (`__dlpack__`'s arguments, or the C
//! exchange API's fixed request): the tensor in place, a fresh export from its DLPack producer,
//! a copy (memory DLPack can't express, read-only memory for a consumer that would ignore the
//! flag, `copy=True`), a move to another device, or a refusal saying why.

use std::sync::Arc;

use pyo3::prelude::*;

use crate::copy;
use crate::error::{Error, Result};
use crate::import;
use crate::tensor::{Device, Tensor};
use dlpack_core::abi::DLDevice;
use dlpack_core::abi::DLPACK_MINOR_VERSION;
use dlpack_core::abi::FLAG_IS_COPIED;
use dlpack_core::abi::FLAG_READ_ONLY;
use dlpack_core::abi::device_type;

use super::capsule::Kind;

/// A consumer's request, as `__dlpack__`'s keyword arguments give it.
pub struct Request {
    pub stream: Option<i64>,
    /// `None`: legacy capsule; otherwise the minor version to report.
    pub versioned_minor: Option<u32>,
    pub dl_device: Option<DLDevice>,
    pub copy: Option<bool>,
    /// Whether the consumer honours the READ_ONLY flag; if not, read-only memory is copied.
    /// Legacy capsules can't carry the flag, and C exchange API consumers (tvm-ffi) ignore it.
    pub honours_read_only: bool,
}

impl Request {
    /// A `__dlpack__` consumer's request; it honours the READ_ONLY flag exactly when it takes
    /// a versioned capsule (a legacy one can't carry the flag).
    pub fn new(
        stream: Option<i64>,
        versioned_minor: Option<u32>,
        dl_device: Option<DLDevice>,
        copy: Option<bool>,
    ) -> Request {
        Request {
            stream,
            versioned_minor,
            dl_device,
            copy,
            honours_read_only: versioned_minor.is_some(),
        }
    }
}

/// What the C exchange API's consumers get: `__dlpack__(max_version=(1, 3))`, except that
/// read-only memory is copied (its consumers, tvm-ffi among them, write through tensors
/// regardless of the READ_ONLY flag).
pub const MANAGED_REQUEST: Request = Request {
    stream: None,
    versioned_minor: Some(DLPACK_MINOR_VERSION),
    dl_device: None,
    copy: None,
    honours_read_only: false,
};

/// The minor version to report for a consumer's `max_version` of `(major, minor)`: `None` inside
/// for a legacy capsule (major 0), our own minor at most; `None` for a negative version.
pub fn reported_minor(major: i64, minor: i64) -> Option<Option<u32>> {
    if major < 0 || minor < 0 {
        return None;
    }
    Some(match major {
        0 => None,
        1 => Some((minor as u64).min(DLPACK_MINOR_VERSION as u64) as u32),
        _ => Some(DLPACK_MINOR_VERSION),
    })
}

/// The capsule kind a request asks for, with the flags `tensor` carries.
#[inline(always)]
pub fn kind(request: &Request, tensor: &Tensor, copied: bool) -> Kind {
    match request.versioned_minor {
        None => Kind::Legacy,
        Some(minor) => {
            let mut flags = 0;
            if tensor.readonly() {
                flags |= FLAG_READ_ONLY;
            }
            if copied {
                flags |= FLAG_IS_COPIED;
            }
            Kind::Versioned { minor, flags }
        }
    }
}

/// The common request, answered without the general checks of `prepare` (it concludes the
/// same): host memory DLPack can express as it is, exported in place. `None` for anything else.
// Inlined: returned through memory, its answer cost a store-forwarding stall a call.
#[inline(always)]
pub fn in_place(tensor: &Tensor, request: &Request) -> Option<(DLDevice, Kind)> {
    match *tensor.device() {
        Device::Known(own)
            if own.is_host()
                && request.dl_device.is_none()
                && request.stream.is_none()
                && request.copy != Some(true)
                && (request.honours_read_only || !tensor.readonly())
                && tensor.exportable().is_ok() =>
        {
            Some((own, kind(request, tensor, false)))
        }
        _ => None,
    }
}

/// What to export for `request`, on which device, in which capsule kind: `tensor` itself
/// (`None`), or a tensor of the export's own: a fresh one from `producer` (the DLPack producer
/// of device data, asked again when the consumer names a stream), or a copy.
pub fn prepare(
    py: Python<'_>,
    tensor: &Tensor,
    producer: Option<&Py<PyAny>>,
    request: &Request,
) -> Result<(Option<Arc<Tensor>>, DLDevice, Kind)> {
    if let Some((device, kind)) = in_place(tensor, request) {
        return Ok((None, device, kind));
    }
    let own = tensor.device().get()?;
    let cpu = DLDevice::CPU;
    // Where the consumer wants the data: our own device, or the CPU for host-addressable
    // memory (both without a copy); CUDA <-> CPU and CUDA <-> CUDA moves copy.
    let target = request.dl_device.unwrap_or(own);
    let in_place = target == own || (own.is_host() && target == cpu);
    let movable = |d: DLDevice| d == cpu || d.device_type == device_type::CUDA;
    let from_movable = own.is_host()
        || matches!(
            own.device_type,
            device_type::CUDA | device_type::CUDA_MANAGED
        );
    if !(in_place || movable(target) && from_movable) {
        return Err(Error::buffer(format!(
            "can't provide {} data on {}: only moves between the CPU and CUDA devices are \
             supported",
            own.name(),
            target.name()
        )));
    }
    let target_on_host = target.is_host();
    if let Some(stream) = request.stream {
        let valid = if target_on_host {
            stream == -1
        } else {
            stream == -1 || stream >= 1
        };
        if !valid {
            return Err(Error::value(if target_on_host {
                format!(
                    "stream must be None (or -1) for {} data, not {stream}",
                    target.name()
                )
            } else {
                format!("stream {stream} is not a valid CUDA/ROCm stream (0 is not allowed)")
            }));
        }
    }
    // A copy is needed to move, for memory DLPack can't express, and for read-only memory
    // asked for by a consumer that can't be told it is read-only.
    let needs_copy = if in_place {
        tensor.exportable().err()
    } else {
        Some("moving to another device")
    }
    .or_else(|| {
        (!request.honours_read_only && tensor.readonly()).then_some(
            "read-only memory can't be handed to a consumer that ignores the read-only flag \
             (a legacy capsule has none)",
        )
    });
    let copy = match (request.copy, needs_copy) {
        (Some(false), Some(reason)) => {
            return Err(Error::buffer(format!(
                "{reason}, and copy=False forbids a copy"
            )));
        }
        (Some(true), _) | (None, Some(_)) => true,
        _ => false,
    };
    if !copy {
        let fresh = fresh_from_producer(py, producer, request)?;
        if !own.is_host() {
            copy::cuda::after_producer(tensor, own.device_id, request.stream)
                .map_err(as_buffer_error)?;
        }
        let kind = kind(request, fresh.as_deref().unwrap_or(tensor), false);
        return Ok((fresh, target, kind));
    }
    let unavailable = |err: Error| match as_buffer_error(err) {
        Error::Core(dlpack_core::error::Error::Buffer(msg)) => {
            Error::buffer(format!("can't copy to {}: {msg}", target.name()))
        }
        other => other,
    };
    let (copied, device) = if target_on_host {
        let copied = if own.is_host() {
            copy::to_c_order(py, tensor)?
        } else {
            copy::cuda::to_host(py, tensor, request.stream).map_err(unavailable)?
        };
        (copied, cpu)
    } else {
        let id = target.device_id;
        let copied = copy::cuda::to_device(py, tensor, id, request.stream).map_err(unavailable)?;
        (copied, target) // a CUDA device: `movable` admits no other non-host target
    };
    let kind = kind(request, &copied, true);
    Ok((Some(Arc::new(copied)), device, kind))
}

/// Device data from a DLPack producer, when the consumer named a stream: ask the producer
/// again with that stream, so it orders its pending work before the consumer's.
fn fresh_from_producer(
    py: Python<'_>,
    producer: Option<&Py<PyAny>>,
    request: &Request,
) -> Result<Option<Arc<Tensor>>> {
    let (Some(producer), Some(stream)) = (producer, request.stream) else {
        return Ok(None);
    };
    let stream = pyo3::types::PyInt::new(py, stream).into_any();
    let method = producer.bind(py).getattr(pyo3::intern!(py, "__dlpack__"))?;
    let tensor = import::dlpack::import_producer(&method, Some(&stream))?;
    Ok(Some(Arc::new(tensor)))
}

/// "CUDA can't do this here" is a BufferError for an export, like any other memory the producer
/// can't serve, so consumers may fall back.
fn as_buffer_error(err: Error) -> Error {
    match err {
        Error::Core(dlpack_core::error::Error::Runtime(msg)) => Error::buffer(msg),
        other => other,
    }
}
