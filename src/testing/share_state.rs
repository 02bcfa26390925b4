//! A handle's state as named fields and back, for tests that forge handles (a receiver must
//! refuse any state its producer did not write): `share_state_fields(state)` gives a dict,
//! `share_state_pack(fields)` the bytes of a dict of the same keys, whatever they say.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::error::{Error, Result};
use dlpack_core::abi::DLDataType;
use dlpack_core::share::FileId;
use dlpack_core::share::handle_state::{
    FORMAT, HandleState, Lent, Token, boot_id_bytes, boot_id_text,
};

/// The fields of a handle's state: ``format``, ``boot_id`` (its text), ``pid``, ``writable``,
/// ``segment`` (None for no elements, else a dict of ``lender``, ``board_fd``, ``token``,
/// ``file`` (device, inode), ``size``, ``generation``, ``fd``), ``offset``, ``dtype`` (DLPack
/// code, bits, lanes), ``swapped``, ``shape`` and ``strides`` (in bytes).
#[pyfunction]
pub fn share_state_fields<'py>(state: &Bound<'py, PyBytes>) -> Result<Bound<'py, PyDict>> {
    let py = state.py();
    let state = HandleState::decode(state.as_bytes())?;
    let fields = PyDict::new(py);
    fields.set_item("format", FORMAT)?;
    fields.set_item("boot_id", boot_id_text(&state.boot_id))?;
    fields.set_item("pid", state.pid)?;
    fields.set_item("writable", state.writable)?;
    match state.lent {
        None => fields.set_item("segment", py.None())?,
        Some(lent) => {
            let segment = PyDict::new(py);
            segment.set_item("lender", lent.lender)?;
            segment.set_item("board_fd", lent.board_fd)?;
            segment.set_item("token", PyBytes::new(py, &lent.token))?;
            segment.set_item("file", (lent.file.dev, lent.file.ino))?;
            segment.set_item("size", lent.size)?;
            segment.set_item("generation", lent.generation)?;
            segment.set_item("fd", lent.fd)?;
            fields.set_item("segment", segment)?;
        }
    }
    fields.set_item("offset", state.offset)?;
    let DLDataType { code, bits, lanes } = state.dtype;
    fields.set_item("dtype", (code, bits, lanes))?;
    fields.set_item("swapped", state.swapped)?;
    fields.set_item("shape", state.shape)?;
    fields.set_item("strides", state.strides)?;
    Ok(fields)
}

/// The state `fields` (as `_share_state_fields` gives them) spell, in their ``format``.
#[pyfunction]
pub fn share_state_pack<'py>(fields: &Bound<'py, PyDict>) -> Result<Bound<'py, PyBytes>> {
    fn get<'py, T: FromPyObjectOwned<'py>>(dict: &Bound<'py, PyDict>, key: &str) -> Result<T> {
        let value = dict
            .get_item(key)?
            .ok_or_else(|| Error::value(format!("no field {key:?}")))?;
        Ok(value.extract().map_err(Into::into)?)
    }
    let text: String = get(fields, "boot_id")?;
    let boot_id =
        boot_id_bytes(&text).ok_or_else(|| Error::value(format!("a boot id, not {text:?}")))?;
    let segment: Option<Bound<'py, PyDict>> = get(fields, "segment")?;
    let lent = match segment {
        None => None,
        Some(segment) => {
            let token: Vec<u8> = get(&segment, "token")?;
            let token = Token::try_from(token.as_slice())
                .map_err(|_| Error::value("a token is 16 bytes"))?;
            let (dev, ino) = get(&segment, "file")?;
            Some(Lent {
                lender: get(&segment, "lender")?,
                board_fd: get(&segment, "board_fd")?,
                token,
                file: FileId { dev, ino },
                size: get(&segment, "size")?,
                generation: get(&segment, "generation")?,
                fd: get(&segment, "fd")?,
            })
        }
    };
    let (code, bits, lanes) = get(fields, "dtype")?;
    let state = HandleState {
        boot_id,
        pid: get(fields, "pid")?,
        writable: get(fields, "writable")?,
        lent,
        offset: get(fields, "offset")?,
        dtype: DLDataType { code, bits, lanes },
        swapped: get(fields, "swapped")?,
        shape: get(fields, "shape")?,
        strides: get(fields, "strides")?,
    };
    let format: u8 = get(fields, "format")?;
    Ok(PyBytes::new(fields.py(), &state.encode_as(format)))
}
