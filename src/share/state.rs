//! A handle's pickled state, written by `SharedHandle.__reduce__` (`write`) and read where it
//! arrives (`open`, which checks every field, then opens the segment it names):
//!
//! ```text
//! (FORMAT, boot id, producer pid, lender address, token, writable, layout, memory)
//! layout: (offset, shape, byte strides, typestr, element type name)
//! memory: ("host", (device, inode), file size, generation, descriptor lent), or
//!         ("host", None, 0) for no elements (then no lender address and no token)
//! ```

use std::fmt::Display;

use dlpack_core::dtype::Element;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyInt, PyString, PyTuple};

use super::lender::{self, TOKEN_BYTES};
use super::mapped::Mapped;
use super::open::{Named, open_lent, open_mapped};
use super::segment::TRAILER;
use super::views::{Parts, segment_view};
use crate::error::{Error, Result};
use crate::object::{empty_view, spelled, tensor_of};
use crate::tensor::{DType, Layout, Owner};
use dlpack_core::share::{FileId, system};

/// The layout of a handle's state (and the protocol its segment's locks follow); a handle of
/// another is refused, not misread.
pub const FORMAT: i64 = 2;

fn malformed(why: impl Display) -> Error {
    Error::value(format!("not a dlpack shared-memory handle ({why})"))
}

/// The state pickling the handle of `view` (writable or not, with its `layout` tuple) carries:
/// its segment, if it has one, is pinned in this process's lender for the receiver.
pub fn write<'py>(
    view: &Bound<'py, PyAny>,
    writable: bool,
    layout: &Bound<'py, PyTuple>,
) -> Result<Bound<'py, PyTuple>> {
    let py = view.py();
    let tensor =
        tensor_of(view).ok_or_else(|| Error::type_("a handle's view is a DLPackObject"))?;
    let mapped = match &tensor.owner {
        Owner::Held(value) => value.downcast_ref::<Mapped>(),
        _ => None,
    };
    let (address, token, memory) = match mapped {
        Some(mapped) => {
            let segment = mapped.segment();
            let (lender, token, fd) = lender::lend(segment.clone(), writable)?;
            let id = segment.id();
            let memory = (
                "host",
                (id.dev, id.ino),
                segment.size(),
                segment.generation(),
                fd,
            );
            let address = PyString::new(py, lender.address());
            let memory = memory.into_pyobject(py)?.into_any();
            (address, PyBytes::new(py, &token), memory)
        }
        None => {
            let memory = ("host", py.None(), 0).into_pyobject(py)?.into_any();
            (PyString::new(py, ""), PyBytes::new(py, b""), memory)
        }
    };
    let fields = (
        FORMAT,
        system::boot_id()?,
        system::pid(),
        address,
        token,
        writable,
        layout,
        memory,
    );
    Ok(fields.into_pyobject(py)?)
}

/// The `n` items of `state` if it is a sequence of that many.
fn items<'py>(state: &Bound<'py, PyAny>, n: usize) -> Option<Vec<Bound<'py, PyAny>>> {
    let items: Vec<_> = match state.cast::<PyTuple>() {
        Ok(tuple) => tuple.iter().collect(),
        Err(_) => state
            .try_iter()
            .ok()?
            .take(n + 1)
            .collect::<PyResult<_>>()
            .ok()?,
    };
    (items.len() == n).then_some(items)
}

/// An exact `int` that fits an `i64`.
fn int(value: &Bound<'_, PyAny>) -> Option<i64> {
    value
        .is_exact_instance_of::<PyInt>()
        .then(|| value.extract().ok())
        .flatten()
}

/// An exact `int` that fits a `u64`.
fn unsigned(value: &Bound<'_, PyAny>) -> Option<u64> {
    value
        .is_exact_instance_of::<PyInt>()
        .then(|| value.extract().ok())
        .flatten()
}

/// A handle's layout, checked.
struct Checked {
    offset: i64,
    shape: Vec<i64>,
    strides: Vec<i64>,
    element: Element,
}

fn checked_layout(layout: &Bound<'_, PyTuple>) -> Result<Checked> {
    let Some([offset, shape, strides, typestr, name]) =
        items(layout.as_any(), 5).and_then(|items| <[_; 5]>::try_from(items).ok())
    else {
        return Err(malformed("its layout is not a 5-tuple"));
    };
    let ints = |tuple: &Bound<'_, PyAny>| -> Option<Vec<i64>> {
        let tuple = tuple.cast::<PyTuple>().ok()?;
        tuple.iter().map(|n| int(&n)).collect()
    };
    let checked = (|| {
        let (offset, shape, strides) = (int(&offset)?, ints(&shape)?, ints(&strides)?);
        if strides.len() != shape.len() || shape.iter().any(|&n| n < 0) {
            return None;
        }
        if !typestr.is_exact_instance_of::<PyString>() || !name.is_exact_instance_of::<PyString>() {
            return None;
        }
        let name = name.cast::<PyString>().ok()?.to_str().ok()?;
        let typestr = typestr.cast::<PyString>().ok()?.to_str().ok()?;
        let dtype = DType::from_name(name)?;
        // The typestr may be in either byte order (memory in the other order is shared as it
        // is).
        let native = dtype.typestr(false);
        let either_order = typestr == native
            || (typestr.len() == native.len()
                && matches!(typestr.as_bytes()[0], b'<' | b'>')
                && typestr[1..] == native[1..]);
        if !either_order {
            return None;
        }
        let element = spelled(dtype, typestr)?;
        Some(Checked {
            offset,
            shape,
            strides,
            element,
        })
    })();
    match checked {
        Some(checked) => Ok(checked),
        None => Err(malformed(format!("a malformed layout {}", layout.repr()?))),
    }
}

/// Unpickle a handle: check its state, then open what it names in this process (the segment,
/// mapped and locked, its token released), as a view of its elements.
pub fn open<'py>(state: &Bound<'py, PyAny>) -> Result<Parts<'py>> {
    let py = state.py();
    let Some([version, host, pid, address, token, writable, layout, memory]) =
        items(state, 8).and_then(|items| <[_; 8]>::try_from(items).ok())
    else {
        return Err(malformed("its state is not an 8-tuple"));
    };
    if version.ne(FORMAT)? {
        return Err(malformed(format!(
            "format {}, this dlpack reads format {FORMAT}",
            version.repr()?
        )));
    }
    let well_typed = host.is_exact_instance_of::<PyString>()
        && pid.is_exact_instance_of::<PyInt>()
        && address.is_exact_instance_of::<PyString>()
        && token.is_exact_instance_of::<PyBytes>()
        && writable.is_exact_instance_of::<PyBool>()
        && layout.is_exact_instance_of::<PyTuple>()
        && memory.is_exact_instance_of::<PyTuple>();
    let (Ok(layout), Ok(memory)) = (layout.cast::<PyTuple>(), memory.cast::<PyTuple>()) else {
        return Err(malformed("a field of the wrong type"));
    };
    if !well_typed || memory.is_empty() {
        return Err(malformed("a field of the wrong type"));
    }
    let host = host.cast::<PyString>().map_err(PyErr::from)?.to_str()?;
    let here = system::boot_id()?;
    if host != here {
        return Err(Error::buffer(format!(
            "this handle was made on another machine (boot id {host}, this one's is {here}): \
             shared memory can't cross machines; send the array itself instead (a DLPackObject \
             pickles its data), e.g. through Dask distributed"
        )));
    }
    let layout_tuple = layout.clone();
    let layout = checked_layout(layout)?;
    let kind = memory.get_item(0)?;
    if !kind.eq("host")? {
        return Err(malformed(format!("memory of kind {}", kind.repr()?)));
    }
    let writable = writable.is_truthy()?;
    let itemsize = layout.element.dtype.itemsize();
    let view_layout = Layout::from_byte_strides(&layout.shape, Some(&layout.strides), itemsize)
        .map_err(|_| malformed("a layout that addresses more than 2**63 bytes"))?;
    if memory.len() == 3 && memory.get_item(1)?.is_none() {
        if view_layout.numel() != 0 {
            return Err(malformed("elements without memory"));
        }
        let view = empty_view(py, layout.element, view_layout, !writable)?;
        return Ok(Parts {
            view,
            writable,
            layout: layout_tuple,
            memory: memory.clone(),
        });
    }
    let Some([_, key, size, generation, lent_fd]) =
        items(memory.as_any(), 5).and_then(|items| <[_; 5]>::try_from(items).ok())
    else {
        return Err(malformed("host memory that is not a 5-tuple"));
    };
    let segment = (|| {
        let key = key.cast::<PyTuple>().ok()?;
        let [dev, ino] = <[_; 2]>::try_from(items(key.as_any(), 2)?).ok()?;
        let id = FileId {
            dev: unsigned(&dev)?,
            ino: unsigned(&ino)?,
        };
        let (size, generation) = (unsigned(&size)?, unsigned(&generation)?);
        let lent_fd = i32::try_from(int(&lent_fd)?).ok()?;
        let pid = i32::try_from(int(&pid)?).ok()?;
        let token = token.cast::<PyBytes>().ok()?.as_bytes();
        (size > TRAILER && lent_fd >= 0 && token.len() == TOKEN_BYTES)
            .then_some((id, size, generation, lent_fd, pid, token))
    })();
    let Some((id, size, generation, lent_fd, pid, token)) = segment else {
        return Err(malformed("a malformed segment"));
    };
    if writable && lender::lent_writable(token) != Some(true) {
        return Err(malformed(
            "it asks for writable memory, but the memory was lent read-only",
        ));
    }
    within(&layout, &view_layout, size - TRAILER)?;
    let address = address.cast::<PyString>().map_err(PyErr::from)?.to_str()?;
    let named = Named {
        pid,
        address,
        token,
        writable,
        id,
        size,
        generation,
        lent_fd,
    };
    let mapped = match open_mapped(&named)? {
        Some(mapped) => mapped,
        None => py.detach(|| open_lent(&named))?,
    };
    let view = segment_view(
        py,
        mapped,
        layout.offset,
        layout.element,
        view_layout,
        !writable,
    )?;
    // The descriptor's number is the producer's, not this process's to pass on.
    let memory = memory.get_slice(0, 4);
    Ok(Parts {
        view,
        writable,
        layout: layout_tuple,
        memory,
    })
}

/// A value error unless the layout's elements lie in the `size` bytes of its memory.
fn within(layout: &Checked, view_layout: &Layout, size: u64) -> Result<()> {
    let itemsize = layout.element.dtype.itemsize();
    let (low, high) = view_layout.byte_extent(itemsize)?;
    let (low, high) = (
        layout.offset.saturating_add(low),
        layout.offset.saturating_add(high),
    );
    if low != high && (low < 0 || high as u64 > size) {
        return Err(Error::value(format!(
            "the handle's layout reaches bytes [{low}, {high}) of its {size}-byte memory (a \
             forged or corrupted handle)"
        )));
    }
    Ok(())
}
