//! A type whose instances stand for a `DLPackObject` they hold (a shared-memory handle stands
//! for its view of the memory): `asdlpack` returns that object as it is, without asking the
//! instance for a capsule. The module defining the type registers it, so this one names none.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// The `DLPackObject` an instance of the registered type holds (`None`: not one after all).
pub type ViewOf = for<'py> fn(&Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>>;

static STAND_IN: PyOnceLock<(Py<PyType>, ViewOf)> = PyOnceLock::new();

/// Register `ty`, whose instances hold the `DLPackObject` `view_of` gives (one type: a second
/// registration is ignored).
pub fn register_stand_in(ty: &Bound<'_, PyType>, view_of: ViewOf) {
    let _ = STAND_IN.set(ty.py(), (ty.clone().unbind(), view_of));
}

/// The `DLPackObject` `obj` stands for, if it is an instance of the registered type.
pub fn view_of<'py>(obj: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    let (ty, view_of) = STAND_IN.get(obj.py())?;
    if !obj.get_type().is(ty.bind(obj.py())) {
        return None;
    }
    view_of(obj)
}
