//! Importer for the CUDA array interface (`__cuda_array_interface__`, versions 2 and 3).
//!
//! The device and memory kind come from the CUDA driver's pointer attributes. Without a driver
//! the metadata is still read, and the device is left unresolved with the reason, so exporting
//! fails with a clear error instead of guessing device 0.

use pyo3::prelude::*;

use super::array_interface::{InterfaceDict, resolve_dtype};
use crate::error::{Error, Result};
use crate::tensor::{Device, Owner, Storage, Tensor};
use dlpack_core::cuda;
use dlpack_core::layout::Layout;

pub fn import(source: &Bound<'_, PyAny>, interface: Bound<'_, PyAny>) -> Result<Tensor> {
    let fields = InterfaceDict::new(interface, "__cuda_array_interface__")?;
    let version = fields.version(2..=i64::MAX)?;
    fields.reject_mask()?;
    let shape = fields.shape()?;
    let strides = fields.strides()?;
    let element = resolve_dtype(source, &fields.typestr()?)?;
    let dtype = element.dtype;
    let layout = Layout::from_byte_strides(&shape, strides.as_deref(), dtype.itemsize())?;
    let (data, readonly) = fields.pointer_pair(&fields.require("data")?)?;
    Tensor::check_data(data, &layout)?;
    let stream = match fields.get("stream")? {
        Some(stream) if version >= 3 => {
            let stream = fields.int("stream", &stream)?;
            if stream == 0 {
                return Err(Error::value(
                    "__cuda_array_interface__ stream 0 is ambiguous and not allowed; use 1 for \
                     the legacy default stream or 2 for the per-thread default stream",
                ));
            }
            Some(stream as isize)
        }
        _ => None,
    };
    let device = if data.is_null() {
        cuda::current_device()
    } else {
        cuda::pointer_device(data)
    };
    let device = match device {
        Ok(device) => Device::Known(device),
        Err(reason) => Device::Unresolved { reason },
    };
    let owner = Owner::object(source.clone().unbind());
    let storage = Storage {
        data,
        device,
        dtype,
        readonly,
        swapped: element.swapped,
        indirect: false,
        stream,
    };
    // SAFETY: the producer's word, which nothing can check: per the CUDA array interface, the
    // data pointer, shape and strides address the elements in CUDA memory (of the device the
    // driver reports for the pointer, when it can) while the object, the owner, lives, ready on
    // `stream`; writable unless the interface says read-only.
    Ok(unsafe { Tensor::new(storage, layout, owner) })
}
