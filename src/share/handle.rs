//! `SharedHandle`, the handle `dlpack.share` returns: a view of the memory (which keeps it
//! alive in this process, and says its layout and segment) and whether receivers may write.
//! Pickling it pins its segment for the receiver (`state::write`); where it arrives,
//! unpickling opens the segment (`_share_rebuild`, one call), and `asdlpack` takes the view.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use super::limits::explained;
use super::state;
use crate::error::Result;
use crate::object::{register_stand_in, tensor_of};
use dlpack_core::abi::device_type;

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
}

impl SharedHandle {
    /// The handle holding `view` (a `DLPackObject` of a segment's memory, or of no elements).
    pub fn new(view: Bound<'_, PyAny>, writable: bool) -> Result<Bound<'_, SharedHandle>> {
        let py = view.py();
        let handle = SharedHandle {
            view: view.unbind(),
            writable,
        };
        Ok(Bound::new(py, handle)?)
    }
}

/// The view a handle stands for, as `asdlpack` returns it.
fn view_of<'py>(handle: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    let handle = handle.cast::<SharedHandle>().ok()?;
    Some(handle.get().view.bind(handle.py()).clone())
}

/// The reconstructor handles pickle to, as the module holds it.
static REBUILD: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Add the class and its reconstructor to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SharedHandle>()?;
    register_stand_in(&m.py().get_type::<SharedHandle>(), view_of);
    let rebuild = wrap_pyfunction!(_share_rebuild, m)?;
    m.add_function(rebuild.clone())?;
    let _ = REBUILD.set(m.py(), rebuild.into_any().unbind());
    Ok(())
}

/// Unpickle a handle: check its state, then open what it names in this process.
#[pyfunction]
fn _share_rebuild<'py>(state: &Bound<'py, PyAny>) -> Result<Bound<'py, SharedHandle>> {
    let (view, writable) = state::open(state)?;
    SharedHandle::new(view, writable)
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

    /// The memory the handle names (for tests): `("host", (device, inode), size, generation)`
    /// of its segment, or `("host", None, 0)` for no elements.
    #[getter]
    fn _memory<'py>(&self, py: Python<'py>) -> Result<Bound<'py, PyTuple>> {
        let view = self.view.bind(py);
        let mapped = tensor_of(view).and_then(state::mapped_of);
        let memory = match mapped.map(|mapped| mapped.segment()) {
            Some(segment) => {
                let id = segment.id();
                let fields = (
                    "host",
                    (id.dev, id.ino),
                    segment.size(),
                    segment.generation(),
                );
                fields.into_pyobject(py)?
            }
            None => ("host", py.None(), 0).into_pyobject(py)?,
        };
        Ok(memory)
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
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> Result<(Py<PyAny>, (Bound<'py, PyBytes>,))> {
        let py = slf.py();
        let rebuild = REBUILD
            .get(py)
            .expect("registered with the class")
            .clone_ref(py);
        let handle = slf.get();
        let state = state::write(handle.view.bind(py), handle.writable)
            .map_err(|err| explained(err, "pickle this handle"))?;
        Ok((rebuild, (state,)))
    }
}
