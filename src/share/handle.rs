//! `SharedHandle`, the handle `dlpack.share` returns: a view of the memory (which keeps it
//! alive in this process), whether receivers may write, and its layout and memory as its
//! pickled state spells them (`state`). Pickling it pins its segment for the receiver; where it
//! arrives, unpickling opens the segment (`_share_rebuild`, one call).

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};

use super::state;
use super::views::Parts;
use crate::error::Result;
use crate::ffi::device_type;

/// A handle to memory shared with other processes: pickle it (``Queue.put``,
/// ``Connection.send``, ``pickle.dumps``) to send it, and pass it to ``asdlpack`` (or any
/// ``from_dlpack``) where it arrives to use the memory without a copy.
///
/// Made by :func:`dlpack.share`; in the process that made it, it keeps the memory alive.
#[pyclass(module = "dlpack.sharing", frozen)]
pub struct SharedHandle {
    /// The memory as this process sees it (a `DLPackObject`); it keeps the memory alive.
    view: Py<PyAny>,
    writable: bool,
    /// `(offset, shape, byte strides, typestr, dtype name)`.
    layout: Py<PyTuple>,
    /// `("host", (device, inode), size, generation)`, or `("host", None, 0)` for no elements.
    memory: Py<PyTuple>,
}

impl SharedHandle {
    pub fn new(parts: Parts<'_>) -> Result<Bound<'_, SharedHandle>> {
        let Parts {
            view,
            writable,
            layout,
            memory,
        } = parts;
        let py = view.py();
        let handle = SharedHandle {
            view: view.unbind(),
            writable,
            layout: layout.unbind(),
            memory: memory.unbind(),
        };
        Ok(Bound::new(py, handle)?)
    }
}

/// The reconstructor handles pickle to, as the module holds it.
static REBUILD: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Add the class and its reconstructor to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SharedHandle>()?;
    let rebuild = wrap_pyfunction!(_share_rebuild, m)?;
    m.add_function(rebuild.clone())?;
    let _ = REBUILD.set(m.py(), rebuild.into_any().unbind());
    Ok(())
}

/// Unpickle a handle: check its state, then open what it names in this process.
#[pyfunction]
fn _share_rebuild<'py>(state: &Bound<'py, PyAny>) -> Result<Bound<'py, SharedHandle>> {
    SharedHandle::new(state::open(state)?)
}

#[pymethods]
impl SharedHandle {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        Err(PyTypeError::new_err(
            "SharedHandle objects are made by dlpack.share()",
        ))
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.view.bind(py).getattr("shape")
    }

    #[getter]
    fn dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.view.bind(py).getattr("dtype")
    }

    #[getter]
    fn device<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.view.bind(py).getattr("device")
    }

    /// Whether receivers may write (``share(obj, writable=True)``).
    #[getter(writable)]
    fn py_writable(&self) -> bool {
        self.writable
    }

    /// The memory the handle names, as its state spells it (for tests).
    #[getter]
    fn _memory<'py>(&self, py: Python<'py>) -> Bound<'py, PyTuple> {
        self.memory.bind(py).clone()
    }

    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<Bound<'py, PyAny>>,
        dl_device: Option<Bound<'py, PyAny>>,
        copy: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let kwargs = PyDict::new(py);
        for (name, value) in [
            ("stream", stream),
            ("max_version", max_version),
            ("dl_device", dl_device),
            ("copy", copy),
        ] {
            if let Some(value) = value {
                kwargs.set_item(name, value)?;
            }
        }
        self.view
            .bind(py)
            .call_method(pyo3::intern!(py, "__dlpack__"), (), Some(&kwargs))
    }

    fn __dlpack_device__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.view
            .bind(py)
            .call_method0(pyo3::intern!(py, "__dlpack_device__"))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let (device_type, device_id): (i32, i32) = self.device(py)?.extract()?;
        let device = match device_type {
            device_type::CPU => "cpu".to_owned(),
            device_type::CUDA => "cuda".to_owned(),
            other => format!("device{other}"),
        };
        Ok(format!(
            "SharedHandle(shape={}, dtype={}, device={device}:{device_id}, writable={})",
            self.shape(py)?.repr()?,
            self.dtype(py)?.str()?,
            if self.writable { "True" } else { "False" }
        ))
    }

    /// Pickle: the state names the segment (pinned for the receiver in this process's lender).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> Result<(Py<PyAny>, (Bound<'py, PyTuple>,))> {
        let py = slf.py();
        let rebuild = REBUILD
            .get(py)
            .expect("registered with the class")
            .clone_ref(py);
        let handle = slf.get();
        let state = state::write(
            handle.view.bind(py),
            handle.writable,
            handle.layout.bind(py),
        )?;
        Ok((rebuild, (state,)))
    }
}
